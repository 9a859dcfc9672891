"""``eval.noise_key``: which random numbers a held-out evaluation draws where it still draws some."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from diffusion_rl.app.train import EvalConfig
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig
from diffusion_rl.sampling import SamplerConfig
from diffusion_rl.training.evaluation import generate_texts
from tests.helpers.gemma import EB, sharp_gemma

PROMPTS = ["1.3.", "24..", "..1.", "3...", "4.2.", ".1.3"]


def test_a_uniform_noise_evaluation_is_one_draw_per_key():
    bundle = sharp_gemma(canvas=8)
    sampler = SamplerConfig(gen_length=8, temperature=0.0, uniform=replace(EB, t_max=2.0, t_min=1.5))
    draw = {k: generate_texts(bundle, PROMPTS, sampler, batch_size=4, noise_key=k) for k in (0, 1, 2)}
    assert generate_texts(bundle, PROMPTS, sampler, batch_size=4) == draw[0]  # key 0 is the default
    assert generate_texts(bundle, PROMPTS, sampler, batch_size=2, noise_key=1) == draw[1]  # not the batching
    assert draw[1] != draw[0] and draw[2] != draw[0] and draw[2] != draw[1]
    # each prompt's draw is its own: the same prompt alone, at its row, under the same key
    alone = generate_texts(bundle, PROMPTS[3:4], sampler, batch_size=1, rows=[3], noise_key=2)
    assert alone == draw[2][3:4]


def test_greedy_masked_decoding_draws_nothing_whatever_the_key():
    torch.manual_seed(0)
    bundle = build_policy(ModelConfig(name="tiny", d_model=32, n_layers=2, n_heads=4))
    sampler = SamplerConfig(gen_length=8, block_length=8, steps=4, temperature=0.0)
    texts = generate_texts(bundle, PROMPTS, sampler, batch_size=6)
    assert all(generate_texts(bundle, PROMPTS, sampler, batch_size=6, noise_key=k) == texts for k in (1, 7))


def test_noise_key_is_checked():
    EvalConfig(noise_key=3).validate()
    with pytest.raises(ConfigError, match=r"^eval\.noise_key=-1 is invalid"):
        EvalConfig(noise_key=-1).validate()
