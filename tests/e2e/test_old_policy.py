"""The first update after a rollout takes the old log-probs from the policy's own forward (the policy
still is the old policy there): one forward fewer, the same losses."""

import csv
from pathlib import Path

import pytest

from diffusion_rl.app.train import train
from diffusion_rl.rl.objectives.base import Objective
from tests.helpers.common import compose_cfg

RUN = ["objective.mu=2", "trainer.max_steps=4", "eval.before=false", "eval.after=false",
       "eval.every_n_steps=0", "trainer.checkpoint_every_n_steps=0", "diagnostics.samples_every_n_steps=0"]


def _column(run_dir: Path, key: str) -> list[float]:
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    return [float(r[key]) for r in rows if r.get(key)]


@pytest.mark.parametrize("old_policy", ["copy", "precomputed"])
@pytest.mark.parametrize("objective", ["grpo", "stabledrl"])
def test_first_update_skips_the_old_forward_and_keeps_the_losses(tmp_path, monkeypatch, objective, old_policy):
    calls = []
    real_old_values = Objective.compute_old_logp

    def counted(self, ctx):
        calls.append(ctx.inner_iter)
        return real_old_values(self, ctx)

    monkeypatch.setattr(Objective, "compute_old_logp", counted)
    args = [f"objective={objective}", f"old_policy={old_policy}", "objective.share_masks_with_old=true", *RUN]
    train(compose_cfg(args, tmp_path / "skip"), tmp_path / "skip" / "run")
    assert calls == [1, 1]  # two rollouts of mu=2 updates: the old policy scored at the second update only
    skipped = {k: _column(tmp_path / "skip" / "run", k) for k in ("train/loss", "grad/norm")}

    calls.clear()
    monkeypatch.setattr(Objective, "old_logp_like_policy", lambda self: False)  # every update scores it
    train(compose_cfg(args, tmp_path / "full"), tmp_path / "full" / "run")
    assert calls == [0, 1, 0, 1]
    for key, values in skipped.items():
        assert values == pytest.approx(_column(tmp_path / "full" / "run", key), rel=1e-6, abs=1e-7), key


def test_fresh_masks_keep_the_old_forward(tmp_path, monkeypatch):
    """With the new policy scored on other masks than the old one, the old log-probs are not the
    policy's: the old policy is scored (once per rollout, on its own masks) and the first ratio is not 1."""
    calls = []
    real_old_values = Objective.compute_old_logp
    monkeypatch.setattr(Objective, "compute_old_logp", lambda self, ctx: calls.append(ctx.inner_iter) or real_old_values(self, ctx))
    train(compose_cfg(["objective=stabledrl", "objective.share_masks_with_old=false", *RUN], tmp_path), tmp_path / "run")
    assert calls == [0, 0]  # two rollouts of mu=2 updates
    assert all(v > 0 for v in _column(tmp_path / "run", "ratio/log_std"))
