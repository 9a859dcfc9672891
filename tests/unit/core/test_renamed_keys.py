"""Renamed config keys keep working for one release: the old key or value is taken for the new one,
with one warning line that names the new key."""

from __future__ import annotations

import logging

import pytest

from diffusion_rl.app.train import run_config
from diffusion_rl.core import config
from diffusion_rl.core.config import from_dict
from diffusion_rl.sampling import SamplerConfig
from tests.helpers.common import compose_cfg

CASES = [
    (["sampler.cache=dual"], lambda c: from_dict(SamplerConfig, c.sampler, "sampler").kv_cache, "dual",
     "sampler.kv_cache"),
    (["sampler.cache_refresh=3"], lambda c: from_dict(SamplerConfig, c.sampler, "sampler").kv_cache_refresh, 3,
     "sampler.kv_cache_refresh"),
    (["old_policy=cached"], lambda c: run_config(c).old_policy, "precomputed", "old_policy=precomputed"),
    (["warmstart.cache=false"], lambda c: run_config(c).warmstart.reuse, False, "warmstart.reuse"),
]


@pytest.mark.parametrize("overrides, read, want, new", CASES, ids=[c[0][0] for c in CASES])
def test_an_old_key_is_taken_for_the_new_one_with_one_warning_line(tmp_path, caplog, monkeypatch, overrides, read,
                                                                   want, new):
    monkeypatch.setattr(config, "_WARNED", set())
    cfg = compose_cfg(overrides, tmp_path)
    with caplog.at_level(logging.WARNING, logger="diffusion_rl.core.config"):
        assert read(cfg) == want
        read(cfg)  # a second reading does not warn again
    lines = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(lines) == 1 and new in lines[0] and "\n" not in lines[0]
    assert lines[0].split(" is deprecated")[0] in overrides[0]  # it names the old key (or value) the user gave


def test_the_new_keys_do_not_warn(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(config, "_WARNED", set())
    cfg = compose_cfg(["sampler.kv_cache=dual", "old_policy=precomputed", "warmstart.reuse=false"], tmp_path)
    with caplog.at_level(logging.WARNING, logger="diffusion_rl.core.config"):
        assert from_dict(SamplerConfig, cfg.sampler, "sampler").kv_cache == "dual"
        run = run_config(cfg)
    assert (run.old_policy, run.warmstart.reuse) == ("precomputed", False)
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()]


def test_the_warm_start_folder_follows_the_cache_folder_unless_set(tmp_path):
    assert compose_cfg([], tmp_path).paths.warmstart_dir == str(tmp_path / "cache" / "warmstart")
    assert compose_cfg([f"paths.warmstart_dir={tmp_path / 'ws'}"], tmp_path).paths.warmstart_dir == str(tmp_path / "ws")
