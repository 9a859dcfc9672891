"""A random bidirectional toy model and a batch for it, for the likelihood estimators' tests and the
objectives' parity with public code on random tensors: small enough to differentiate through exactly."""

import torch

V, MASK = 12, 11  # the random-tensor model's vocabulary; tokens 0..10, mask 11


class ContextModel(torch.nn.Module):
    """A random bidirectional "model" for the random-tensor parity: the logits at a position depend on
    its token, its position and the mean of every token's embedding, so masking any token changes them."""

    def __init__(self, T: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.tok = torch.nn.Parameter(torch.randn(V, V, generator=g))
        self.pos = torch.nn.Parameter(torch.randn(T, V, generator=g))
        self.ctx = torch.nn.Parameter(torch.randn(V, V, generator=g))

    def forward(self, ids, attn=None, position_ids=None):  # the project's forward signature
        return self.tok[ids] + self.pos[: ids.shape[1]] + self.ctx[ids].mean(1, keepdim=True)  # (B, T, V)


def random_batch(B=6, P=4, L=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, MASK, (B, P), generator=g)
    comp = torch.randint(0, MASK, (B, L), generator=g)
    cmask = torch.ones(B, L)
    cmask[1, 3:] = 0  # a row that ended early
    cmask[B - 2, 5:] = 0
    return prompt, torch.ones(B, P, dtype=torch.long), comp, cmask


def forward_spy(model):
    """``model`` as a forward that keeps a copy of every input it is given -> (forward, inputs seen)"""
    seen = []

    def fwd(ids, attn, position_ids=None):
        seen.append(ids.clone())
        return model(ids, attn)

    return fwd, seen


def unit_inputs(objective, rollout, net):
    """``(inner_iter, role) -> ids``: the input ids of every forward that ``objective.logp_units`` runs
    for ``role`` at that inner iteration (of 3), stacked; ``net`` scores them. Which masks the old policy
    and the policy are scored on, as the tests of ``share_masks_with_old`` compare them."""
    from diffusion_rl.models.policy import logits_fn
    from diffusion_rl.rl.objectives.base import StepContext

    fwd, seen = input_spy(logits_fn(net))

    def inputs(it, role):
        seen.clear()
        objective.logp_units(StepContext(rollout, it, 3, fwd, fwd, None), fwd, role)
        return torch.cat([ids for ids, _ in seen])

    return inputs


def input_spy(model):
    """``model`` as a forward that keeps every ``(ids, attention mask)`` it is given (the mask None
    where the caller passes none) -> (forward, inputs seen)"""
    seen = []

    def fwd(ids, attn, position_ids=None):
        seen.append((ids.clone(), None if attn is None else attn.clone()))
        return model(ids, attn)

    return fwd, seen
