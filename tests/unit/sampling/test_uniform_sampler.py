"""The EntropyBound sampler of a uniform-noise model (sampling/entropy_bound.py, uniform_sampler.py)
against transformers' own: its rules, its defaults, and its tokens at matched random streams.

Temperature 0 does not exist for this sampler in transformers (``t_max > t_min >= 0``, and re-noising
draws random tokens whatever the temperature), so equality is checked at matched random streams: a row
sampled with its generator seeded ``s`` against ``generate`` after ``torch.manual_seed(s)``, and the
batch drawn from the global generator against ``generate`` on the same batch."""

from __future__ import annotations

import pytest
import torch
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    DiffusionGemmaGenerationConfig,
    EntropyBoundSampler,
    EntropyBoundSamplerConfig,
    LinearTemperatureScheduleLogitsProcessor,
    StableAndConfidentStoppingCriteria,
)

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.sampling import RowNoise, SamplerConfig, sample
from diffusion_rl.sampling.entropy_bound import (
    EntropyBoundConfig,
    StableAndConfident,
    accept_mask,
    step_temperature,
    token_entropy,
)
from diffusion_rl.sampling.uniform_sampler import entropy_bound_generate
from diffusion_rl.sampling.uniform_trajectory import UniformTrajectory
from tests.helpers.gemma import hf_generate, sharp_gemma, up_to_eos

EB = EntropyBoundConfig(steps=6, entropy_bound=1.0, confidence_threshold=0.5)


@pytest.fixture(scope="module")
def gemma():
    return sharp_gemma()


def test_the_defaults_are_transformers_defaults_for_the_model():
    """sampler.uniform's defaults are transformers' global defaults for DiffusionGemma (the released
    generation_config.json quotes the same values: tests/fixtures/released/SOURCES.json)."""
    ref = DiffusionGemmaGenerationConfig._get_default_generation_params()
    eb = EntropyBoundConfig()
    assert (eb.steps, eb.entropy_bound, eb.t_max, eb.t_min, eb.stability_threshold, eb.confidence_threshold) == (
        ref["max_denoising_steps"], ref["sampler_config"].entropy_bound, ref["t_max"], ref["t_min"],
        ref["stability_threshold"], ref["confidence_threshold"])


def test_the_temperature_falls_linearly_and_equals_transformers_bit_for_bit():
    eb = EntropyBoundConfig(steps=48)
    ref = LinearTemperatureScheduleLogitsProcessor(t_min=0.4, t_max=0.8, max_denoising_steps=48)
    x = torch.randn(2, 3, 5)
    for n in (48, 30, 1):
        assert torch.equal(x / step_temperature(eb, n), ref(None, x, torch.tensor(n, dtype=torch.int32)))
    assert float(step_temperature(eb, 48)) == pytest.approx(0.8) and float(step_temperature(eb, 1)) > 0.4


def test_acceptance_keeps_low_entropy_positions_while_the_bound_holds():
    """Entropies 0.3, 0.05, 0.2, 0.9 with bound 0.3: sorted 0.05, 0.2, 0.3, 0.9 give cumulative-minus-largest
    0, 0.05, 0.25, 0.65, so the three lowest are accepted; the lowest is accepted whatever the bound."""
    ent = torch.tensor([[0.3, 0.05, 0.2, 0.9], [5.0, 4.0, 6.0, 7.0]])
    assert accept_mask(ent, 0.3).tolist() == [[True, True, True, False], [False, True, False, False]]
    logits = 3 * torch.randn(3, 16, 11)
    sampler = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=0.7), 16, 11, 4)
    denoised, current = torch.randint(0, 11, (3, 16)), torch.randint(0, 11, (3, 16))
    sampler.accept_canvas(current, denoised, logits, 1)
    assert torch.equal(accept_mask(token_entropy(logits), 0.7), sampler.accepted_token_mask)


def test_the_stopping_rule_is_transformers():
    """Stable for ``stability_threshold`` steps and confident: the same decision as transformers' rule on a
    sequence of argmax canvases that repeats."""
    eb = EntropyBoundConfig(stability_threshold=2, confidence_threshold=1.5)
    ours, ref = StableAndConfident(eb), StableAndConfidentStoppingCriteria(2, 1.5)
    g = torch.Generator().manual_seed(0)
    canvases = [torch.randint(0, 3, (4, 5), generator=g) for _ in range(2)]
    seen = []
    for step in range(6):
        argmax = canvases[min(step, 1)]
        logits = torch.randn(4, 5, 7, generator=g) * (1 + step)
        got = ours(argmax, token_entropy(logits))
        assert torch.equal(got, ref(argmax, logits))
        seen.append(bool(got.any()))
    assert not any(seen[:3]) and any(seen)  # never before two repeats


