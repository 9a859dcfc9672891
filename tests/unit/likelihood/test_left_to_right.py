"""JustGRPO's exact left-to-right log-probs (likelihood/left_to_right.py): why each position needs its own
input. That they equal the sampler's own log-probs is tested with the objective, in
tests/unit/rl/test_justgrpo.py."""

import pytest
import torch

from diffusion_rl.likelihood.left_to_right import left_to_right_logps
from diffusion_rl.models.policy import encode_prompts, logits_fn


def test_no_single_forward_gives_every_positions_conditional(tiny_bundle):
    """Why one input per position: in the bidirectional model the logits at ``t`` change when a later
    token is revealed, so ``[prompt | x | MASK]`` read at every position is not the left-to-right policy."""
    b = tiny_bundle
    ids, pmask = encode_prompts(b.tokenizer, ["1203="])
    comp = torch.tensor([[5, 6, 7, 8]])
    lp = left_to_right_logps(logits_fn(b.net.eval()), ids, pmask, comp, torch.ones_like(comp, dtype=torch.bool),
                             b.mask_token_id)  # (1, 4)
    one = logits_fn(b.net)(torch.cat([ids, comp.masked_fill(torch.tensor([[False, True, True, True]]), b.mask_token_id)],
                                     1), None)  # position 1 masked, position 0 revealed: x_1's exact input
    exact_1 = one[0, ids.shape[1] + 1].log_softmax(-1)[6]
    teacher = logits_fn(b.net)(torch.cat([ids, comp.masked_fill(torch.tensor([[False, True, False, False]]),
                                                                b.mask_token_id)], 1), None)  # later tokens shown
    assert exact_1.item() == pytest.approx(lp[0, 1].item(), abs=1e-6)
    assert abs(teacher[0, ids.shape[1] + 1].log_softmax(-1)[6].item() - lp[0, 1].item()) > 1e-4


def reference(net, prompt, pmask, comp, score, mask_id, pinned):
    """Each scored position's conditional from its own input, written out: the prompt, the earlier tokens
    and the pinned ones visible, the position and every later unpinned one masked."""
    out = torch.zeros(comp.shape)
    P = prompt.shape[1]
    for b in range(comp.shape[0]):
        for t in range(comp.shape[1]):
            if not score[b, t]:
                continue
            hide = (torch.arange(comp.shape[1]) >= t) & ~pinned[b]
            ids = torch.cat([prompt[b], torch.where(hide, mask_id, comp[b])])[None]
            attn = torch.cat([pmask[b], torch.ones(comp.shape[1], dtype=pmask.dtype)])[None]
            out[b, t] = logits_fn(net)(ids, attn)[0, P + t].float().log_softmax(-1)[comp[b, t]]
    return out


def batch(tiny_bundle):
    g = torch.Generator().manual_seed(8)
    prompt, comp = torch.randint(3, 30, (2, 4), generator=g), torch.randint(3, 30, (2, 5), generator=g)
    pmask = torch.ones_like(prompt)
    pmask[1, :2] = 0
    pinned = torch.zeros_like(comp, dtype=torch.bool)
    pinned[0, 2] = True
    score = ~pinned
    score[1, 4] = False  # after an EOS: not scored
    return prompt, pmask, comp, score, pinned


@pytest.mark.parametrize("rows_per_forward", [0, 2])
def test_each_conditional_is_read_from_its_own_input(tiny_bundle, rows_per_forward):
    net, mask = tiny_bundle.net.eval(), tiny_bundle.mask_token_id
    prompt, pmask, comp, score, pinned = batch(tiny_bundle)
    with torch.no_grad():
        got = left_to_right_logps(logits_fn(net), prompt, pmask, comp, score, mask, pinned, rows_per_forward)
        want = reference(net, prompt, pmask, comp, score, mask, pinned)
    assert torch.allclose(got, want, atol=1e-5) and bool((got[score] < 0).all()) and bool((got[~score] == 0).all())


def test_chunks_under_checkpointing_give_the_gradient_of_one_pass(tiny_bundle):
    net, mask = tiny_bundle.net.eval(), tiny_bundle.mask_token_id
    prompt, pmask, comp, score, pinned = batch(tiny_bundle)
    params = [p for p in net.parameters() if p.requires_grad]
    grads = []
    for rows in (0, 2):
        out = left_to_right_logps(logits_fn(net), prompt, pmask, comp, score, mask, pinned, rows)
        grads.append(torch.autograd.grad(out.sum(), params))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))
    assert any(float(a.abs().max()) > 0 for a in grads[1])


def test_nothing_to_score_gives_zeros_on_the_graph(tiny_bundle):
    net, mask = tiny_bundle.net.eval(), tiny_bundle.mask_token_id
    prompt, pmask, comp, _, pinned = batch(tiny_bundle)
    out = left_to_right_logps(logits_fn(net), prompt, pmask, comp, torch.zeros_like(pinned), mask, pinned)
    assert out.shape == comp.shape and bool((out == 0).all()) and out.requires_grad
    params = [p for p in net.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out.sum(), params, allow_unused=True)
    assert all(g is None or bool((g == 0).all()) for g in grads)
