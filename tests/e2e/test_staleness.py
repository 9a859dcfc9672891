"""``rollout.staleness=k`` end to end: the pipeline at staleness 0 is the synchronous run bit for bit,
each batch trains ``min(j, k)`` RL steps after the weights that sampled it, the worker process and the
in-process worker give the same run, and a run stopped and resumed equals an uninterrupted one (after
SIGKILL: ``tests/e2e/test_resume.py``'s slow test)."""

import csv
import multiprocessing
from pathlib import Path

import pytest
import torch

from diffusion_rl.app.train import train
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.training import module as module_mod
from diffusion_rl.training.async_rollout import RolloutPipeline
from diffusion_rl.training.checkpoint import resolve_checkpoint
from diffusion_rl.training.faults import InjectedFault
from tests.helpers.common import compose_cfg

# 6 training items in batches of 2 (3 batches an epoch), one update per batch, a checkpoint every 2
RUN = ["task.num_train=6", "objective.mu=1", "trainer.max_steps=6", "trainer.checkpoint_every_n_steps=2",
       "eval.before=false", "eval.every_n_steps=0", "diagnostics.samples_every_n_steps=0", "trainer.threads=1",
       "rollout.worker_threads=1"]
PIPELINE_KEYS = ("rollout/staleness", "rollout/policy_version", "rollout/queue_len")


def rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: v for k, v in r.items() if v != "" and not k.startswith(("time/", "throughput/"))}
                for r in csv.DictReader(f)]


def column(run_dir: Path, key: str) -> list[float]:
    return [float(r[key]) for r in rows(run_dir) if key in r]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def assert_same_run(a: Path, b: Path, ignore: tuple[str, ...] = ()) -> None:
    ra, rb = rows(a), rows(b)
    assert len(ra) == len(rb) and ra
    for x, y in zip(ra, rb):
        assert {k: v for k, v in x.items() if k not in ignore} == {k: v for k, v in y.items() if k not in ignore}, x["step"]
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


@pytest.mark.parametrize("objective", ["grpo", "stabledrl"])
def test_the_pipeline_at_staleness_0_is_the_synchronous_run(tmp_path, monkeypatch, objective):
    """The worker process, the weight slots and the old policy loaded from them, with no staleness,
    reproduce the synchronous loop exactly (the config's staleness 0 runs that loop itself)."""
    torch.set_num_threads(1)
    args = RUN + [f"objective={objective}", "objective.mu=2", "trainer.max_steps=4"]
    train(compose_cfg(args, tmp_path), tmp_path / "sync")
    real_init = module_mod.DiffusionRLModule.__init__

    def with_pipeline(self, *a, **kw):
        real_init(self, *a, **kw)
        self.pipeline = RolloutPipeline(self.rollouts, 0, "process", threads=1)

    monkeypatch.setattr(module_mod.DiffusionRLModule, "__init__", with_pipeline)
    train(compose_cfg(args, tmp_path), tmp_path / "piped")
    assert column(tmp_path / "piped", "rollout/staleness") == [0.0, 0.0]
    assert_same_run(tmp_path / "sync", tmp_path / "piped", ignore=PIPELINE_KEYS)


@pytest.mark.parametrize("k", [1, 2])
def test_batch_j_trains_min_j_k_steps_after_its_weights_and_both_workers_agree(tmp_path, k):
    torch.set_num_threads(1)
    args = RUN + [f"rollout.staleness={k}", "eval.after=false"]
    summary = train(compose_cfg(args + ["rollout.worker=process"], tmp_path), tmp_path / "process")
    assert summary["optimizer_steps"] == 6 and summary["rollouts"] == 6 + k  # k batches sampled, never trained
    assert column(tmp_path / "process", "rollout/staleness") == [float(min(j, k)) for j in range(6)]
    assert column(tmp_path / "process", "rollout/policy_version") == [float(max(0, j - k)) for j in range(6)]
    train(compose_cfg(args + ["rollout.worker=inline"], tmp_path), tmp_path / "inline")
    assert_same_run(tmp_path / "process", tmp_path / "inline")
    sync = tmp_path / "sync"
    train(compose_cfg(RUN + ["eval.after=false"], tmp_path), sync)
    stale = column(tmp_path / "process", "train/loss")
    assert stale[0] == column(sync, "train/loss")[0]  # batch 0 is sampled with the start weights either way
    assert stale[1:] != column(sync, "train/loss")[1:]