@pytest.mark.parametrize("seed", [0, 3])
def test_a_row_with_its_stream_gives_transformers_tokens(gemma, seed):
    """B = 1, three canvases of 8, early stops: the tokens equal ``generate``'s after ``torch.manual_seed``."""
    ids = torch.randint(4, 100, (1, 5), generator=torch.Generator().manual_seed(seed))
    cfg = SamplerConfig(gen_length=24, uniform=EB)
    ours = sample(gemma, ids, None, cfg, RowNoise([seed]))
    ref = hf_generate(gemma, ids, None, EB, 24, seed)
    eos = gemma.eos_token_id
    assert up_to_eos(ours.completion[0].tolist(), eos) == up_to_eos(ref[0].tolist(), eos)
    assert ours.steps < 3 * EB.steps  # some canvas stopped early


def test_the_batch_from_the_global_stream_gives_transformers_tokens(gemma):
    """B = 3 with left padding, no RowNoise: one draw over the batch per call, as ``generate`` draws."""
    ids = torch.randint(4, 100, (3, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :2], ids[0, :2] = 0, 0
    cfg = SamplerConfig(gen_length=24, uniform=EB)
    torch.manual_seed(5)
    ours = sample(gemma, ids, mask, cfg)
    ref = hf_generate(gemma, ids, mask, EB, 24, 5)
    for a, b in zip(ours.completion.tolist(), ref.tolist()):
        assert up_to_eos(a, gemma.eos_token_id) == up_to_eos(b, gemma.eos_token_id)


def test_the_cache_changes_no_token_and_a_row_depends_on_its_key_alone(gemma):
    """Encoding the context once per canvas (the cache) or at every step gives the same tokens, with a
    sliding window shorter than the context (its layers keep their window only); a batch with per-row
    noise equals its rows sampled alone."""
    net = gemma.net
    net.model.config.text_config.sliding_window = 9  # keep the last 8 context tokens on sliding layers
    try:
        ids = torch.randint(4, 100, (3, 6), generator=torch.Generator().manual_seed(2))
        cfg = SamplerConfig(gen_length=24, uniform=EB)
        cached = entropy_bound_generate(net, ids, None, cfg, RowNoise([7, 8, 9]))
        fresh = entropy_bound_generate(net, ids, None, cfg, RowNoise([7, 8, 9]), use_cache=False)
    finally:
        net.model.config.text_config.sliding_window = 1024
    assert torch.equal(cached.completion, fresh.completion) and cached.steps == fresh.steps
    batch = entropy_bound_generate(net, ids, None, cfg, RowNoise([7, 8, 9]))
    alone = [entropy_bound_generate(net, ids[i:i + 1], None, cfg, RowNoise([7 + i])).completion for i in range(3)]
    assert torch.equal(batch.completion, torch.cat(alone))


def test_pinned_tokens_stay_and_the_trajectory_records_each_step(gemma):
    """A pinned position holds its token in every state and in the output and is never recorded as
    accepted; each recorded step's log-probs are those of the accepted tokens at its temperature."""
    ids = torch.randint(4, 100, (2, 5), generator=torch.Generator().manual_seed(3))
    canvas = torch.full((2, 16), -1)
    canvas[:, [1, 6, 12]] = torch.tensor([40, 41, 42])
    traj = UniformTrajectory()
    out = entropy_bound_generate(gemma.net, ids, None, SamplerConfig(gen_length=16, uniform=EB), RowNoise([1, 2]),
                                 traj, eos_id=None, canvas=canvas, free_id=-1)
    assert out.completion[:, [1, 6, 12]].tolist() == [[40, 41, 42]] * 2
    pos = traj.positions(16)  # (2, T, 16)
    assert not pos[:, :, [1, 6, 12]].any() and pos.any()
    for s in range(traj.num_steps):
        k = traj.canvas_of[s]
        held = canvas[:, k * 8:(k + 1) * 8] >= 0
        assert torch.equal(traj.canvas[s][held], canvas[:, k * 8:(k + 1) * 8][held])
    assert torch.equal(traj.logps, traj.position_logps(16).sum(-1)) and (traj.logps <= 0).all()
    assert traj.counts.sum() == pos.sum() and torch.equal(traj.final, out.completion)


def test_a_completion_that_is_not_whole_canvases_fails_in_one_line(gemma):
    with pytest.raises(ConfigError) as err:
        entropy_bound_generate(gemma.net, torch.ones(1, 3, dtype=torch.long), None, SamplerConfig(gen_length=12))
    assert "sampler.gen_length" in str(err.value) and "canvas_length=8" in str(err.value)
