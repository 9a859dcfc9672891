"""d1's one-step estimator (likelihood/one_step.py) against its rule written out row by row: d1's
``forward_process`` masks every completion token and each prompt token with probability
``p_mask_prompt``, and the log-probs of the completion are read from one forward of that input. Ours
draws each row's uniforms from the row's own generator (d1 seeds one for the batch) and leaves the
padding and the task's pinned tokens unmasked."""

import pytest
import torch

from diffusion_rl.likelihood.base import LikelihoodConfig
from diffusion_rl.likelihood.one_step import OneStepEstimator
from diffusion_rl.models.policy import logits_fn


def reference(net, prompt, pmask, comp, seeds, p: float, mask_id: int, pinned) -> torch.Tensor:
    B, P = prompt.shape
    out = torch.zeros(comp.shape)
    for b in range(B):
        u = torch.rand(1, P, generator=torch.Generator().manual_seed(seeds[b]))[0]
        noisy_prompt = [mask_id if pmask[b, j] and u[j] < p else int(prompt[b, j]) for j in range(P)]
        noisy_comp = [int(comp[b, i]) if pinned is not None and pinned[b, i] else mask_id for i in range(comp.shape[1])]
        ids = torch.tensor([noisy_prompt + noisy_comp])
        attn = torch.cat([pmask[b], torch.ones(comp.shape[1], dtype=pmask.dtype)])[None]
        logp = logits_fn(net)(ids, attn)[0, P:].float().log_softmax(-1)  # (L, V)
        out[b] = logp.gather(-1, comp[b, :, None])[:, 0]
    return out


@pytest.mark.parametrize("p,pins", [(0.5, True), (0.5, False), (0.0, True)])
def test_one_step_log_probs_are_d1s_rule_written_out(tiny_bundle, p, pins):
    net, mask_id = tiny_bundle.net.eval(), tiny_bundle.mask_token_id
    g = torch.Generator().manual_seed(0)
    prompt, comp = torch.randint(3, 30, (3, 6), generator=g), torch.randint(3, 30, (3, 5), generator=g)
    pmask = torch.ones_like(prompt)
    pmask[1, :2] = 0  # a left-padded row: its padding is never masked
    pinned = torch.zeros_like(comp, dtype=torch.bool)
    pinned[0, [1, 3]] = True
    pinned = pinned if pins else None
    seeds = [11, 12, 13]
    est = OneStepEstimator(LikelihoodConfig(p_mask_prompt=p), mask_id)
    with torch.no_grad():
        got = est(logits_fn(net), prompt, pmask, comp, torch.ones_like(comp), seeds, pinned)
        want = reference(net, prompt, pmask, comp, seeds, p, mask_id, pinned)
        unmasked = reference(net, prompt, pmask, comp, seeds, 0.0, mask_id, pinned)
    assert got.shape == comp.shape and torch.allclose(got, want, atol=1e-5, rtol=0)
    if p > 0:  # the prompt masking acted: not a comparison of two unmasked forwards
        assert not torch.allclose(want, unmasked, atol=1e-4)
    if pins:  # a pinned token is shown: its neighbours' log-probs change
        assert not torch.allclose(want, reference(net, prompt, pmask, comp, seeds, p, mask_id, None), atol=1e-4)