@pytest.mark.parametrize("objective", ["grpo", "stabledrl"])
def test_the_old_policy_of_a_stale_batch_is_the_weights_that_sampled_it(tmp_path, monkeypatch, objective):
    """Batch ``j`` trains with the policy's weights of RL step ``j`` against an old policy holding those of
    step ``max(0, j - 2)``: the old policy's parameters are checked against the policy's own at that step,
    and the ratio (on masks shared with the old policy) is exactly 1 at the first update only where the two
    are the same weights (batch 0)."""
    torch.set_num_threads(1)
    seen = []  # per trained batch: (the policy's weights, the old policy's weights) as the updates begin
    real_updates = module_mod.DiffusionRLModule._updates

    def spy(self, ctx):
        snap = lambda net: [p.detach().clone() for p in net.parameters()]
        seen.append((snap(self.policy), snap(self.old_policy)))
        return real_updates(self, ctx)

    monkeypatch.setattr(module_mod.DiffusionRLModule, "_updates", spy)
    args = RUN + [f"objective={objective}", "objective.share_masks_with_old=true", "rollout.staleness=2",
                  "rollout.worker=inline", "trainer.max_steps=5", "eval.after=false", "trainer.checkpoint_every_n_steps=0"]
    train(compose_cfg(args, tmp_path), tmp_path / "run")
    assert len(seen) == 5
    for j, (_, old) in enumerate(seen):
        policy_then = seen[max(0, j - 2)][0]
        assert all(torch.equal(a, b) for a, b in zip(old, policy_then)), j
    log_std = column(tmp_path / "run", "ratio/log_std")
    assert log_std[0] == 0.0 and all(v > 0 for v in log_std[1:]), log_std


@pytest.mark.parametrize("at_step", [3, 4])
def test_resume_with_staleness_is_exact(tmp_path, at_step):
    """Stopped by an exception after a checkpoint, resumed from it: the jobs sampled ahead are sampled
    again from the checkpoint's weights, and the run equals the uninterrupted one."""
    torch.set_num_threads(1)
    args = RUN + ["rollout.staleness=2", "eval.after=false"]
    train(compose_cfg(args, tmp_path), tmp_path / "a")
    with pytest.raises(InjectedFault):
        train(compose_cfg(args + ["fault=raise", f"fault.at_step={at_step}"], tmp_path), tmp_path / "b")
    assert not [p for p in multiprocessing.active_children() if p.name == "rollout-worker"]  # stopped on the error too
    ckpt = torch.load(resolve_checkpoint("last", tmp_path / "b").path, weights_only=True)
    pending = ckpt["rl_state"]["pipeline"]["pending"]
    assert [p["job"] for p in pending] == [ckpt["global_step"] + 0, ckpt["global_step"] + 1]
    train(compose_cfg(args + ["ckpt_path=last"], tmp_path), tmp_path / "b")
    assert_same_run(tmp_path / "a", tmp_path / "b")


@pytest.mark.parametrize("extra,match", [(["old_policy=precomputed"], "takes old_policy=copy"),
                                         (["trainer.strategy=ddp"], "rollout.staleness=1 is invalid: trains in one process"),
                                         (["trainer.devices=2"], "rollout.staleness=1 is invalid: trains in one process"),
                                         (["rollout.staleness=0", "rollout.worker=ranks", "trainer.devices=2"],
                                          "rollout.worker='ranks' is invalid: trains in one process")])
def test_staleness_refuses_what_it_cannot_run_before_any_work(tmp_path, extra, match):
    with pytest.raises(ConfigError, match=match):
        train(compose_cfg(RUN + ["rollout.staleness=1", *extra], tmp_path), tmp_path / "r")
    assert not (tmp_path / "cache").exists()  # refused before the warm start


@pytest.mark.parametrize("objective", ["egspo_sa", "dtreerpo", "igpo"])
def test_every_kind_of_rollout_crosses_to_the_trainer_whole(tmp_path, objective):
    """A recorded trajectory with one-step values (EGSPO-SA), tree rollouts (d-TreeRPO) and rows the
    objective revised with the worker's sampler (IGPO) come out of the worker process as the in-process
    worker makes them: the same run."""
    torch.set_num_threads(1)
    args = RUN + [f"objective={objective}", "rollout.staleness=1", "trainer.max_steps=2", "eval.after=false",
                  "trainer.checkpoint_every_n_steps=0"]
    extra = {"egspo_sa": ["objective.K=2"], "dtreerpo": [], "igpo": ["task.pin_givens=false"]}[objective]
    for worker in ("process", "inline"):
        train(compose_cfg(args + extra + [f"rollout.worker={worker}"], tmp_path), tmp_path / worker)
    assert column(tmp_path / "process", "rollout/staleness") == [0.0, 1.0]
    ra, rb = rows(tmp_path / "process"), rows(tmp_path / "inline")
    assert ra == rb and len(ra) == 2
