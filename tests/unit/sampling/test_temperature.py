"""The sampler's temperature against an independent statement of the distribution it must draw from.

A committed token at temperature tau is a draw from ``softmax(logits / tau)``. The tests below check the
empirical frequencies of many draws against that distribution (and that they reject the neighbouring
``softmax(logits * tau)``, so they have the power to see a flipped operator), and the draw itself against
d1's Gumbel form, ``argmax(exp(logits) / (-log u) ** tau)`` (``generate.py: add_gumbel_noise``), on the
same uniform numbers ``u``.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from diffusion_rl.sampling import SamplerConfig, generate
from diffusion_rl.sampling.block import block_generate
from diffusion_rl.sampling.sampler import gumbel_argmax

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.5], dtype=torch.float64)  # a skewed distribution, 5 tokens
DRAWS = 40_000


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic of ``counts`` against ``probs`` (its 99.99% point at 4 degrees of freedom is 23.5)."""
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


CRITICAL = 23.5  # chi-square, 4 degrees of freedom, 1 - 1e-4


def frequencies(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens.flatten(), minlength=len(LOGITS)).to(torch.float64)


@pytest.mark.parametrize("tau", [0.9, 0.5, 1.7])
def test_gumbel_argmax_draws_from_softmax_of_logits_over_tau(tau):
    torch.manual_seed(0)
    tokens = gumbel_argmax(LOGITS.expand(1, DRAWS, -1), tau, None)  # (1, DRAWS): one draw per position
    counts = frequencies(tokens)
    assert chi_square(counts, torch.softmax(LOGITS / tau, -1)) < CRITICAL
    assert chi_square(counts, torch.softmax(LOGITS * tau, -1)) > 10 * CRITICAL  # the test sees tau flipped
    assert chi_square(counts, torch.softmax(LOGITS, -1)) > 10 * CRITICAL  # and tau ignored


@pytest.mark.parametrize("tau", [0.9, 0.3, 2.0])
def test_gumbel_argmax_equals_d1s_gumbel_form_on_the_same_uniforms(tau):
    logits = torch.randn(3, 64, 11, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    torch.manual_seed(7)
    ours = gumbel_argmax(logits, tau, None)
    torch.manual_seed(7)  # the same uniforms: the global generator draws (B, T, V) float64 once
    u = torch.rand(logits.shape, dtype=torch.float64)
    d1 = (logits.exp() / (-torch.log(u)) ** tau).argmax(-1)  # add_gumbel_noise, then argmax
    assert torch.equal(ours, d1)


def test_temperature_zero_is_the_argmax_and_draws_nothing():
    logits = torch.randn(2, 9, 7, generator=torch.Generator().manual_seed(2))
    state = torch.get_rng_state()
    assert torch.equal(gumbel_argmax(logits, 0.0, None), logits.argmax(-1))
    assert torch.equal(torch.get_rng_state(), state)


class FixedLogits:
    """A 'model' whose logits are ``LOGITS`` at every position: what the sampler commits is then a
    draw from the sampler alone."""

    def __call__(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_) -> torch.Tensor:
        return LOGITS.to(torch.float32).expand(*ids.shape, -1).clone()


@pytest.mark.parametrize("gen_length,steps", [(1, 1), (4, 1)])
def test_the_sampler_commits_draws_from_softmax_of_logits_over_tau(gen_length, steps):
    """End to end through ``generate`` at the rollouts' default temperature: every committed token of a
    one-step decode is an independent draw from ``softmax(logits / 0.9)``."""
    tau, rows = 0.9, DRAWS // gen_length
    mask_id = len(LOGITS)  # outside the vocabulary the model scores: never drawn
    prompt = torch.zeros(rows, 2, dtype=torch.long)
    cfg = SamplerConfig(gen_length=gen_length, block_length=gen_length, steps=steps, temperature=tau)
    torch.manual_seed(3)
    out = generate(FixedLogits(), prompt, None, cfg, mask_id).completion
    counts = frequencies(out)
    assert counts.sum() == rows * gen_length
    assert chi_square(counts, torch.softmax(LOGITS / tau, -1)) < CRITICAL
    assert chi_square(counts, torch.softmax(LOGITS * tau, -1)) > 10 * CRITICAL


class FixedLogitsNet(torch.nn.Module):
    """The block sampler's view of :class:`FixedLogits`: ``net(input_ids=, keep=slice)`` -> ``.logits``."""

    def forward(self, input_ids, attention_mask=None, keep=slice(None), **_):
        return SimpleNamespace(logits=FixedLogits()(input_ids[:, keep]), past_key_values=None)


def test_the_block_sampler_commits_draws_from_softmax_of_logits_over_tau():
    tau, block, rows = 0.9, 4, DRAWS // 8
    prompt = torch.zeros(rows, block, dtype=torch.long)
    cfg = SamplerConfig(gen_length=2 * block, block_length=2 * block, steps=2, temperature=tau)  # a step a block
    torch.manual_seed(4)
    out = block_generate(FixedLogitsNet(), prompt, None, cfg, block, len(LOGITS), use_cache=False).completion
    counts = frequencies(out)
    assert counts.sum() == rows * 2 * block
    assert chi_square(counts, torch.softmax(LOGITS / tau, -1)) < CRITICAL
    assert chi_square(counts, torch.softmax(LOGITS * tau, -1)) > 10 * CRITICAL


def test_the_critical_value_is_the_chi_square_quantile():
    """CRITICAL above is the 1 - 1e-4 point of chi-square with 4 degrees of freedom: its survival function
    there, exp(-x/2) (1 + x/2), is 1e-4 within rounding."""
    x = CRITICAL
    assert math.isclose(math.exp(-x / 2) * (1 + x / 2), 1e-4, rel_tol=0.05)
