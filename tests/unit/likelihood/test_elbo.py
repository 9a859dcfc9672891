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


def spying(net):
    """``net``'s forward and the list of every input it was called with."""
    seen = []

    def fwd(ids, attn):
        seen.append(ids)
        return logits_fn(net)(ids, attn)

    return fwd, seen


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
    fwd, seen = spying(net)

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


# ---- the masks against a literal transcription of the module docstring's rules ---------------------
def literal_draw(cfg, seeds, pmask, cmask):
    """Per row and sample, in plain Python, from the same uniform numbers: ``u[0]`` sets ``t``, ``u[1]``
    the block, ``u[2:2 + P]`` the prompt hits, ``u[2 + P:]`` the completion mask. -> lists of rows"""
    from diffusion_rl.likelihood.base import rand_rows

    B, P = pmask.shape
    L = cmask.shape[1]
    n = cfg.num_samples // 2 if cfg.antithetic else cfg.num_samples
    hits, masks, ts = [], [], []
    for k in range(n):
        u_all = rand_rows(sample_seeds(seeds, k), 2 + P + L)[0]
        for b in range(B):
            u = u_all[b].tolist()
            t = cfg.t_min + (cfg.t_max - cfg.t_min) * u[0]
            up, uc = u[2:2 + P], u[2 + P:]
            scored = [i for i in range(L) if cmask[b, i]]
            hits.append([up[j] < cfg.p_mask_prompt and bool(pmask[b, j]) for j in range(P)])
            if cfg.schedule == "block_random":
                bl = cfg.block_length
                n_blocks = max(scored) // bl + 1
                blk = min(math.floor(u[1] * n_blocks), n_blocks - 1)
                inside = [i for i in scored if i // bl == blk]
                m = {i for i in inside if uc[i] < t} or {min(inside, key=lambda i: uc[i])}
                m |= {i for i in scored if i // bl > blk}
                masks.append([i in m for i in range(L)])
                ts.append(len(m) / len(scored))
                continue
            m = {i for i in scored if uc[i] < t} or {min(scored, key=lambda i: uc[i])}
            if not cfg.antithetic:
                masks.append([i in m for i in range(L)])
                ts.append(t)
                continue
            comp = set(scored) - m
            if not comp and len(scored) >= 2:  # the largest u moves into the complement
                comp = {max(scored, key=lambda i: uc[i])}
                m -= comp
            if not comp:  # one scored token: both mask it
                comp = set(m)
            masks.append(([i in m for i in range(L)], [i in comp for i in range(L)]))
            ts.append((t, 1 - t))
    return hits, masks, ts


def as_kbl(rows, K, B):
    return torch.tensor(rows).view(K, B, -1)


@pytest.mark.parametrize("kw", [dict(schedule="block_random", block_length=3, num_samples=3, p_mask_prompt=0.4),
                                dict(schedule="block_random", block_length=4, num_samples=2, t_min=0.05, t_max=0.3),
                                dict(num_samples=3, t_min=0.2, t_max=0.9, p_mask_prompt=0.5)])
def test_draw_equals_the_literal_rules(tiny_bundle, kw):
    _, pmask, _, cmask = make_batch(tiny_bundle)
    cfg = ELBOConfig(**kw)
    hit, masked, t, scored = ELBOEstimator(cfg, MASK).draw(SEEDS, pmask, cmask)
    hits, masks, ts = literal_draw(cfg, SEEDS, pmask, cmask)
    K, B = cfg.num_samples, len(SEEDS)
    assert torch.equal(hit, as_kbl(hits, K, B)) and torch.equal(masked, as_kbl(masks, K, B))
    assert torch.allclose(t, torch.tensor(ts).view(K, B))
    assert hit.any() or cfg.p_mask_prompt == 0  # the prompt rule was exercised


def test_antithetic_pairs_equal_the_literal_rules(tiny_bundle):
    _, pmask, _, cmask = make_batch(tiny_bundle)
    cmask = cmask.clone()
    cmask[2, 1:] = 0  # one scored token: both halves of its pairs mask it
    for t_min in (0.3, 1e-4):  # 1e-4 pushes u >= t: the first half is forced, the complement moves a token
        cfg = ELBOConfig(num_samples=4, antithetic=True, t_min=t_min, t_max=1 - t_min)
        _, masked, t, _ = ELBOEstimator(cfg, MASK).draw(SEEDS, pmask, cmask)
        _, masks, ts = literal_draw(cfg, SEEDS, pmask, cmask)
        B = len(SEEDS)
        expected = torch.tensor([[masks[k * B + b][h] for b in range(B)] for k in range(2) for h in range(2)])
        assert torch.equal(masked, expected), t_min
        expected_t = torch.tensor([[ts[k * B + b][h] for b in range(B)] for k in range(2) for h in range(2)])
        assert torch.allclose(t, expected_t)
        assert masked[:, 2, 0].all()


def test_eubo_rows_are_their_own_hand_computed():
    logps = torch.tensor([[[-1.0, -2.0], [-0.5, -3.0]]])  # (K=1, B=2, L=2)
    masked = torch.tensor([[[True, True], [True, False]]])
    t = torch.tensor([[0.5, 0.25]])
    b = 2.0
    row0 = (math.log(math.exp(-1.0 * b) / 0.5) + math.log(math.exp(-2.0 * b) / 0.5)) / 2 / b
    row1 = math.log(math.exp(-0.5 * b) / 0.25) / 1 / b  # one token hit: divided by 1
    assert torch.allclose(eubo_from_logps(logps, masked, t, b), torch.tensor([row0, row1]))
    default = eubo_from_logps(logps, masked, t)  # beta 1.5, SPG's
    assert default[1].item() == pytest.approx(math.log(math.exp(-0.75) / 0.25) / 1.5)


def test_sample_seeds_differ_per_row_and_per_sample_and_keep_sample_zero():
    assert sample_seeds(SEEDS, 0) == SEEDS
    derived = [sample_seeds(SEEDS, k) for k in range(1, 4)]
    for seeds in derived:
        assert len(set(seeds)) == len(SEEDS) and not set(seeds) & set(SEEDS)
    assert len({tuple(s) for s in derived}) == 3


def test_the_estimator_passes_pinned_tokens_as_context_and_scores_the_masked_ones(tiny_bundle):
    prompt, pmask, comp, cmask = make_batch(tiny_bundle)
    net = tiny_bundle.net.eval()
    fwd, seen = spying(net)

    pinned = torch.zeros_like(comp, dtype=torch.bool)
    pinned[:, 0] = True
    est = ELBOEstimator(ELBOConfig(num_samples=2, t_min=0.999, t_max=1.0), tiny_bundle.mask_token_id)
    with torch.no_grad():
        s = est.sample(fwd, prompt, pmask, comp, cmask, SEEDS, pinned)
        direct = est(fwd, prompt, pmask, comp, cmask, SEEDS, pinned)
    P = prompt.shape[1]
    ids = seen[0].view(2, len(SEEDS), -1)
    assert torch.equal(ids[:, :, P], comp[:, 0].expand(2, -1))  # the pinned token is shown
    assert (ids[:, :, P + 1:][s.masked[:, :, 1:]] == tiny_bundle.mask_token_id).all()
    assert torch.allclose(direct, elbo_from_logps(s.token_logps, s.masked, s.t, "mean"))
    # the scored log-probs are the model's at the masked positions of each copy
    attn = torch.cat([pmask, torch.ones_like(cmask)], 1).repeat(2, 1)  # row 0's prompt padding stays out
    with torch.no_grad():
        lp = forward_logps(logits_fn(net), seen[0], attn, comp.repeat(2, 1), P).view(2, len(SEEDS), -1)
    assert torch.allclose(s.token_logps[s.masked], lp[s.masked], atol=1e-5)


def test_elbo_config_edges():
    for ok in (dict(num_samples=1), dict(block_length=1), dict(t_min=1.0, t_max=1.0), dict(t_min=1e-9),
               dict(num_samples=2, antithetic=True, t_min=0.001, t_max=0.999), dict(schedule="block_random")):
        ELBOConfig(**ok).validate()
    for bad, key in ((dict(num_samples=0), "num_samples"), (dict(block_length=0), "block_length"),
                     (dict(t_min=1.01, t_max=1.01), "t_min"), (dict(t_max=1.01), "t_max"),
                     (dict(t_min=0.6, t_max=0.5), "t_max"), (dict(schedule="blocks"), "schedule"),
                     (dict(num_samples=2, antithetic=True, schedule="block_random", t_min=0.5), "schedule")):
        with pytest.raises(ConfigError, match=rf"^likelihood\.{key}\b"):
            ELBOConfig(**bad).validate()


def test_sampler_units_of_a_one_token_completion():
    logp = torch.tensor([[-0.5], [-2.0]])  # (B, L=1)
    est = ELBOEstimator(ELBOConfig(weighting="inverse_t", t_min=0.001), MASK)
    assert torch.allclose(est.sampler_units(logp, torch.ones(2, 1)), torch.tensor([-0.5, -2.0]))


def test_inverse_t_is_the_default_weighting_and_the_estimator_carries_t_to_it(tiny_bundle):
    logps = torch.tensor([[[-1.0, -2.0]]])
    masked = torch.tensor([[[True, True]]])
    t = torch.tensor([[0.5]])
    assert elbo_from_logps(logps, masked, t).item() == pytest.approx(-6.0)  # (-1 - 2) / 0.5
    prompt, pmask, comp, cmask = make_batch(tiny_bundle)
    net = tiny_bundle.net.eval()
    est = ELBOEstimator(ELBOConfig(num_samples=2, weighting="inverse_t", t_min=0.2), tiny_bundle.mask_token_id)
    with torch.no_grad():
        s = est.sample(logits_fn(net), prompt, pmask, comp, cmask, SEEDS)
        direct = est(logits_fn(net), prompt, pmask, comp, cmask, SEEDS)
    assert torch.allclose(direct, elbo_from_logps(s.token_logps, s.masked, s.t, "inverse_t"))
    assert torch.allclose(est.reduce(s), direct)


def test_block_random_edges_one_scored_token_and_blocks_of_one(tiny_bundle):
    _, pmask, _, cmask = make_batch(tiny_bundle)
    cmask = cmask.clone()
    cmask[4, 1:] = 0  # one scored token, at position 0: one block, t = 1
    for bl in (1, 3):
        cfg = ELBOConfig(schedule="block_random", block_length=bl, num_samples=3)
        _, masked, t, _ = ELBOEstimator(cfg, MASK).draw(SEEDS, pmask, cmask)
        _, masks, ts = literal_draw(cfg, SEEDS, pmask, cmask)
        assert torch.equal(masked, as_kbl(masks, 3, len(SEEDS))) and torch.allclose(t, torch.tensor(ts).view(3, -1))
        assert torch.equal(t[:, 4], torch.ones(3))


def test_antithetic_pairs_of_two_scored_tokens_move_one_into_the_complement(tiny_bundle):
    _, pmask, _, cmask = make_batch(tiny_bundle)
    cmask = cmask.clone()
    cmask[5, 2:] = 0  # exactly two scored tokens
    from diffusion_rl.likelihood.base import rand_rows

    cfg = ELBOConfig(num_samples=2, antithetic=True, t_min=1e-4, t_max=1 - 1e-4)
    P, both = pmask.shape[1], 0
    for s in range(30):  # row 5's seed varies: some draws mask both tokens, and one must move
        seeds = SEEDS[:5] + [1000 + s] + SEEDS[6:]
        _, masked, _, _ = ELBOEstimator(cfg, MASK).draw(seeds, pmask, cmask)
        _, masks, _ = literal_draw(cfg, seeds, pmask, cmask)
        expected = torch.tensor([[masks[b][h] for b in range(len(SEEDS))] for h in range(2)])
        assert torch.equal(masked, expected)
        assert masked[0, 5].sum() == 1 and masked[1, 5].sum() == 1  # one each: exact complements
        u = rand_rows([1000 + s], 2 + P + cmask.shape[1])[0, 0]
        t = cfg.t_min + (cfg.t_max - cfg.t_min) * u[0]
        both += bool((u[2 + P:2 + P + 2] < t).all())
    assert both > 0


def test_monte_carlo_config_errors_are_anchored_on_their_key():
    with pytest.raises(ConfigError, match=r"^likelihood\.weighting\b"):
        ELBOConfig(weighting="sum").validate()
