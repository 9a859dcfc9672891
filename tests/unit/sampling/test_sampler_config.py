"""The sampler's configuration at the edges of what it accepts: for each rule the last value accepted
and the first refused (refused in one line naming the key), the exact sampler it falls back to, and
the deprecated key names it still takes."""

import logging
from dataclasses import replace

import pytest

from diffusion_rl.core import config as core_config
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.sampling import SamplerConfig
from diffusion_rl.sampling.sampler import schedule_part, start_canvas

BASE = dict(gen_length=8, block_length=4, steps=4)

ACCEPTED = [
    dict(gen_length=1, block_length=1, steps=1), dict(steps=2), dict(gen_length=4, block_length=4, steps=4),
    dict(temperature=0.0), dict(remasking="random"), dict(cfg_scale=0.0), dict(cfg_scale=0.5),
    dict(rollout_batch_size=0), dict(gumbel_dtype="float32"), dict(decode="threshold"), dict(decode="factor"),
    dict(decode="threshold", threshold=0.0), dict(decode="threshold", threshold=1.0), dict(factor=1e-6),
    dict(kv_cache="prefix"), dict(kv_cache="dual"), dict(kv_cache_refresh=0), dict(editing_threshold=0.0),
    dict(editing_threshold=1.0), dict(max_post_steps=0), dict(schedule="maskgit"),
    dict(schedule="ass", gen_length=8, block_length=8, steps=3), dict(schedule="ass", gen_length=2, block_length=2, steps=1),
    dict(eos_gamma_min=0.0, eos_gamma_max=0.0), dict(eos_gamma_min=0.01),
]

REFUSED = [
    (dict(gen_length=0), "gen_length"), (dict(block_length=0), "block_length"), (dict(steps=0), "steps"),
    (dict(gen_length=8, block_length=3), "gen_length"), (dict(steps=3), "steps"),
    (dict(gen_length=4, block_length=4, steps=5), "steps"), (dict(temperature=-0.01), "temperature"),
    (dict(remasking="top_k"), "remasking"), (dict(cfg_scale=-0.01), "cfg_scale"),
    (dict(rollout_batch_size=-1), "rollout_batch_size"), (dict(gumbel_dtype="float16"), "gumbel_dtype"),
    (dict(decode="greedy"), "decode"), (dict(decode="threshold", remasking="random"), "remasking"),
    (dict(decode="threshold", threshold=1.01), "threshold"), (dict(decode="threshold", threshold=-0.01), "threshold"),
    (dict(factor=0.0), "factor"), (dict(kv_cache="full"), "kv_cache"), (dict(kv_cache="prefix", cfg_scale=0.5), "cfg_scale"),
    (dict(kv_cache_refresh=-1), "kv_cache_refresh"), (dict(editing_threshold=1.01), "editing_threshold"),
    (dict(editing_threshold=-0.01), "editing_threshold"), (dict(max_post_steps=-1), "max_post_steps"),
    (dict(schedule="cosine"), "schedule"), (dict(schedule="maskgit", decode="threshold"), "schedule"),
    (dict(schedule="ass", steps=2), "block_length"), (dict(schedule="ass", gen_length=8, block_length=8, steps=4), "steps"),
    (dict(eos_gamma_min=-0.01), "eos_gamma_min"), (dict(eos_gamma_max=-0.01), "eos_gamma_max"),
    (dict(eos_gamma_min=0.01, decode="threshold"), "decode"), (dict(eos_gamma_max=2.0, remasking="random"), "remasking"),
]


@pytest.mark.parametrize("kw", ACCEPTED, ids=[str(k) for k in ACCEPTED])
def test_the_last_accepted_values(kw):
    SamplerConfig(**{**BASE, **kw}).validate()


@pytest.mark.parametrize("kw,key", REFUSED, ids=[str(k) for k, _ in REFUSED])
def test_the_first_refused_values_name_their_key(kw, key):
    with pytest.raises(ConfigError, match=rf"^eval\.sampler\.{key}\b"):
        SamplerConfig(**{**BASE, **kw}).validate("eval.sampler")


def test_eoser_is_on_when_either_factor_is_not_one():
    assert not SamplerConfig().eoser
    assert SamplerConfig(eos_gamma_min=0.5).eoser and SamplerConfig(eos_gamma_max=0.5).eoser


