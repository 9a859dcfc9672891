"""eval.every_n_steps: held-out metrics on the validation split during training, changing nothing else."""

import csv
import json

from diffusion_rl.app.train import train
from tests.helpers.common import compose_cfg


def rows(run):
    return list(csv.DictReader(open(run / "metrics.csv")))


def test_validation_curve_is_logged_and_training_is_unchanged(tmp_path):
    base = ["eval.before=false", "eval.after=false", "trainer.max_steps=4", "task.num_val=8"]
    train(compose_cfg(base + ["eval.every_n_steps=2"], tmp_path / "a"), tmp_path / "a" / "run")
    train(compose_cfg(base, tmp_path / "b"), tmp_path / "b" / "run")
    a, b = rows(tmp_path / "a" / "run"), rows(tmp_path / "b" / "run")
    val = [(int(r["step"]), float(r["val/cell_accuracy"])) for r in a if r.get("val/cell_accuracy")]
    assert [s for s, _ in val] == [0, 2, 4] and all(0 <= v <= 1 for _, v in val)
    losses = lambda rs: [r["train/loss"] for r in rs if r.get("train/loss")]  # noqa: E731
    assert losses(a) == losses(b) and len(losses(a)) == 4  # greedy evaluation draws no random numbers
    summary = json.load(open(tmp_path / "a" / "run" / "summary.json"))
    assert [v["step"] for v in summary["validation"]] == [0, 2, 4]
    assert summary["validation"][0]["val/cell_accuracy"] == val[0][1]
