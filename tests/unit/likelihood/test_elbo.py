"""The Monte Carlo ELBO estimator and its bounds (likelihood/elbo.py): the ELBO's and EUBO's weightings
hand-computed, K samples in one forward, the masks (at least one token, antithetic pairs, nothing
scored after EOS), config checks, and the sandwich EUBO >= log p >= ELBO where it holds (SPG's bounds,
enumerated on SPG's masks of a 2-token block)."""

import math

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import forward_logps
from diffusion_rl.likelihood.elbo import (
    ELBOConfig,
    ELBOEstimator,
    elbo_from_logps,
    eubo_from_logps,
    sample_seeds,
)
from diffusion_rl.models.policy import logits_fn
from tests.helpers.common import make_batch

MASK = 99


SEEDS = [11, 22, 33, 44, 55, 66, 77, 88]


def test_elbo_from_logps_weighting_hand_computed():
    logps = torch.tensor([[[-1.0, -2.0, -3.0]], [[-0.5, -1.5, -4.0]]])  # (K=2, B=1, L=3)
    masked = torch.tensor([[[True, False, True]], [[False, True, False]]])
    t = torch.tensor([[0.5], [0.25]])
    inv = elbo_from_logps(logps, masked, t, "inverse_t")
    assert inv.item() == pytest.approx(((-1 - 3) / 0.5 + (-1.5) / 0.25) / 2)  # (-8 - 6) / 2
    mean = elbo_from_logps(logps, masked, t, "mean")
    assert mean.item() == pytest.approx(((-1 - 3) / 2 + (-1.5) / 1) / 2)
    # unmasked entries may hold anything, even -inf, without leaking into the result
    logps2 = logps.clone()
    logps2[0, 0, 1] = -math.inf
    assert elbo_from_logps(logps2, masked, t, "inverse_t").item() == pytest.approx(inv.item())


def test_eubo_from_logps_hand_computed():
    logps = torch.tensor([[[-1.0, -2.0, -3.0]], [[-0.5, -1.5, -4.0]]])
    masked = torch.tensor([[[True, False, False]], [[True, True, False]]])
    t = torch.tensor([[0.5], [0.25]])
    b = 1.5
    tok0 = math.log((math.exp(-1.0 * b) / 0.5 + math.exp(-0.5 * b) / 0.25) / 2)
    tok1 = math.log((0 + math.exp(-1.5 * b) / 0.25) / 2)  # masked in one sample of two
    expected = (tok0 + tok1) / 2 / b  # token 2 never masked: left out
    assert eubo_from_logps(logps, masked, t, b).item() == pytest.approx(expected, rel=1e-6)


def test_k_samples_in_one_forward_equal_k_single_sample_calls(tiny_bundle):
    prompt, pmask, comp, cmask = make_batch(tiny_bundle)
    net = tiny_bundle.net.eval()
    calls = []

    def fwd(ids, attn):
        calls.append(ids.shape[0])
        return logits_fn(net)(ids, attn)

    K = 3
    for kw in ({}, {"p_mask_prompt": 0.3, "weighting": "mean"}, {"schedule": "block_random", "block_length": 4}):
        est_k = ELBOEstimator(ELBOConfig(num_samples=K, **kw), tiny_bundle.mask_token_id)
        est_1 = ELBOEstimator(ELBOConfig(num_samples=1, **kw), tiny_bundle.mask_token_id)
        calls.clear()
        with torch.no_grad():
            batched = est_k(fwd, prompt, pmask, comp, cmask, SEEDS)
            assert calls == [K * len(SEEDS)]  # one forward over K stacked copies
            single = torch.stack([est_1(fwd, prompt, pmask, comp, cmask, sample_seeds(SEEDS, k)) for k in range(K)])
        assert torch.allclose(batched, single.mean(0), rtol=1e-5, atol=1e-5), kw
        # and the samples really differ (a test that K copies of one mask would fail)
        assert not torch.allclose(single[0], single[1])


def test_at_least_one_token_masked_even_with_tiny_t(tiny_bundle):
    prompt, pmask, comp, cmask = make_batch(tiny_bundle)
    for schedule in ("uniform", "block_random"):
        est = ELBOEstimator(ELBOConfig(num_samples=4, t_min=1e-6, t_max=1e-6, schedule=schedule, block_length=4),
                            tiny_bundle.mask_token_id)
        _, masked, t, scored = est.draw(SEEDS, pmask, cmask)
        counts = masked.sum(-1)  # (K, B)
        assert bool((counts >= 1).all()), schedule
        assert not bool((masked & ~scored).any())
        if schedule == "uniform":
            assert bool((counts == 1).all())
            assert torch.allclose(t, torch.full_like(t, 1e-6))


