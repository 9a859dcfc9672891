"""Whole runs through the Hugging Face backend (``model=hf``) on tiny models and CPUs: two RL steps with
and without LoRA, the cached old policy equal to a copy, two DDP processes equal to one. Loading, LoRA's
reference and the configs: tests/unit/models/test_hf.py."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffusion_rl.app.train import train
from tests.helpers.common import CONF, capture_module, compose_cfg
from tests.helpers.tiny_hf import SMALL, needs_peft

ROOT = CONF.parent


def _losses(run_dir: Path) -> list[float]:
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    return [float(r["train/loss"]) for r in rows if r.get("train/loss")]


@pytest.mark.parametrize("lora", [0, pytest.param(8, marks=needs_peft)])
def test_two_rl_steps_through_model_hf(tmp_path, hf_path, lora, monkeypatch):
    cfg = compose_cfg(
        [
            "model=hf",
            f"model.path={hf_path}",
            f"model.lora_r={lora}",
            "objective.mu=2",
            "trainer.max_steps=2",
            "model.gradient_checkpointing=true",
        ]
        + SMALL,
        tmp_path,
        tiny=False,
    )
    captured = capture_module(monkeypatch)
    summary = train(cfg, tmp_path / "run")
    assert summary["optimizer_steps"] == 2
    losses = _losses(tmp_path / "run")
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    m = captured["module"]
    changed = {
        k for k, v in m.policy.state_dict().items() if not torch.equal(captured["start"][k], v)
    }
    assert changed, "no parameter changed"
    if lora:
        assert all("lora_" in k for k in changed)  # only the adapters train
        assert sum(p.numel() for p in m.policy.parameters() if p.requires_grad) < 20_000
    else:
        assert any("lora_" not in k for k in changed)


@pytest.mark.parametrize("objective", ["grpo", "stabledrl", "egspo"])
def test_cached_old_policy_gives_the_same_losses_as_a_copy(tmp_path, objective):
    base = [
        f"objective={objective}",
        "objective.mu=2",
        "trainer.max_steps=4",
        "warmstart.steps=2",
        "eval.before=false",
        "eval.after=false",
        "trainer.checkpoint_every_n_steps=0",
        "diagnostics.samples_every_n_steps=0",
    ]
    losses = {}
    for mode in ("copy", "precomputed"):
        cfg = compose_cfg(base + [f"old_policy={mode}"], tmp_path / mode)
        train(cfg, tmp_path / mode / "run")
        losses[mode] = _losses(tmp_path / mode / "run")
    assert len(losses["copy"]) == 4
    assert losses["copy"] == losses["precomputed"]  # bit for bit: same weights, same seeds
    assert any(v != 0 for v in losses["copy"])


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["stabledrl", "grpo"])
def test_two_process_ddp_equals_one_process(tmp_path, objective):
    """3 prompts x 4 samples = 12 rows, 6 per process: the second group spans both processes."""
    common = [
        f"objective={objective}",
        "objective.mu=2",
        "trainer.max_steps=4",
        "task.prompts_per_batch=3",
        "task.group_size=4",
        "warmstart.steps=2",
        "eval.before=false",
        "eval.after=false",
        "trainer.checkpoint_every_n_steps=0",
        "diagnostics.samples_every_n_steps=0",
        "model.d_model=32",
        "model.n_layers=2",
        "model.n_heads=2",
        "task.num_train=64",
        "task.num_test=8",
        "warmstart.batch_size=8",
        "warmstart.reuse=false",
        "sampler.steps=4",
        "trainer.enable_progress_bar=false",
        f"paths.cache_dir={tmp_path / 'cache'}",
    ]
    one = tmp_path / "one"
    train(compose_cfg(common, tmp_path, tiny=False), one)
    two = tmp_path / "two"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": str(ROOT / "src"),
    }
    cmd = [
        sys.executable,
        str(ROOT / "src" / "train.py"),
        "trainer=ddp",
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        *common,
        f"hydra.run.dir={two}",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = _losses(one), _losses(two)
    assert len(a) == len(b) == 4
    torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=1e-4, atol=1e-6)
    rows = list(csv.DictReader(open(two / "metrics.csv")))
    one_rows = list(csv.DictReader(open(one / "metrics.csv")))
    key = "train/reward"
    assert [r[key] for r in rows if r.get(key)] == [r[key] for r in one_rows if r.get(key)]
