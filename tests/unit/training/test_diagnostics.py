"""Diagnostics (docs/methods.md §6): spike detection, cross-process reduction, the callback in a
tiny run."""

import csv
import math

import pytest
import torch

from diffusion_rl.app.train import build, train
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.training.diagnostics import (
    OPTIONAL_METRICS,
    SPEC_METRICS,
    DiagnosticsConfig,
    GradSpikeTracker,
)
from tests.helpers.common import compose_cfg

# min_history=3: the first three norms are never spikes; factor 3 x the running median.
SERIES = [1.0, 1.2, 0.9, 1.1, 5.0, 1.0, 3.1, 2.9, 40.0, 1.0]
# 5.0 > 3 x median(1, 1.2, 0.9, 1.1) = 3.15; 3.1 < 3 x median(.., 5, 1) = 3.15; 2.9 < 3 x 1.1; 40 > 3 x 1.1
SPIKES = [0, 0, 0, 0, 1, 0, 0, 0, 1, 0]


def test_spike_detection_on_a_hand_made_series():
    cfg = DiagnosticsConfig(spike_factor=3.0, window=50, min_history=3, ema_decay=0.5)
    tr = GradSpikeTracker(cfg)
    rows = [tr.update(x) for x in SERIES]
    assert [int(r["grad/spike"]) for r in rows] == SPIKES
    assert [r["grad/spikes_total"] for r in rows] == [float(sum(SPIKES[: i + 1])) for i in range(len(SERIES))]
    ema = SERIES[0]
    for x, r in zip(SERIES, rows):
        ema = x if r is rows[0] else 0.5 * ema + 0.5 * x
        assert r["grad/norm_ema"] == pytest.approx(ema)
    s = tr.summary()
    assert s["grad_spikes"] == 2 and s["grad_norm_max"] == 40.0 and s["updates"] == len(SERIES)
    assert s["grad_norm_mean"] == pytest.approx(sum(SERIES) / len(SERIES))


def test_a_large_first_norm_is_not_a_spike_and_the_window_slides():
    tr = GradSpikeTracker(DiagnosticsConfig(min_history=2, window=2))
    assert [tr.update(x)["grad/spike"] for x in (100.0, 1.0, 1.0, 10.0, 10.0, 10.0)] == [0, 0, 0, 1, 0, 0]


def test_tracker_state_round_trip_continues_the_same_series():
    cfg = DiagnosticsConfig(min_history=3)
    whole = GradSpikeTracker(cfg)
    expected = [whole.update(x) for x in SERIES]
    first = GradSpikeTracker(cfg)
    for x in SERIES[:5]:
        first.update(x)
    second = GradSpikeTracker(cfg)
    second.load_state_dict(first.state_dict())
    assert [second.update(x) for x in SERIES[5:]] == expected[5:]


@pytest.mark.parametrize("bad", ["diagnostics.spike_factor=0.5", "diagnostics.min_history=0",
                                 "diagnostics.samples_every_n_steps=-1"])
def test_bad_diagnostics_values_fail_at_start(tmp_path, bad):
    with pytest.raises(ConfigError, match=bad.split("=")[0]):
        build(compose_cfg([bad], tmp_path))


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
