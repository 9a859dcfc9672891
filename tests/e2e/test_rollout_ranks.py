"""``rollout.worker=ranks`` launched as users launch it: ``torchrun`` starts 1 + R processes of
``src/train.py`` on localhost, rank 0 trains, ranks 1..R sample on a gloo rollout group. The run equals
the in-process worker's (and at staleness 0 the synchronous loop's) bit for bit: every logged metric
and the final weights. A trainer that fails stops the ranks with it, and a resume under torchrun equals
the uninterrupted run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffusion_rl.app.train import train
from diffusion_rl.core.errors import ConfigError
from tests.e2e.test_staleness import PIPELINE_KEYS, RUN, assert_same_run, column
from tests.helpers.common import TINY, compose_cfg

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT / "src")}
# a learning job: the tiny model after 3 supervised steps, so rewards differ within groups and every
# version of the weights samples differently
ARGS = RUN + ["eval.after=false", "trainer.max_steps=5"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], run_dir: Path, nproc: int = 3, nodes: int = 1) -> list[subprocess.CompletedProcess]:
    """``src/train.py`` under torchrun: ``nodes`` launches of ``nproc`` processes each on localhost."""
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc_per_node={nproc}",
           "--master_addr=127.0.0.1", f"--master_port={port}"]
    full = [*TINY, *args, f"hydra.run.dir={run_dir}", f"paths.cache_dir={run_dir.parent / 'cache'}"]
    procs = [subprocess.Popen([*cmd, f"--node_rank={r}", "src/train.py", *full], cwd=ROOT, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(nodes)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        outs.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return outs


def in_process(args: list[str], tmp_path: Path, name: str) -> Path:
    torch.set_num_threads(1)
    train(compose_cfg(args, tmp_path), tmp_path / name)
    return tmp_path / name


def test_two_rollout_ranks_and_a_trainer_run_the_in_process_workers_run(tmp_path):
    args = ARGS + ["rollout.staleness=2"]
    runs = torchrun(args + ["rollout.worker=ranks"], tmp_path / "ranks")
    assert [r.returncode for r in runs] == [0], runs[0].stderr[-3000:]
    # each rank sampled its share: jobs 0, 2, 4, 6 on rank 1 and 1, 3, 5 on rank 2 (5 trained + 2 ahead)
    assert "rollout rank 1 done: 4 jobs" in runs[0].stdout and "rollout rank 2 done: 3 jobs" in runs[0].stdout
    assert column(tmp_path / "ranks", "rollout/staleness") == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert_same_run(tmp_path / "ranks", in_process(args + ["rollout.worker=inline"], tmp_path, "inline"))
    assert len(set(column(tmp_path / "ranks", "train/reward_std"))) > 1  # a job that learns, not a constant one


def test_rollout_ranks_at_staleness_0_run_the_synchronous_loop(tmp_path):
    """One rollout rank samples each batch with the weights the trainer has now: the synchronous run."""
    runs = torchrun(ARGS + ["rollout.worker=ranks"], tmp_path / "ranks", nproc=2)
    assert [r.returncode for r in runs] == [0], runs[0].stderr[-3000:]
    assert column(tmp_path / "ranks", "rollout/staleness") == [0.0] * 5
    assert_same_run(tmp_path / "ranks", in_process(ARGS, tmp_path, "sync"), ignore=PIPELINE_KEYS)


def test_a_two_node_launch_runs_the_in_process_workers_run(tmp_path):
    """``torchrun --nnodes=2 --nproc_per_node=1``: the trainer on one node, the rollout rank on the other,
    new weights pushed every 2 RL steps (batch j samples with those of step 2 * floor((j - 1) / 2))."""
    args = ARGS + ["rollout.staleness=1", "rollout.push_every=2"]
    runs = torchrun(args + ["rollout.worker=ranks"], tmp_path / "ranks", nproc=1, nodes=2)
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:] + runs[1].stderr[-3000:]
    assert (tmp_path / "ranks" / "train_process_1.log").exists()  # the rollout rank logs beside the run
    assert column(tmp_path / "ranks", "rollout/policy_version") == [0.0, 0.0, 0.0, 2.0, 2.0]
    assert column(tmp_path / "ranks", "rollout/staleness") == [0.0, 1.0, 2.0, 1.0, 2.0]
    assert_same_run(tmp_path / "ranks", in_process(args + ["rollout.worker=inline"], tmp_path, "inline"))


@pytest.mark.parametrize("fault", ["raise", "kill"])
def test_a_failed_trainer_ends_the_launch_and_a_resume_under_torchrun_is_exact(tmp_path, fault):
    """``raise``: the trainer's exception sends the ranks home; ``kill``: SIGKILL of the trainer, and
    torchrun stops the ranks. Either way the launch ends, and resuming from the step-2 checkpoint (which
    holds the 2 batches sampled ahead) gives the uninterrupted run."""
    args = ARGS + ["rollout.staleness=2", "rollout.worker=ranks"]
    failed = torchrun(args + [f"fault={fault}", "fault.at_step=3"], tmp_path / "b")
    assert failed[0].returncode != 0 and not (tmp_path / "b" / "summary.json").exists()
    if fault == "raise":
        assert "InjectedFault" in failed[0].stderr
        assert "rollout rank 1 done" in failed[0].stdout  # the ranks returned: the launch did not hang on them
    resumed = torchrun(args + ["ckpt_path=last"], tmp_path / "b")
    assert [r.returncode for r in resumed] == [0], resumed[0].stderr[-3000:]
    assert_same_run(tmp_path / "b", in_process(ARGS + ["rollout.staleness=2", "rollout.worker=inline"], tmp_path, "a"))


def test_ranks_outside_a_launch_are_refused_in_one_line(tmp_path, monkeypatch):
    for key in ("TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_STEP_ID"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match="takes a torchrun or srun launch of 1 \\+ R processes"):
        train(compose_cfg(ARGS + ["rollout.worker=ranks"], tmp_path), tmp_path / "r")
