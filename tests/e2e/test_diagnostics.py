"""Diagnostics (docs/methods.md §6) in tiny runs: every spec metric once per optimizer step, and the spike
tracker's state carried through a checkpoint. The tracker itself is tested in
tests/unit/training/test_diagnostics.py."""

import csv
import math

import pytest
import torch

from diffusion_rl.app.train import train
from diffusion_rl.training.diagnostics import OPTIONAL_METRICS, SPEC_METRICS
from tests.helpers.common import compose_cfg


def _rows(path):
    return list(csv.DictReader(open(path)))


@pytest.mark.parametrize("overrides,optional", [
    (["objective=stabledrl"], ["weights/ess", "weights/max"]),
    (["objective=grpo", "objective.beta=0.04"], ["train/kl"]),
    (["objective=stabledrl", "objective.beta=0.04"], ["train/kl", "weights/ess"]),
])
def test_tiny_run_logs_every_spec_metric_once_per_optimizer_step(tmp_path, overrides, optional):
    cfg = compose_cfg(overrides + ["objective.mu=2", "diagnostics.samples_every_n_steps=2",
                                   "diagnostics.num_samples=3"], tmp_path)
    summary = train(cfg, tmp_path / "run")
    rows = _rows(tmp_path / "run" / "metrics.csv")
    assert set(SPEC_METRICS) | set(optional) <= set(rows[0]), set(SPEC_METRICS) - set(rows[0])
    assert set(optional) <= set(OPTIONAL_METRICS)
    steps = [r for r in rows if r["grad/norm"]]
    assert [int(r["step"]) for r in steps] == [1, 2, 3, 4]  # one row per optimizer step, at that step
    totals = [float(r["grad/spikes_total"]) for r in steps]
    assert totals == sorted(totals) and totals[-1] == summary["grad"]["grad_spikes"]
    assert summary["grad"]["updates"] == 4
    rollout_rows = [r for r in steps if r["train/reward"]]
    assert len(rollout_rows) == 2  # rollout metrics once per rollout (mu=2)
    for r in rollout_rows:
        assert 0 <= float(r["train/frac_zero_std_groups"]) <= 1 and float(r["time/rollout_s"]) > 0
    if "weights/ess" in optional:
        G = cfg.task.group_size
        for r in steps:
            assert 1.0 - 1e-5 <= float(r["weights/ess"]) <= G + 1e-5
            assert 1.0 / G - 1e-6 <= float(r["weights/max"]) <= 1.0 + 1e-6
    else:
        assert all(math.isfinite(float(r["train/kl"])) and float(r["train/kl"]) >= -1e-6 for r in steps)
    samples = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 2 * 3  # at steps 2 and 4, 3 rows each
    assert '"prompt"' in samples[0] and '"completion"' in samples[0] and '"reward"' in samples[0]


def test_tracker_state_rides_in_the_checkpoint_and_resume_keeps_counting(tmp_path):
    cfg = compose_cfg(["objective=stabledrl", "objective.mu=2", "trainer.max_steps=2"], tmp_path)
    train(cfg, tmp_path / "run")
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    state = next(v for k, v in ckpt["callbacks"].items() if "DiagnosticsCallback" in k)
    assert state["tracker"]["count"] == 2 and len(state["tracker"]["history"]) == 2
    cfg = compose_cfg(["objective=stabledrl", "objective.mu=2", "trainer.max_steps=4",
                       f"ckpt_path={tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}"], tmp_path)
    summary = train(cfg, tmp_path / "resumed")
    assert summary["grad"]["updates"] == 4  # 2 before the checkpoint + 2 after
