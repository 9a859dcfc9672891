"""Whole tiny runs of single objectives' options, each beside the generic run per objective
(tests/e2e/test_train_e2e.py): what only a run shows, as the old policy's modes agreeing over updates or
a metric left out of every row. The objectives' losses are tested in tests/unit/rl/."""

import csv
import json

import pytest

from diffusion_rl.app.train import train
from diffusion_rl.rl.objectives.bgpo import BGPO
from tests.helpers.blocks import BS
from tests.helpers.common import compose_cfg


def test_a_tiny_run_with_eoser_and_ass_trains_and_the_old_policy_modes_agree(tmp_path):
    """``sampler.schedule=ass`` (Sudoku's 16 cells: 4 steps of 1, 2, 4, 9) with EOSER: the run trains,
    every rollout takes log2 16 = 4 steps, and a frozen copy of the old policy and old log-probs taken at
    rollout time give the same losses."""
    common = ["objective=cj_grpo", "objective.mu=2", "sampler.schedule=ass", "sampler.eos_gamma_min=0.01",
              "optim.lr=3e-4", "trainer.max_steps=2", "eval.before=false", "eval.after=false"]
    losses = {}
    for mode in ("copy", "precomputed"):
        train(compose_cfg([*common, f"old_policy={mode}"], tmp_path), tmp_path / mode)
        rows = [r for r in csv.DictReader(open(tmp_path / mode / "metrics.csv")) if r.get("train/loss")]
        assert len(rows) == 2 and float(rows[0]["rollout/steps_per_sample"]) == 4
        assert 0 < float(rows[0]["cost/train_forwards_per_sample"]) <= 4
        losses[mode] = [float(r["train/loss"]) for r in rows]
    assert losses["copy"] == pytest.approx(losses["precomputed"], abs=1e-7)
    assert losses["copy"][1] != 0  # the second update's ratio moved


def test_one_run_without_the_old_policy(tmp_path):
    """wd1 with ratio_diagnostic=false: it trains and logs no ratio."""
    summary = train(compose_cfg(["objective=wd1", "objective.mu=2", "objective.ratio_diagnostic=false"], tmp_path),
                    tmp_path / "run")
    assert summary["optimizer_steps"] == 4
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert "ratio/log_std" not in rows[0] and "weights/ess" in rows[0]


def test_a_nonfinite_copy_skips_the_whole_update(tmp_path, monkeypatch):
    """Copy 5 of the first update gives a NaN loss after copies 0-4 were backpropagated: the module drops
    the update whole and counts it skipped (a skipped update leaves weights and optimizer untouched:
    tests/e2e/test_faults.py)."""
    real = BGPO.loss_parts
    updates = []

    def poisoned(self, ctx):
        updates.append(ctx.inner_iter)
        for j, (part, m) in enumerate(real(self, ctx)):
            yield (part * float("nan") if len(updates) == 1 and j == 5 else part), m

    monkeypatch.setattr(BGPO, "loss_parts", poisoned)
    cfg = compose_cfg(["objective=bgpo", "likelihood.num_samples=8", "trainer.max_steps=2", "eval.before=false",
                       "eval.after=false", "trainer.checkpoint_every_n_steps=0"], tmp_path)
    summary = train(cfg, tmp_path / "run")
    assert summary["skipped_updates"] == 1 and summary["optimizer_steps"] == 2 and len(updates) == 3
    rows = [r for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv")) if r.get("train/skipped_updates")]
    assert [float(r["train/skipped_updates"]) for r in rows] == [1.0, 1.0, 1.0]
    assert [bool(r.get("grad/norm")) for r in rows] == [False, True, True]  # the skipped update logs no norm


def test_block_model_stabledrl_staircase_end_to_end(tmp_path):
    """StableDRL on a block model, scored with the staircase estimator."""
    cfg = compose_cfg(["model=tiny_block", "objective=stabledrl", "likelihood=staircase",
                       "objective.mu=2"], tmp_path)
    summary = train(cfg, tmp_path / "run")
    assert summary["optimizer_steps"] == 4 and summary["rollouts"] == 2
    s = json.load(open(tmp_path / "run" / "summary.json"))
    assert s["config"]["model"]["block_size"] == BS and s["config"]["likelihood"]["name"] == "staircase"
    assert set(s["after"]) >= {"cell_accuracy", "valid_rate"}