def test_antithetic_masks_are_complements(tiny_bundle):
    prompt, pmask, comp, cmask = make_batch(tiny_bundle)
    est = ELBOEstimator(ELBOConfig(num_samples=4, antithetic=True, t_min=0.2, t_max=0.8, p_mask_prompt=0.2),
                        tiny_bundle.mask_token_id)
    hit, masked, t, scored = est.draw(SEEDS, pmask, cmask)
    for m in range(2):
        a, b = masked[2 * m], masked[2 * m + 1]
        assert not bool((a & b).any())
        assert torch.equal(a | b, scored)
        assert torch.allclose(t[2 * m] + t[2 * m + 1], torch.ones_like(t[0]))
        assert torch.equal(hit[2 * m], hit[2 * m + 1])
    assert not torch.equal(masked[0], masked[2])  # the pairs are independent draws
    # extreme t: the at-least-one rule keeps both halves non-empty and still complementary
    est = ELBOEstimator(ELBOConfig(num_samples=2, antithetic=True, t_min=1e-4, t_max=1 - 1e-4),
                        tiny_bundle.mask_token_id)
    for seeds in ([1, 2, 3, 4, 5, 6, 7, 8], [9] * 8):
        _, masked, _, scored = est.draw(seeds, pmask, cmask)
        assert bool((masked.sum(-1) >= 1).all())
        assert torch.equal(masked[0] ^ masked[1], scored)


def test_elbo_config_validation():
    with pytest.raises(ConfigError, match="likelihood.num_samples"):
        ELBOConfig(num_samples=3, antithetic=True, t_max=0.999).validate()
    with pytest.raises(ConfigError, match="likelihood.t_max"):
        ELBOConfig(num_samples=2, antithetic=True).validate()  # t_min + t_max != 1
    with pytest.raises(ConfigError, match="likelihood.weighting"):
        ELBOConfig(weighting="sum").validate()
    with pytest.raises(ConfigError, match="likelihood.t_min"):
        ELBOConfig(t_min=0.0).validate()


def test_tokens_after_eos_are_masked_and_not_scored(tiny_bundle):
    prompt, pmask, comp, cmask = make_batch(tiny_bundle)
    net = tiny_bundle.net.eval()
    seen = []

    def fwd(ids, attn):
        seen.append(ids)
        return logits_fn(net)(ids, attn)

    est = ELBOEstimator(ELBOConfig(num_samples=2), tiny_bundle.mask_token_id)
    comp2 = comp.clone()
    comp2[1, 5:] = comp[1, 5:].flip(-1) + 1  # change only tokens after row 1's EOS
    with torch.no_grad():
        a = est(fwd, prompt, pmask, comp, cmask, SEEDS)
        b = est(fwd, prompt, pmask, comp2, cmask, SEEDS)
    assert torch.equal(a, b)
    P = prompt.shape[1]
    assert bool((seen[0].view(2, 8, -1)[:, 1, P + 5:] == tiny_bundle.mask_token_id).all())
    est_all = ELBOEstimator(ELBOConfig(num_samples=2, score_after_eos=True), tiny_bundle.mask_token_id)
    with torch.no_grad():
        a = est_all(fwd, prompt, pmask, comp, cmask, SEEDS)
        b = est_all(fwd, prompt, pmask, comp2, cmask, SEEDS)
    assert a[1] != b[1] and torch.equal(a[0], b[0])


# ---------------------------------------------------------------- the sandwich


def exact_bounds(forward, prompt, comp, beta, mask_id=MASK):
    """EUBO, log p / L and ELBO of one 2-token completion, and the conditionals ``a`` (each token's
    log p while the other is masked) and ``b`` (once it is shown). log p is the likelihood of generating
    the completion one token at a time in a uniformly random order, a masked diffusion model's
    likelihood. The bounds are the project's functions on SPG's masks of a 2-token block, enumerated
    with their probabilities -- one token masked (either place, 1/4 each) or both (1/2) -- as 4 equally
    likely samples, so their Monte Carlo means are exact."""
    P, K = prompt.shape[1], 4
    masked = torch.tensor([[True, False], [False, True], [True, True], [True, True]])  # (K, L)
    t = masked.sum(-1) / 2.0  # (K,)
    ids = torch.cat([prompt.repeat(K, 1), torch.where(masked, mask_id, comp)], 1)  # (K, P + 2)
    with torch.no_grad():
        lp = forward_logps(forward, ids, None, comp.repeat(K, 1), P)  # (K, 2)
    a, b = lp[2], torch.stack([lp[0, 0], lp[1, 1]])
    log_p = torch.logsumexp(torch.stack([a[0] + b[1], a[1] + b[0]]), 0) - math.log(2)  # the two orders
    eubo = eubo_from_logps(lp[:, None], masked[:, None], t[:, None], beta)[0]
    elbo = elbo_from_logps(lp[:, None], masked[:, None], t[:, None], "mean")[0]
    return eubo.item(), log_p.item() / 2, elbo.item(), a.exp(), b.exp()


