"""The uniform-state ELBO (likelihood/uniform_elbo.py) against brute force, and its Monte Carlo estimator.

Brute force: on a 3-token vocabulary and sequences of 2, a data distribution is enumerated and the
denoiser set to its exact posterior of each token given the other noisy token; the reverse process is
then the exact time reversal of the forward one, so the bound is tight: ``ELBO(x) = log p_data(x)`` for
every sequence, the expectation over noisy sequences enumerated and the integral over ``alpha`` taken
by Gauss-Legendre quadrature (``alpha = 1 - s^4``, which smooths the log singularity at ``alpha = 1``).
A wrong sign, weight or ratio in the bound breaks the equality."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from diffusion_rl.likelihood.uniform_elbo import (
    UniformELBOConfig,
    UniformELBOEstimator,
    phi_exp,
    udlm_terms,
)
from diffusion_rl.models.policy import logits_fn
from tests.helpers.gemma import sharp_gemma

V, L = 3, 2
SEQS = list(itertools.product(range(V), repeat=L))


def _q(z: int, x: int, a: float) -> float:
    return a * (z == x) + (1 - a) / V


def _posterior_of_others(p0: torch.Tensor, z: tuple[int, ...], i: int, a: float) -> torch.Tensor:
    """p(x_i | z_{-i}) under p0 (V,)"""
    w = torch.zeros(V, dtype=torch.float64)
    for n, x in enumerate(SEQS):
        w[x[i]] += p0[n] * math.prod(_q(z[j], x[j], a) for j in range(L) if j != i)
    return w / w.sum()


def exact_elbos(p0: torch.Tensor, points: int = 40) -> torch.Tensor:
    """ELBO(x) of every sequence x (V^L,) with the exact posterior as the denoiser, by enumeration and quadrature."""
    s, w = np.polynomial.legendre.leggauss(points)
    s, w = (s + 1) / 2, w / 2
    total = torch.zeros(len(SEQS), dtype=torch.float64)
    noisy = torch.tensor([z[i] for z in SEQS for i in range(L)])  # (Z * L,) over (noisy sequence, position)
    for si, wi in zip(s, w):
        a = 1 - si ** 4
        logp = torch.stack([_posterior_of_others(p0, z, i, a).log() for z in SEQS for i in range(L)])  # (Z*L, V)
        for n, x0 in enumerate(SEQS):
            clean = torch.tensor([x0[i] for _ in SEQS for i in range(L)])
            prob = torch.tensor([math.prod(_q(z[j], x0[j], a) for j in range(L)) for z in SEQS for _ in range(L)],
                                dtype=torch.float64)
            b = udlm_terms(logp, noisy, clean, torch.full((len(clean),), a, dtype=torch.float64))
            total[n] -= wi * 4 * si ** 3 * float((prob * b).sum()) / (V * a)
    return total


def test_the_bound_is_tight_for_the_exact_posterior_by_brute_force():
    p0 = torch.rand(V ** L, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p0 = p0 / p0.sum()
    assert torch.allclose(exact_elbos(p0), p0.log(), atol=1e-8, rtol=0)


def test_its_terms_are_never_negative_and_vanish_for_a_certain_clean_prediction():
    """``B >= 0``; 0 where the model's ratios are the forward process's (the clean token predicted with
    certainty); ``phi`` by its series where ``u`` is small agrees with the direct form."""
    g = torch.Generator().manual_seed(1)
    logp = torch.randn(200, 7, generator=g, dtype=torch.float64).log_softmax(-1)
    noisy, clean = torch.randint(0, 7, (200,), generator=g), torch.randint(0, 7, (200,), generator=g)
    a = torch.rand(200, generator=g, dtype=torch.float64) * 0.98 + 0.01
    assert (udlm_terms(logp, noisy, clean, a) >= 0).all()
    certain = torch.nn.functional.one_hot(clean, 7).double().clamp_min(1e-300).log()
    assert udlm_terms(certain, noisy, clean, a).abs().max() < 1e-9
    u = torch.tensor([-30.0, -1e-4, 0.0, 1e-5, 2.0], dtype=torch.float64)
    assert torch.allclose(phi_exp(u), torch.expm1(u) - u, rtol=1e-6, atol=1e-18)


@pytest.fixture(scope="module")
def gemma():
    return sharp_gemma(canvas=8, scale=10.0)


def test_the_estimator_shares_its_draws_across_calls_and_scores_only_the_scored_tokens(gemma):
    """Same seeds, same value (the old and new policy share draws); other seeds, another; per-position terms
    sum to the sequence ELBO, are 0 off the completion mask and at pinned tokens, and the bound is < 0."""
    g = torch.Generator().manual_seed(0)
    prompt, comp = torch.randint(4, 100, (3, 4), generator=g), torch.randint(4, 100, (3, 16), generator=g)
    pmask = torch.ones_like(prompt)
    cmask = torch.ones_like(comp)
    cmask[1, 10:] = 0  # row 1 ends at position 9
    pinned = torch.zeros_like(comp, dtype=torch.bool)
    pinned[2, [0, 5]] = True
    est = UniformELBOEstimator(UniformELBOConfig(num_samples=2), -1)
    fwd = logits_fn(gemma.net)
    with torch.no_grad():
        s = est.sample(fwd, prompt, pmask, comp, cmask, [1, 2, 3], pinned)
        again = est(fwd, prompt, pmask, comp, cmask, [1, 2, 3], pinned)
        other = est(fwd, prompt, pmask, comp, cmask, [4, 5, 6], pinned)
    elbo = est.reduce(s)
    assert torch.equal(elbo, again) and not torch.allclose(elbo, other) and (elbo < 0).all()
    assert (s.token_logps[:, 1, 10:] == 0).all() and (s.token_logps[:, 2, [0, 5]] == 0).all()
    est.per_token = True
    with torch.no_grad():
        terms = est(fwd, prompt, pmask, comp, cmask, [1, 2, 3], pinned)  # (B, L)
    assert torch.allclose(terms.sum(-1), elbo, atol=1e-4)


def test_the_estimator_is_unbiased_for_the_exact_integral_on_one_position():
    """One scored position, a model whose prediction does not depend on its input: the mean of many draws
    approaches the integral over alpha of the enumerated expectation over the noisy token."""
    Vs = 5
    logp = torch.randn(Vs, generator=torch.Generator().manual_seed(3), dtype=torch.float64).log_softmax(-1)
    x = 2
    s, w = np.polynomial.legendre.leggauss(60)
    s, w = (s + 1) / 2, w / 2
    exact = 0.0
    for si, wi in zip(s, w):
        a = 1 - si ** 4
        q = torch.full((Vs,), (1 - a) / Vs, dtype=torch.float64)
        q[x] += a
        b = udlm_terms(logp.expand(Vs, Vs), torch.arange(Vs), torch.full((Vs,), x), torch.full((Vs,), a, dtype=torch.float64))
        exact -= wi * 4 * si ** 3 * float((q * b).sum()) / (Vs * a)
    g = torch.Generator().manual_seed(4)
    n = 200_000
    a = torch.rand(n, generator=g, dtype=torch.float64) * (1 - 2e-3) + 1e-3
    z = torch.where(torch.rand(n, generator=g, dtype=torch.float64) < a, x, torch.randint(0, Vs, (n,), generator=g))
    draws = -udlm_terms(logp.expand(n, Vs), z, torch.full((n,), x), a) / (Vs * a) * (1 - 2e-3)
    assert float(draws.mean()) == pytest.approx(exact, abs=4 * float(draws.std()) / math.sqrt(n) + 2e-3 * abs(exact))


def test_phi_by_its_series_near_zero_is_the_exact_value():
    """``phi(e^u) = e^u - 1 - u`` against the exact series sum, at ``|u|`` under the 1e-3 where the code
    switches to its own series: a wrong coefficient of any order up to ``u^5`` shows at 3e-14 relative."""
    from fractions import Fraction

    def exact(u: float) -> float:
        x, term, total = Fraction(u), Fraction(u), Fraction(0)
        for n in range(2, 60):
            term = term * x / n
            total += term
        return float(total)

    us = [9.99e-4, -9.99e-4, 5e-4, -3e-4, 1e-5, 0.5, -2.0, 3.0]
    got = phi_exp(torch.tensor(us, dtype=torch.float64))
    want = torch.tensor([exact(u) for u in us], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=3e-14, atol=0)


def test_the_terms_are_computed_in_the_precision_of_the_log_probs():
    """alpha in float32 with float64 log-probs: the terms are the float64 ones (alpha converted first)."""
    g = torch.Generator().manual_seed(2)
    logp = torch.randn(50, 6, generator=g, dtype=torch.float64).log_softmax(-1)
    noisy, clean = torch.randint(0, 6, (50,), generator=g), torch.randint(0, 6, (50,), generator=g)
    a = torch.rand(50, generator=g) * 0.9 + 0.05
    want = udlm_terms(logp, noisy, clean, a.double())
    got = udlm_terms(logp, noisy, clean, a)
    assert got.dtype == torch.float64 and torch.allclose(got, want, rtol=1e-13, atol=0)


def reference_sample(fwd, prompt, pmask, comp, cmask, seeds, pinned, cfg: UniformELBOConfig, V: int, C: int):
    """The estimator's draws and terms written out row by row and canvas by canvas, from the module's
    rule: draw k of row b from a generator seeded ``sample_seeds(seeds, k)[b]``: alpha ~ U(alpha_min,
    alpha_max), then L uniforms (a scored position keeps its token where its uniform < alpha), then L
    random tokens; pinned tokens clean; each canvas scored after the prompt and the clean earlier
    canvases; a scored position's term ``- B / (V alpha)``, others 0."""
    from diffusion_rl.likelihood.elbo import sample_seeds

    K, (B, L) = cfg.num_samples, comp.shape
    scored = cmask.bool() & ~pinned
    terms = torch.zeros(K, B, L, dtype=torch.float64)
    alphas = torch.zeros(K, B)
    for k in range(K):
        for b, s in enumerate(sample_seeds(seeds, k)):
            g = torch.Generator().manual_seed(s)
            a = cfg.alpha_min + (cfg.alpha_max - cfg.alpha_min) * torch.rand((), generator=g)
            keep = torch.rand(L, generator=g) < a
            noisy = torch.where(keep & scored[b], comp[b], torch.randint(0, V, (L,), generator=g))
            noisy = torch.where(pinned[b], comp[b], noisy)
            alphas[k, b] = a
            for c in range(L // C):
                span = slice(c * C, (c + 1) * C)
                if not scored[b, span].any():
                    continue
                ctx = torch.cat([prompt[b], comp[b, :c * C]])[None]
                mask = torch.cat([pmask[b], torch.ones(c * C, dtype=pmask.dtype)])[None]
                logp = fwd.run(input_ids=ctx, attention_mask=mask, canvas=noisy[None, span]).logits[0].double()
                bi = udlm_terms(logp.log_softmax(-1), noisy[span], comp[b, span], a.double().expand(C))
                terms[k, b, span] = torch.where(scored[b, span], -bi / (V * a.double()), 0.0)
    return terms, scored.expand(K, B, L), 1 - alphas


@pytest.mark.parametrize("case", ["padded", "first_canvas_pinned", "no_pins"])
def test_the_estimator_is_its_rule_written_out_row_by_row(gemma, case):
    """Every draw's per-position terms, the scored positions and the noise rates against
    :func:`reference_sample`: a left-padded prompt (its padding must stay unseen), an EOS in canvas 1 of
    one row, pinned tokens; a batch whose first canvas is pinned whole (nothing to score there, the next
    canvas still scored); no pins at all."""
    C, V = int(gemma.net.canvas_length), int(gemma.net.vocab_size)
    g = torch.Generator().manual_seed(5)
    prompt, comp = torch.randint(4, 100, (3, 4), generator=g), torch.randint(4, 100, (3, 2 * C), generator=g)
    pmask, cmask = torch.ones_like(prompt), torch.ones_like(comp)
    pmask[0, :2] = 0  # row 0: a left-padded prompt
    cmask[1, C + 3:] = 0  # row 1 ends in the second canvas
    pinned = torch.zeros_like(comp, dtype=torch.bool)
    if case == "padded":
        pinned[2, [1, C + 2]] = True
    elif case == "first_canvas_pinned":
        pinned[:, :C] = True
    cfg = UniformELBOConfig(num_samples=2, alpha_min=0.2, alpha_max=0.7)
    est = UniformELBOEstimator(cfg, -1)
    fwd = logits_fn(gemma.net)
    with torch.no_grad():
        s = est.sample(fwd, prompt, pmask, comp, cmask, [7, 8, 9], None if case == "no_pins" else pinned)
        terms, masked, t = reference_sample(fwd, prompt, pmask, comp, cmask, [7, 8, 9], pinned, cfg, V, C)
    assert s.masked.shape == masked.shape and torch.equal(s.masked, masked)
    assert torch.allclose(s.t, t, atol=1e-7, rtol=0)
    assert torch.allclose(s.token_logps.double(), terms, rtol=1e-5, atol=1e-6)
    assert bool((terms[masked] < 0).any())  # not a comparison of zeros


def test_per_token_terms_come_from_the_config():
    per_token = UniformELBOEstimator(UniformELBOConfig(per_token=True), -1)
    assert per_token.per_token is True and UniformELBOEstimator(UniformELBOConfig(), -1).per_token is False


def test_it_binds_to_a_uniform_noise_model_only():
    from types import SimpleNamespace

    from diffusion_rl.core.errors import ConfigError

    est = UniformELBOEstimator(UniformELBOConfig(), -1)
    est.bind(SimpleNamespace(noise="uniform"))
    with pytest.raises(ConfigError, match="a masked model takes elbo"):
        est.bind(SimpleNamespace(noise="mask"))


@pytest.mark.parametrize("field,value,ok", [("num_samples", 1, True), ("num_samples", 0, False),
                                            ("alpha_min", 0.0, False), ("alpha_max", 1.0, False),
                                            ("alpha_max", 1.5, False), ("alpha_min", 0.5, True)])
def test_its_settings_are_checked_at_their_edges(field, value, ok):
    cfg = UniformELBOConfig(**{field: value}) if field != "alpha_min" or value != 0.5 else \
        UniformELBOConfig(alpha_min=0.5, alpha_max=0.5 + 1e-9)
    if ok:
        cfg.validate()
    else:
        from diffusion_rl.core.errors import ConfigError

        with pytest.raises(ConfigError):
            cfg.validate()
    if field == "alpha_min" and ok:  # alpha_min == alpha_max: an empty interval
        with pytest.raises(Exception, match="alpha_max"):
            UniformELBOConfig(alpha_min=0.5, alpha_max=0.5).validate()


def reference_denoising_loss(fwd, prompt, pmask, target, seed: int, pinned, self_conditioned: float, V: int, C: int):
    """The warm start's loss written out row by row, from its rule: one generator draws alpha (B, 1), L
    uniforms per row (a position keeps its clean token where its uniform < alpha), L random tokens per
    row, then one uniform per row (self-conditioned where < ``self_conditioned``); pinned positions stay
    clean; each canvas after the prompt and the clean earlier canvases; a self-conditioned row sees the
    first pass's soft prediction (no gradient), the others a zero signal; the loss is the mean
    cross-entropy over the free positions."""
    B, L = target.shape
    g = torch.Generator().manual_seed(seed)
    alpha = torch.rand(B, 1, generator=g)
    noisy = torch.where(torch.rand(B, L, generator=g) < alpha, target, torch.randint(0, V, (B, L), generator=g))
    noisy = torch.where(pinned, target, noisy)
    conditioned = torch.rand(B, generator=g) < self_conditioned
    losses = []
    for b in range(B):
        for c in range(math.ceil(L / C)):
            span = slice(c * C, (c + 1) * C)
            call = {"input_ids": torch.cat([prompt[b], target[b, :c * C]])[None], "canvas": noisy[None, b, span],
                    "attention_mask": torch.cat([pmask[b], torch.ones(min(c * C, L), dtype=pmask.dtype)])[None]}
            with torch.no_grad():
                soft = fwd.run(**call, soft_temperature=1.0).soft
            signal = soft if conditioned[b] else torch.zeros_like(soft)
            logp = fwd.run(**call, self_conditioning=signal).logits[0].log_softmax(-1)
            for i in range(span.start, min(span.stop, L)):
                if not pinned[b, i]:
                    losses.append(-logp[i - span.start, target[b, i]])
    return torch.stack(losses).mean() if losses else torch.zeros(())


@pytest.mark.parametrize("case", ["some_pinned", "one_free", "all_self_conditioned", "none_self_conditioned",
                                  "no_pins_default_share"])
def test_the_warm_start_loss_is_its_rule_written_out(gemma, case):
    """:func:`denoising_loss` against :func:`reference_denoising_loss`, value and gradient: a canvas and a
    part (the last canvas shorter than the others), a left-padded prompt, pinned positions; one free
    position in the whole batch (the mean is over what is free); every row self-conditioned, and none;
    no pinned positions and the default share of self-conditioned rows (one half)."""
    from diffusion_rl.likelihood.uniform_elbo import denoising_loss

    C, V = int(gemma.net.canvas_length), int(gemma.net.vocab_size)
    g = torch.Generator().manual_seed(6)
    prompt, target = torch.randint(4, 100, (3, 4), generator=g), torch.randint(4, 100, (3, C + 3), generator=g)
    pmask = torch.ones_like(prompt)
    pmask[1, 0] = 0
    pinned = torch.zeros_like(target, dtype=torch.bool)
    pinned[0, [0, C + 1]] = True
    if case == "one_free":
        pinned[:] = True
        pinned[2, C + 2] = False
    share = {"all_self_conditioned": 1.0, "none_self_conditioned": 0.0}.get(case, 0.5)
    fwd = logits_fn(gemma.net)
    params = [p for p in gemma.net.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(11)
    if case == "no_pins_default_share":
        got = denoising_loss(fwd, prompt, pmask, target, gen)
        pinned = torch.zeros_like(pinned)
    else:
        got = denoising_loss(fwd, prompt, pmask, target, gen, pinned, share)
    got_grad = torch.autograd.grad(got, params, allow_unused=True)
    want = reference_denoising_loss(fwd, prompt, pmask, target, 11, pinned, share, V, C)
    want_grad = torch.autograd.grad(want, params, allow_unused=True)
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-5)
    for a, b in zip(got_grad, want_grad):
        assert (a is None) == (b is None)
        if a is not None:
            scale = float(b.abs().max())
            assert float((a - b).abs().max()) <= 1e-4 * scale + 1e-7, (float((a - b).abs().max()), scale)
