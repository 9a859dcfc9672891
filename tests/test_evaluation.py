"""Held-out evaluation during RL (training/evaluation.py ``PeriodicEval``) observes the run without
changing it: the same training rows and the same final model with or without it."""

import csv

from diffusion_rl.train import train

from .helpers import compose_cfg


def rows(run):
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_evaluating_every_step_leaves_the_training_unchanged(tmp_path):
    quiet = train(compose_cfg(["eval.every_n_steps=0"], tmp_path), tmp_path / "a")
    watched = train(compose_cfg(["eval.every_n_steps=1"], tmp_path), tmp_path / "b")
    strip = lambda rs: [{k: v for k, v in r.items() if v and not k.startswith(("time/", "throughput/", "eval/"))}
                        for r in rs if r.get("grad/norm")]
    assert strip(rows(tmp_path / "a")) == strip(rows(tmp_path / "b"))  # bitwise, as text
    assert quiet["after"] == watched["after"]
    evals = [(int(r["step"]), float(r["eval/cell_accuracy"])) for r in rows(tmp_path / "b") if r.get("eval/cell_accuracy")]
    assert [s for s, _ in evals] == [0, 1, 2, 3, 4]  # before RL, after each step (the last one is "after")
    assert evals[0][1] == quiet["before"]["cell_accuracy"] and evals[-1][1] == quiet["after"]["cell_accuracy"]
    assert [int(r["step"]) for r in rows(tmp_path / "a") if r.get("eval/cell_accuracy")] == [0, 4]