def context_model(a, b, V=4):
    """A hand-built model of a 2-token completion (tokens 1, 1 after a 1-token prompt): token i has
    probability a_i while the other is masked and b_i once it is shown."""
    def forward(ids, attn):
        out = torch.full((ids.shape[0], ids.shape[1], V), -30.0)
        for i in range(2):
            shown = ids[:, 1 + (1 - i)] != MASK  # (K,)
            p = torch.where(shown, torch.tensor(b[i]), torch.tensor(a[i]))
            out[:, 1 + i, 1] = p.log()
            out[:, 1 + i, 2] = (1 - p).log()
        return out
    return forward


HELPS, HURTS, NEUTRAL = ((0.2, 0.3), (0.9, 0.6)), ((0.6, 0.5), (0.3, 0.2)), ((0.7, 0.4), (0.7, 0.4))


@pytest.mark.parametrize("a,b", [HELPS, HURTS, NEUTRAL], ids=["context-helps", "context-hurts", "no-context"])
@pytest.mark.parametrize("beta", [1.0, 1.5, 3.0])
def test_eubo_above_log_p_above_elbo_on_a_hand_built_model(a, b, beta):
    """Where showing a token moves the other's probability the same way for both tokens, the sandwich
    holds exactly for beta >= 1 (each token's EUBO is the order-beta power mean of its probabilities),
    with equality when the context is irrelevant."""
    eubo, log_p, elbo, *_ = exact_bounds(context_model(a, b), torch.tensor([[3]]), torch.tensor([[1, 1]]), beta)
    if (a, b) == NEUTRAL:
        assert eubo == pytest.approx(log_p, abs=1e-5) and elbo == pytest.approx(log_p, abs=1e-5)
    else:
        assert eubo > log_p > elbo, (eubo, log_p, elbo)


def test_eubo_is_no_bound_where_context_helps_one_token_and_hurts_the_other():
    """The per-token EUBO is a mean-field bound: at beta = 1 it lies below log p / L exactly when
    (a_0 - b_0)(a_1 - b_1) < 0. The ELBO stays below."""
    eubo, log_p, elbo, *_ = exact_bounds(context_model((0.2, 0.9), (0.8, 0.3)), torch.tensor([[3]]),
                                         torch.tensor([[1, 1]]), 1.0)
    assert eubo < log_p and elbo < log_p


def test_sandwich_on_the_tiny_model(tiny_bundle):
    """On a real model: ELBO <= log p / L always (Jensen), and at beta = 1 EUBO >= log p / L exactly
    when (a_0 - b_0)(a_1 - b_1) >= 0 (EUBO - log p / L = log[(a_0 + b_0)(a_1 + b_1) / (2 (a_0 b_1 + a_1 b_0))] / 2);
    for beta > 1 the EUBO only grows."""
    fwd = logits_fn(tiny_bundle.net.eval())
    g = torch.Generator().manual_seed(0)
    lo = max(tiny_bundle.mask_token_id, tiny_bundle.eos_token_id, tiny_bundle.pad_token_id) + 1
    V, held = tiny_bundle.tokenizer.vocab_size, 0
    for _ in range(8):
        prompt = torch.randint(lo, V, (1, 4), generator=g)
        comp = torch.randint(lo, V, (1, 2), generator=g)
        eubo, log_p, elbo, a, b = exact_bounds(fwd, prompt, comp, 1.0, tiny_bundle.mask_token_id)
        eubo15 = exact_bounds(fwd, prompt, comp, 1.5, tiny_bundle.mask_token_id)[0]
        assert elbo <= log_p + 1e-6 and eubo15 >= eubo - 1e-6
        same_way = ((a[0] - b[0]) * (a[1] - b[1])).item() >= 0
        assert (eubo >= log_p - 1e-6) == same_way
        held += same_way
    assert 0 < held  # the bound was checked where it holds
