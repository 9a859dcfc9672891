"""Held-out evaluation during RL (training/evaluation.py ``PeriodicEval``) observes the run without
changing it: the same training rows and the same final model with or without it."""

import csv

from diffusion_rl.app.train import train
from tests.helpers.common import compose_cfg


def rows(run):
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_evaluating_every_step_leaves_the_training_unchanged(tmp_path):
    quiet = train(compose_cfg(["eval.every_n_steps=0"], tmp_path), tmp_path / "a")
    watched = train(compose_cfg(["eval.every_n_steps=1"], tmp_path), tmp_path / "b")
    strip = lambda rs: [{k: v for k, v in r.items() if v and not k.startswith(("time/", "throughput/", "eval/", "val/"))}
                        for r in rs if r.get("grad/norm")]
    assert strip(rows(tmp_path / "a")) == strip(rows(tmp_path / "b"))  # bitwise, as text
    assert quiet["after"] == watched["after"]
    # the test split before and after RL (eval/*), the validation split at every step (val/*)
    tests = [(int(r["step"]), float(r["eval/cell_accuracy"])) for r in rows(tmp_path / "b") if r.get("eval/cell_accuracy")]
    assert tests == [(0, quiet["before"]["cell_accuracy"]), (4, quiet["after"]["cell_accuracy"])]
    assert [int(r["step"]) for r in rows(tmp_path / "a") if r.get("eval/cell_accuracy")] == [0, 4]
    vals = [int(r["step"]) for r in rows(tmp_path / "b") if r.get("val/cell_accuracy")]
    assert vals == [0, 1, 2, 3, 4] and [v["step"] for v in watched["validation"]] == [0, 1, 2, 3, 4]
