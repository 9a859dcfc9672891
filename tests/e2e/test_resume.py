"""Exact resume: a run stopped after a checkpoint and resumed equals an uninterrupted one, bitwise.

The fast test stops a run in-process (``fault=raise``); the slow one ``SIGKILL``s a ``src/train.py``
subprocess (``fault=kill``) and resumes it with ``ckpt_path=last``. Both compare every logged metric
except timings, step for step, as the CSV's text (so bitwise), and the final weights and optimizer.
"""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffusion_rl.app.train import train
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.tasks.order import ResumableLoader
from diffusion_rl.training.checkpoint import (
    atomic_save,
    resolve_checkpoint,
    rng_state,
    set_rng_state,
)
from diffusion_rl.training.faults import InjectedFault
from tests.helpers.common import TINY, compose_cfg

ROOT = Path(__file__).resolve().parents[2]
# 6 training items in batches of 2: an epoch is 3 rollouts, so 8 steps (mu=1) cross two epochs.
BASE = ["task.num_train=6", "objective.mu=1", "trainer.max_steps=8", "trainer.checkpoint_every_n_steps=2"]


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return [{k: v for k, v in r.items() if v != "" and not k.startswith(("time/", "throughput/"))} for r in rows]


def assert_same_run(a: Path, b: Path) -> None:
    rows_a, rows_b = metric_rows(a), metric_rows(b)
    assert [r["step"] for r in rows_a if "grad/norm" in r] == [str(s) for s in range(1, 9)]
    assert [r["step"] for r in rows_a if "eval/cell_accuracy" in r] == ["0", "8"]  # before and after RL
    assert len(rows_a) == len(rows_b)
    for ra, rb in zip(rows_a, rows_b):
        for key in ("train/loss", "train/reward", "grad/norm"):
            assert ra.get(key) == rb.get(key), (ra["step"], key, ra.get(key), rb.get(key))
        assert ra == rb, ra["step"]  # every other metric too
    ca = torch.load(a / "checkpoints" / "last.ckpt", weights_only=True)
    cb = torch.load(b / "checkpoints" / "last.ckpt", weights_only=True)
    assert ca["global_step"] == cb["global_step"] == 8
    for k, v in ca["state_dict"].items():
        assert torch.equal(v, cb["state_dict"][k]), k
    for pid, st in ca["optimizer_states"][0]["state"].items():
        for k, v in st.items():
            assert torch.equal(v, cb["optimizer_states"][0]["state"][pid][k]), (pid, k)
    assert ca["loops"]["fit_loop"]["state_dict"] == cb["loops"]["fit_loop"]["state_dict"]
    assert not list((b / "checkpoints").glob("*.tmp*"))


@pytest.mark.parametrize("extra,at_step", [([], 5), ([], 7),  # 7: the checkpoint (6) ends an epoch
                                           (["objective=stabledrl"], 5), (["objective=egspo_sa"], 5),
                                           (["old_policy=precomputed"], 5)])
def test_resume_after_exception_is_exact(tmp_path, extra, at_step, monkeypatch):
    import diffusion_rl.training.checkpoint as ckpt_mod

    written = []  # Lightning writes checkpoints through our AtomicCheckpointIO
    monkeypatch.setattr(ckpt_mod, "atomic_save", lambda obj, path, real=ckpt_mod.atomic_save: (written.append(path), real(obj, path)))
    full = train(compose_cfg(BASE + extra, tmp_path), tmp_path / "a")
    assert sorted({Path(p).name for p in written}) == ["last.ckpt"] + [f"step{s:06d}.ckpt" for s in (2, 4, 6, 8)]
    cfg = compose_cfg(BASE + extra + ["fault=raise", f"fault.at_step={at_step}"], tmp_path)
    with pytest.raises(InjectedFault):
        train(cfg, tmp_path / "b")
    assert resolve_checkpoint("last", tmp_path / "b").global_step == at_step - 1  # not the last step run
    resumed = train(compose_cfg(BASE + extra + ["ckpt_path=last"], tmp_path), tmp_path / "b")
    assert_same_run(tmp_path / "a", tmp_path / "b")
    assert resumed["after"] == full["after"]
    assert resumed["rollouts"] == full["rollouts"] == 8
    assert resumed["grad"] == full["grad"]  # the spike tracker's running state came back too


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["rollout.staleness=1", "rollout.worker_threads=1"]])
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path, extra):
    """``python src/train.py``: killed with SIGKILL after step 5 (checkpoint at 4), resumed from ``last``.
    With ``rollout.staleness=1`` the worker process is sampling ahead when the kill comes: the resumed
    run samples the checkpoint's pending batch again, so no sample is lost or repeated."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    common = [sys.executable, "src/train.py", *TINY, *BASE, *extra, f"paths.cache_dir={tmp_path / 'cache'}"]

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([*common, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)

    a = run(f"hydra.run.dir={tmp_path / 'a'}")
    assert a.returncode == 0, a.stderr[-3000:]
    killed = run(f"hydra.run.dir={tmp_path / 'b'}", "fault=kill", "fault.at_step=5")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert not (tmp_path / "b" / "summary.json").exists()
    assert resolve_checkpoint("last", tmp_path / "b").global_step == 4
    resumed = run(f"hydra.run.dir={tmp_path / 'b'}", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(tmp_path / "a", tmp_path / "b")


# ---- the pieces -------------------------------------------------------------------------------
def test_loader_resumes_mid_epoch_and_across_epochs():
    items = list(range(7))

    def loader():
        return ResumableLoader(items, batch_size=2, seed=3, drop_last=True, collate_fn=list)

    ref, dl = [], loader()
    for epoch in range(3):
        dl.sampler.set_epoch(epoch)
        ref += [(epoch, b) for b in dl]
    assert len(ref) == 9 and ref[0][1] != ref[3][1]  # 3 full batches per epoch, a new order each epoch
    for cut in range(1, 9):  # stop after `cut` batches, resume in a fresh loader
        dl, got, state = loader(), [], None
        for epoch in range(3):
            dl.sampler.set_epoch(epoch)
            for b in dl:
                got.append((epoch, b))
                if len(got) == cut:
                    state = dl.state_dict()
                    break
            if state is not None:
                break
        dl2 = loader()
        dl2.load_state_dict(state)
        for epoch in range(state["epoch"], 3):
            dl2.sampler.set_epoch(epoch)
            got += [(epoch, b) for b in dl2]
        assert got == ref, cut


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    import random

    import numpy as np

    atomic_save({"rng": rng_state()}, tmp_path / "r.ckpt")
    want = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(torch.load(tmp_path / "r.ckpt", weights_only=True)["rng"])
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(want[0], got[0]) and np.array_equal(want[1], got[1]) and want[2] == got[2]


def test_atomic_save_leaves_previous_file_whole_when_write_dies(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_save({"v": torch.ones(3)}, path)

    def dying_save(obj, f, *a, **k):
        f.write(b"PK\x03\x04 partial")  # some bytes reach the disk, then the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        atomic_save({"v": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.equal(torch.load(path, weights_only=True)["v"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_ckpt_path_last_without_checkpoint_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        resolve_checkpoint("last", tmp_path / "run")
    assert "holds no checkpoints: add hydra.run.dir=<run folder>" in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # a run folder whose last.ckpt is gone
    with pytest.raises(ConfigError, match="no checkpoint file at"):
        resolve_checkpoint("last", tmp_path / "run")
