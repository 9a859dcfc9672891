"""The staircase ELBO of block diffusion models (likelihood/staircase.py, docs/methods.md §3): its
attention rule, one pass equal to one forward per block, no clean later block seen, one block equal to
the ELBO, models it refuses. How objectives use it is tested in tests/unit/sampling/test_block.py."""

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.elbo import ELBOConfig, ELBOEstimator
from diffusion_rl.likelihood.staircase import (
    StaircaseConfig,
    StaircaseEstimator,
    staircase_logits,
    staircase_mask,
)
from diffusion_rl.models.policy import logits_fn
from tests.helpers.blocks import BS, block_data, staircase_of


def test_staircase_mask_follows_the_spec_rule():
    P, L, bs = 4, 6, 2
    m = staircase_mask(P, L, bs)
    T = P + L
    for a in range(T + L):
        for b in range(T + L):
            na, nb_ = a >= T, b >= T
            ba = (a - L if na else a) // bs
            bb = (b - L if nb_ else b) // bs
            want = (not na and not nb_ and bb <= ba) or (na and not nb_ and bb < ba) or (na and nb_ and bb == ba)
            assert bool(m[a, b]) == want, (a, b)
    assert staircase_mask(P, L, bs) is m  # built once per shape


@pytest.mark.parametrize("weighting,p_prompt", [("inverse_t", 0.0), ("mean", 0.3)])
def test_one_pass_equals_one_forward_per_block(block_bundle, weighting, p_prompt):
    ids, mask, comp, cmask = block_data(block_bundle)
    fwd = logits_fn(block_bundle.net)
    seeds = [11, 12, 13]
    kw = dict(num_samples=3, weighting=weighting, p_mask_prompt=p_prompt)
    one = staircase_of(block_bundle, **kw)
    naive = staircase_of(block_bundle, one_pass=False, **kw)
    s1 = one.sample(fwd, ids, mask, comp, cmask, seeds)
    s2 = naive.sample(fwd, ids, mask, comp, cmask, seeds)
    assert torch.equal(s1.masked, s2.masked) and torch.equal(s1.t, s2.t)
    assert torch.allclose(s1.token_logps[s1.masked], s2.token_logps[s2.masked], atol=1e-5)
    e1, e2 = one(fwd, ids, mask, comp, cmask, seeds), naive(fwd, ids, mask, comp, cmask, seeds)
    assert e1.shape == (3,) and torch.isfinite(e1).all()
    assert torch.allclose(e1, e2, rtol=1e-5, atol=1e-4)
    assert not torch.allclose(e1, one(fwd, ids, mask, comp, cmask, [1, 2, 3]), atol=1e-3)  # masks matter
    # every block with a scored token masks at least one; blocks after the EOS contribute nothing
    per_block = s1.masked.view(3, 3, -1, BS).any(-1)  # (K, B, nb)
    assert per_block[:, 0].all() and per_block[:, 1, :3].all() and not per_block[:, 1, 3].any()
    assert not per_block[:, 2, 1:].any()


def test_noisy_block_logits_do_not_see_later_clean_blocks(block_bundle):
    ids, mask, comp, _ = block_data(block_bundle)
    fwd = logits_fn(block_bundle.net)
    m = block_bundle.mask_token_id
    noisy = comp.clone()
    noisy[:, ::2] = m
    base = staircase_logits(fwd, ids, mask, comp, noisy, BS)  # (B, L, V)
    g = torch.Generator().manual_seed(9)
    for b in range(4):
        s = b * BS
        changed = comp.clone()
        changed[:, s:] = torch.randint(5, 90, changed[:, s:].shape, generator=g)  # clean blocks >= b
        out = staircase_logits(fwd, ids, mask, changed, noisy, BS)
        assert torch.allclose(out[:, s:s + BS], base[:, s:s + BS], atol=1e-6), b
        if b > 0:  # the clean prefix does reach block b: the test can fail
            earlier = comp.clone()
            earlier[:, s - BS:s] = torch.randint(5, 90, (comp.shape[0], BS), generator=g)
            out = staircase_logits(fwd, ids, mask, earlier, noisy, BS)
            assert not torch.allclose(out[:, s:s + BS], base[:, s:s + BS], atol=1e-3), b
        other = noisy.clone()  # noisy tokens of the other blocks are invisible too
        keep = torch.zeros(comp.shape[1], dtype=torch.bool)
        keep[s:s + BS] = True
        other[:, ~keep] = torch.randint(5, 90, other[:, ~keep].shape, generator=g)
        out = staircase_logits(fwd, ids, mask, comp, other, BS)
        assert torch.allclose(out[:, s:s + BS], base[:, s:s + BS], atol=1e-6), b


def test_one_block_completion_equals_the_elbo(block_bundle):
    """With a single completion block both estimators see the same masks and the same attention."""
    ids, mask, comp, cmask = block_data(block_bundle, L=BS, eos_at=(None, 2, None))
    fwd = logits_fn(block_bundle.net)
    seeds = [4, 5, 6]
    kw = dict(num_samples=2, p_mask_prompt=0.2)
    elbo = ELBOEstimator(ELBOConfig(**kw), block_bundle.mask_token_id)(fwd, ids, mask, comp, cmask, seeds)
    stair = staircase_of(block_bundle, **kw)(fwd, ids, mask, comp, cmask, seeds)
    assert torch.allclose(elbo, stair, rtol=1e-5, atol=1e-4)


def test_bind_rejects_unsuitable_models(tiny_bundle, block_bundle):
    est = StaircaseEstimator(StaircaseConfig(), tiny_bundle.mask_token_id)
    with pytest.raises(ConfigError, match="block_size"):
        est.bind(tiny_bundle)
    block_bundle.custom_attention_mask = False
    with pytest.raises(ConfigError, match="model.custom_attention_mask"):
        est.bind(block_bundle)
    with pytest.raises(RuntimeError, match="bind"):
        est(None, None, None, torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4), [0])


def test_a_block_of_one_token_is_a_block_model():
    from types import SimpleNamespace

    est = StaircaseEstimator(StaircaseConfig(), 99)
    est.bind(SimpleNamespace(block_size=1, custom_attention_mask=True))
    assert est.block_size == 1


def test_scoring_after_eos_masks_and_scores_the_padding_too(block_bundle):
    ids, mask, comp, cmask = block_data(block_bundle)
    seeds = [3, 4, 5]
    for after in (False, True):
        est = staircase_of(block_bundle, num_samples=4, score_after_eos=after, t_min=0.9, t_max=1.0)
        _, masked, _, scored = est.draw(seeds, mask, cmask)
        assert torch.equal(scored, torch.ones_like(scored) if after else cmask.bool())
        assert bool((masked & ~cmask.bool()).any()) is after  # tokens after EOS are drawn only when scored
    logp = -torch.arange(1.0, 17.0).expand(3, -1)
    short = staircase_of(block_bundle, weighting="mean").sampler_units(logp, cmask)
    full = staircase_of(block_bundle, weighting="mean", score_after_eos=True).sampler_units(logp, cmask)
    assert torch.equal(short[0], full[0]) and not torch.equal(short[2], full[2])  # row 2 ends at token 3
