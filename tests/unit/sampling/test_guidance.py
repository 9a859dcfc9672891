"""Classifier-free guidance against LLaDA's ``generate.py``: the unconditional branch is the sequence
with its prompt replaced by the mask token, and the guided logits are
``uncond + (cfg_scale + 1) * (cond - uncond)``; ``cfg_scale = 0`` runs the conditional forward alone."""

import pytest
import torch

from diffusion_rl.sampling import SamplerConfig, generate
from diffusion_rl.sampling.sampler import full_step, guided_logits

V, MASK, P = 7, 6, 3  # vocabulary, mask token, prompt length


class Forward:
    """Logits that depend on every position of the row (its mean embedding) and on the attention mask,
    and a log of the batch sizes it was called with."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.emb = torch.randn(V, V, generator=g, dtype=torch.float64)
        self.batches = []

    def __call__(self, ids, attn=None):
        self.batches.append(ids.shape[0])
        h = self.emb[ids]  # (B, T, V)
        h = h + 2 * h.mean(1, keepdim=True)
        return h if attn is None else h * (1 + attn[..., None].to(h))


def llada_guided(forward, x, attn, scale):
    """LLaDA generate.py's guidance, written out: two forwards, not one batch."""
    un = x.clone()
    un[:, :P] = MASK
    cond, uncond = forward(x, attn), forward(un, attn)
    return uncond + (scale + 1) * (cond - uncond)


X = torch.tensor([[1, 2, 3, MASK, 4, MASK], [0, 5, 2, 1, MASK, MASK], [4, 4, 0, MASK, MASK, 3]])
ATTN = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])


@pytest.mark.parametrize("scale", [0.5, 2.0])
@pytest.mark.parametrize("attn", [None, ATTN])
def test_guided_logits_are_llada_s_formula(scale, attn):
    expected = llada_guided(Forward(), X, attn, scale)
    assert not torch.allclose(expected, Forward()(X, attn))  # guidance changes the logits here
    f = Forward()
    ours = guided_logits(f, X, None, attn=attn, scale=scale, prompt_len=P, mask_id=MASK)
    torch.testing.assert_close(ours, expected)
    assert f.batches == [2 * X.shape[0]]  # both branches in one batch
    part = guided_logits(Forward(), X, slice(P, X.shape[1]), attn=attn, scale=scale, prompt_len=P, mask_id=MASK)
    torch.testing.assert_close(part, expected[:, P:])
    step = full_step(Forward(), attn, SamplerConfig(cfg_scale=scale), P, MASK)
    torch.testing.assert_close(step(X, slice(P, X.shape[1])), expected[:, P:])


@pytest.mark.parametrize("call", ["guided_logits", "full_step"])
def test_no_guidance_runs_the_conditional_forward_alone(call):
    f = Forward()
    if call == "guided_logits":
        out = guided_logits(f, X, slice(2, 5), attn=ATTN, scale=0.0, prompt_len=P, mask_id=MASK)
    else:
        out = full_step(f, ATTN, SamplerConfig(cfg_scale=0.0), P, MASK)(X, slice(2, 5))
    assert torch.equal(out, Forward()(X, ATTN)[:, 2:5])
    assert f.batches == [X.shape[0]]  # no unconditional branch


def test_generate_with_guidance_commits_the_argmax_of_the_guided_logits():
    """One token per step at temperature 0: each step commits, among the masked positions, the one whose
    guided distribution is most confident, with its guided argmax (the literal loop below)."""
    prompt = X[:, :P]
    cfg = SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=0.0, cfg_scale=1.5)
    out = generate(Forward(), prompt, None, cfg, MASK)
    B = prompt.shape[0]
    x = torch.cat([prompt, torch.full((B, 3), MASK)], 1)
    for _ in range(3):
        probs = torch.softmax(llada_guided(Forward(), x, None, 1.5)[:, P:], -1)  # (B, 3, V)
        conf, tok = probs.max(-1)
        conf = conf.masked_fill(x[:, P:] != MASK, -1.0)
        at = conf.argmax(-1)
        x[torch.arange(B), P + at] = tok[torch.arange(B), at]
    assert torch.equal(out.completion, x[:, P:])
    plain = generate(Forward(), prompt, None, SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=0.0), MASK)
    assert not torch.equal(plain.completion, out.completion)  # the guidance changed what was committed
