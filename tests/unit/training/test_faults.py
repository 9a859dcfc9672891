"""Injected faults (conf/fault/) and checkpoint refusals in one step each: a raising reward's log line
truncated, a checkpoint holding pickled code refused unrun, a bad fault value refused in one line. Whole
runs under each fault: tests/e2e/test_faults.py."""

import logging
import pathlib

import pytest
import torch

from diffusion_rl.app.train import build, train
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.training.checkpoint import resolve_checkpoint
from diffusion_rl.training.faults import FaultConfig, FaultInjector
from tests.helpers.common import compose_cfg


def test_reward_failure_log_truncates_huge_completions(tmp_path, caplog):
    c = build(compose_cfg([], tmp_path))
    task, items = c.task, c.task.train_items()[:2]
    fault = FaultInjector(FaultConfig(kind="reward_raises", at_step=0, every=2))
    clean = task.rewards(["x" * 50_000, "1234"], items)
    fault.wrap_rewards(task)
    fault._training = True
    with caplog.at_level(logging.WARNING, logger="diffusion_rl.tasks.base"):
        got = task.rewards(["x" * 50_000, "1234"], items)
        task.rewards(["y" * 50_000, "1234"], items)
    assert got[0] == task.cfg.failure_reward and got[1] == clean[1]
    assert task.reward_failures == 2
    (msg,) = [r.getMessage() for r in caplog.records]
    assert len(msg) < 800 and "more chars" in msg and "\n" not in msg


def test_checkpoint_with_pickled_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (pathlib.Path.touch, (marker,))

    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {"policy.w": torch.zeros(1)}, "global_step": 1, "x": Evil()}, path)
    with pytest.raises(ConfigError) as err:
        resolve_checkpoint(str(path), tmp_path)
    assert "\n" not in str(err.value) and "no readable checkpoint" in str(err.value)
    assert not marker.exists()


def test_bad_fault_value_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="fault.kind"):
        train(compose_cfg(["fault.kind=explode"], tmp_path), tmp_path / "run")