FAST = dict(decode="threshold", kv_cache="dual", stop_after_eos=True, remasking="random", schedule="maskgit",
            eos_gamma_min=0.01, eos_gamma_max=0.5, editing_threshold=None)


def test_the_exact_sampler_turns_every_fewer_forward_option_off_and_keeps_the_rest():
    fast = SamplerConfig(gen_length=64, block_length=16, steps=32, temperature=0.7, **FAST)
    exact = fast.as_exact()
    assert exact.exact
    assert (exact.decode, exact.kv_cache, exact.stop_after_eos, exact.remasking, exact.schedule) == \
        ("fixed", "none", False, "low_confidence", "even")
    assert (exact.eos_gamma_min, exact.eos_gamma_max) == (1.0, 1.0)
    assert (exact.gen_length, exact.block_length, exact.steps, exact.temperature) == (64, 16, 32, 0.7)


@pytest.mark.parametrize("option", [dict(decode="factor"), dict(kv_cache="prefix"), dict(stop_after_eos=True),
                                    dict(editing_threshold=0.9), dict(schedule="maskgit"), dict(eos_gamma_max=0.5)])
def test_each_fewer_forward_option_makes_the_sampler_inexact(option):
    assert SamplerConfig().exact
    assert not SamplerConfig(**option).exact


def test_the_deprecated_cache_keys_set_the_new_ones_and_warn_naming_them(caplog, monkeypatch):
    monkeypatch.setattr(core_config, "_WARNED", set())
    with caplog.at_level(logging.WARNING):
        cfg = SamplerConfig(cache="prefix", cache_refresh=3)
    assert (cfg.kv_cache, cfg.kv_cache_refresh, cfg.cache, cfg.cache_refresh) == ("prefix", 3, None, None)
    text = caplog.text
    assert "sampler.cache is deprecated and goes in the next release: use sampler.kv_cache\n" in text + "\n"
    assert "sampler.cache_refresh is deprecated and goes in the next release: use sampler.kv_cache_refresh" in text
    assert replace(cfg).kv_cache == "prefix"  # a copy does not take the old keys again
    untouched = SamplerConfig(kv_cache="dual", kv_cache_refresh=2)
    assert (untouched.kv_cache, untouched.kv_cache_refresh) == ("dual", 2)


def test_a_part_of_the_schedule_needs_fixed_decoding_and_steps_inside_it():
    cfg = SamplerConfig(**BASE)
    assert schedule_part(cfg, 0, None) == 4
    assert schedule_part(cfg, 0, 0) == 0 and schedule_part(cfg, 4, 4) == 4 and schedule_part(cfg, 1, 3) == 3
    assert schedule_part(cfg, 2, None) == 4
    for start, stop in [(-1, 2), (3, 2), (0, 5), (5, None)]:
        with pytest.raises(ValueError, match="must lie in 0 .. sampler.steps=4"):
            schedule_part(cfg, start, stop)
    parallel = replace(cfg, decode="threshold")
    assert schedule_part(parallel, 0, None) > 10**9  # no step limit: the confidences decide
    with pytest.raises(ValueError, match="need sampler.decode=fixed"):
        schedule_part(parallel, 1, None)


def test_the_start_canvas_is_all_masked_or_the_given_one_in_the_prompt_s_dtype():
    import torch

    like = torch.zeros(2, 3, dtype=torch.int32)
    full = start_canvas(None, 2, 4, 9, like)
    assert full.dtype == torch.int32 and full.tolist() == [[9] * 4] * 2
    given = torch.tensor([[1, 9, 9, 2], [9, 9, 9, 9]])
    out = start_canvas(given, 2, 4, 9, like)
    assert out.dtype == torch.int32 and out.tolist() == given.tolist()
    with pytest.raises(ValueError, match=r"canvas \(2, 3\) must cover the completion \(2, 4\)"):
        start_canvas(given[:, :3], 2, 4, 9, like)


def test_the_uniform_sampler_s_errors_name_its_keys_under_the_prefix():
    from diffusion_rl.sampling.entropy_bound import EntropyBoundConfig

    with pytest.raises(ConfigError, match=r"^eval\.sampler\.uniform\.steps\b"):
        SamplerConfig(uniform=EntropyBoundConfig(steps=0)).validate("eval.sampler")
