"""``sample`` (sampling/dispatch.py): which sampler each kind of model takes, and that every argument
reaches it as given. The three samplers are replaced by recorders of their calls; each is tested against
its own reference in its own file (test_sampler.py, test_block.py, test_uniform_sampler.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import diffusion_rl.sampling.dispatch as dispatch
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.sampling import SamplerConfig
from diffusion_rl.sampling.uniform_trajectory import UniformTrajectory

IDS, MASK, NOISE, CANVAS = torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3), object(), torch.zeros(2, 4)


@pytest.fixture
def calls(monkeypatch) -> dict[str, tuple]:
    """Each sampler replaced by a recorder of its call (positional and keyword arguments) that returns
    the sampler's name."""
    seen: dict[str, tuple] = {}

    def recorder(name: str):
        def call(*args, **kwargs):
            seen[name] = (args, kwargs)
            return name
        return call

    for name in ("generate", "block_generate", "entropy_bound_generate"):
        monkeypatch.setattr(dispatch, name, recorder(name))
    return seen


def bundle(noise: str = "mask", block_size: int = 0) -> SimpleNamespace:
    return SimpleNamespace(net=SimpleNamespace(name="policy"), noise=noise, block_size=block_size,
                           mask_token_id=7, eos_token_id=9)


def test_a_uniform_noise_model_takes_the_entropy_bound_sampler_with_every_argument(calls):
    cfg, rec, old = SamplerConfig(), UniformTrajectory(), SimpleNamespace(name="old")
    assert dispatch.sample(bundle("uniform"), IDS, MASK, cfg, NOISE, rec, net=old, canvas=CANVAS) == "entropy_bound_generate"
    args, kw = calls["entropy_bound_generate"]
    assert args[0] is old and args[1:] == (IDS, MASK, cfg, NOISE, rec)
    assert kw == {"eos_id": 9, "canvas": CANVAS, "free_id": 7}
    dispatch.sample(bundle("uniform"), IDS, MASK, cfg)
    assert calls["entropy_bound_generate"][0][0].name == "policy"  # no net given: the bundle's
    with pytest.raises(ValueError, match="start_step / stop_step"):
        dispatch.sample(bundle("uniform"), IDS, MASK, cfg, stop_step=2)


@pytest.mark.parametrize("block_size", [1, 4])
@pytest.mark.parametrize("cache", [None, False, True])
def test_a_block_model_takes_the_block_sampler_with_its_cache_where_the_network_has_one(calls, block_size, cache):
    cfg, rec = SamplerConfig(), SimpleNamespace(kind="recorder")
    net = SimpleNamespace(name="old") if cache is None else SimpleNamespace(name="old", supports_kv_cache=cache)
    assert dispatch.sample(bundle(block_size=block_size), IDS, MASK, cfg, NOISE, rec, net=net, canvas=CANVAS) == "block_generate"
    args, kw = calls["block_generate"]
    assert args[0] is net and args[1:] == (IDS, MASK, cfg, block_size, 7, NOISE, rec)
    assert kw == {"use_cache": bool(cache), "eos_id": 9, "canvas": CANVAS}
    with pytest.raises(ValueError, match="start_step / stop_step"):
        dispatch.sample(bundle(block_size=block_size), IDS, MASK, cfg, start_step=1)


def test_any_other_model_takes_the_masked_diffusion_sampler_with_every_argument(calls):
    cfg, rec, old = SamplerConfig(), SimpleNamespace(kind="recorder"), SimpleNamespace(name="old")
    assert dispatch.sample(bundle(), IDS, MASK, cfg, NOISE, rec, net=old, canvas=CANVAS, start_step=2,
                           stop_step=5) == "generate"
    args, kw = calls["generate"]
    assert args[0].net is old and args[1:] == (IDS, MASK, cfg, 7, NOISE, rec)
    assert kw == {"net": old, "eos_id": 9, "canvas": CANVAS, "start_step": 2, "stop_step": 5}
    with pytest.raises(ConfigError, match=r"^sampler\.editing_threshold=0\.5 is invalid"):
        dispatch.sample(bundle(), IDS, MASK, SamplerConfig(editing_threshold=0.5))
