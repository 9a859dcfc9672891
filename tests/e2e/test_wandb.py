"""W&B and TensorBoard over whole runs: offline logging of a tiny run without network, and a resumed run
continuing its W&B run (rewound to the checkpoint) and its TensorBoard curves. The loggers' set-up,
fallbacks and dashboard: tests/unit/training/test_wandb.py."""

import csv
import json
import sys
import time

import pytest

from tests.helpers.common import CONF, compose_cfg

ROOT = CONF.parent


def test_wandb_logger_offline_logs_metrics_samples_and_config(wandb_env, monkeypatch):
    pytest.importorskip("wandb")
    import wandb
    from wandb.sdk.wandb_run import Run

    from diffusion_rl.app.train import train

    # wandb's offline store is a binary log only its service reads back: watch what reaches the run
    logged, seen = [], {}
    real_log, real_finish = Run.log, Run.finish

    def log(self, data, *args, **kwargs):
        logged.append(dict(data))
        return real_log(self, data, *args, **kwargs)

    def finish(self, *args, **kwargs):
        seen.update(config=dict(self.config), summary={k: self.summary[k] for k in self.summary.keys()},
                    mode=self.settings.mode, exit_code=kwargs.get("exit_code"))
        return real_finish(self, *args, **kwargs)

    monkeypatch.setattr(Run, "log", log)
    monkeypatch.setattr(Run, "finish", finish)
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_cfg(["logger=wandb", "objective=stabledrl", "objective.mu=2", "logger.wandb.tags=[test]",
                       "diagnostics.samples_every_n_steps=2"], wandb_env)
    run = wandb_env / "run"
    summary = train(cfg, run)
    assert (run / "metrics.csv").exists()  # CSV rides along
    rows = [r for r in logged if "grad/norm" in r]
    assert [r["trainer/global_step"] for r in rows] == [1, 2, 3, 4]  # one row per optimizer step
    for key in ("grad/norm_ema", "grad/spike", "grad/spikes_total", "weights/ess", "ratio/log_std", "train/loss"):
        assert all(key in r for r in rows), key
    tables = [r for r in logged if "samples/completions" in r]
    assert [r["trainer/global_step"] for r in tables] == [2, 4]
    table = tables[0]["samples/completions"]
    assert list(table.columns) == ["step", "prompt", "completion", "reward"] and len(table.data) >= 1
    assert seen["config"]["objective"]["name"] == "stabledrl"  # the resolved config
    assert seen["config"]["diagnostics"]["samples_every_n_steps"] == 2
    assert seen["summary"]["eval_after/cell_accuracy"] == pytest.approx(summary["after"]["cell_accuracy"])
    assert seen["mode"] == "offline" and seen["exit_code"] == 0
    [offline] = list((run / "wandb").glob("offline-run-*"))
    assert next(offline.glob("run-*.wandb")).stat().st_size > 0
    assert wandb.run is None  # closed: the next job of a multirun starts its own


RESUME = ["task.num_train=6", "objective.mu=1", "trainer.max_steps=8", "trainer.checkpoint_every_n_steps=2"]


