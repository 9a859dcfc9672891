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