def wandb_records(path):
    """The protobuf records of an offline ``run-<id>.wandb`` file (LevelDB log format: 32 KiB blocks
    of records, each a 7-byte header (crc32, length, type: full / first / middle / last) and data)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, parts = path.read_bytes(), 7, b""  # the file opens with a 7-byte W&B header
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # block trailer
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding to the block's end
            pos += left
            continue
        if pos + 7 + length > len(data):  # a record the writer has not finished
            return
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a record ends here
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def offline_run(folder, finished: bool = True):
    """``(run record, {step: {key: value}})`` of one offline run folder. W&B's service process writes
    the file after ``finish()`` returns: a ``finished`` run is read once its exit record is there."""
    path = next(folder.glob("run-*.wandb"))
    deadline = time.time() + 60
    while finished and time.time() < deadline and not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path)):
        time.sleep(0.2)
    run, history = None, {}
    for rec in wandb_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run = rec.run
        elif kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item}
            history[int(items["_step"])] = items
    return run, history


def test_a_resumed_run_rewinds_its_wandb_run_to_the_checkpoint(wandb_env, monkeypatch):
    pytest.importorskip("wandb")
    from diffusion_rl.app.train import train
    from diffusion_rl.training.faults import InjectedFault

    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = wandb_env / "run"
    with pytest.raises(InjectedFault):  # stops after step 5; the checkpoint of step 4 is on disk
        train(compose_cfg([*RESUME, "logger=wandb", "fault=raise", "fault.at_step=5"], wandb_env), run_dir)
    second = int(time.time())
    while int(time.time()) == second:  # W&B names an offline run's folder by the second it started
        time.sleep(0.05)
    train(compose_cfg([*RESUME, "logger=wandb", "ckpt_path=last"], wandb_env), run_dir)
    (run_a, hist_a), (run_b, hist_b) = (offline_run(f) for f in sorted((run_dir / "wandb").glob("offline-run-*")))
    assert run_b.run_id == run_a.run_id  # the same W&B run, continued
    assert (run_b.branch_point.run, run_b.branch_point.metric, run_b.branch_point.value) == (run_a.run_id, "_step", 4)
    assert sorted(hist_a) == [0, 1, 2, 3, 4, 5] and sorted(hist_b) == [5, 6, 7, 8]  # W&B's step = optimizer step
    # what W&B shows once the rewind is applied (at `wandb sync`): the first run up to step 4, then the
    # resumed one: every step once, and each value the one in metrics.csv (itself equal to an
    # uninterrupted run's, tests/e2e/test_resume.py)
    shown = {**{s: h for s, h in hist_a.items() if s <= 4}, **hist_b}
    assert sorted(shown) == list(range(9))
    with open(run_dir / "metrics.csv", newline="") as f:
        csv_norm = {int(r["step"]): float(r["grad/norm"]) for r in csv.DictReader(f) if r["grad/norm"]}
    assert {s: h["grad/norm"] for s, h in shown.items() if "grad/norm" in h} == csv_norm
    assert shown[0]["eval/cell_accuracy"] == pytest.approx(json.loads((run_dir / "summary.json").read_text())["before"]["cell_accuracy"])


def test_a_resumed_run_purges_the_tensorboard_events_after_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from diffusion_rl.app.train import train
    from diffusion_rl.training.faults import InjectedFault

    run_dir = tmp_path / "run"
    with pytest.raises(InjectedFault):
        train(compose_cfg([*RESUME, "logger=tensorboard", "fault=raise", "fault.at_step=5"], tmp_path), run_dir)
    train(compose_cfg([*RESUME, "logger=tensorboard", "ckpt_path=last"], tmp_path), run_dir)
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    norms = [(e.step, e.value) for e in events.Scalars("grad/norm")]
    with open(run_dir / "metrics.csv", newline="") as f:
        csv_norm = [(int(r["step"]), float(r["grad/norm"])) for r in csv.DictReader(f) if r["grad/norm"]]
    assert [s for s, _ in norms] == list(range(1, 9))  # step 5 once: the killed run's is purged
    assert [v for _, v in norms] == pytest.approx([v for _, v in csv_norm], rel=1e-6)


@pytest.mark.slow
def test_a_sigkilled_offline_wandb_run_resumes_as_one_curve(wandb_env):
    """``python src/train.py logger=wandb``, SIGKILLed after step 5 (checkpoint at 4), resumed from ``last``."""
    pytest.importorskip("wandb")
    import os
    import subprocess

    from tests.helpers.common import TINY

    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    common = [sys.executable, str(ROOT / "src" / "train.py"), *TINY, *RESUME, "logger=wandb",
              f"paths.cache_dir={wandb_env / 'cache'}", f"hydra.run.dir={wandb_env / 'run'}"]
    killed = subprocess.run([*common, "fault=kill", "fault.at_step=5"], env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    time.sleep(1.1)  # W&B names an offline run's folder by the second it started
    resumed = subprocess.run([*common, "ckpt_path=last"], env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    folder_a, folder_b = sorted((wandb_env / "run" / "wandb").glob("offline-run-*"))
    (run_a, hist_a), (run_b, hist_b) = offline_run(folder_a, finished=False), offline_run(folder_b)
    # W&B writes an offline run's file every OFFLINE_FLUSH_S seconds: this tiny run was killed well
    # within that, so its file may hold nothing (a real run loses at most the last 2 s of rows)
    ids = {r.run_id for r in (run_a, run_b) if r is not None}
    assert len(ids) == 1 and (run_b.branch_point.run, run_b.branch_point.value) == (run_b.run_id, 4)
    assert sorted(hist_b) == [5, 6, 7, 8]
    shown = [s for s in sorted(hist_a) if s <= 4] + sorted(hist_b)
    assert shown == sorted(set(shown)) and shown[-4:] == [5, 6, 7, 8]  # no step twice
