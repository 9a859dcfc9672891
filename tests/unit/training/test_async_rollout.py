"""The bounded-staleness schedule (``training/async_rollout.py``): job ``j`` is sampled with the weights
of RL step ``max(0, j - k)``, whichever backend runs the worker, checked against the rollout engine
run directly with those weights."""

import copy
import datetime
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rl.rollout import RolloutConfig, RolloutEngine
from diffusion_rl.training.async_rollout import (
    RolloutPipeline,
    WeightSlots,
    load_tensors,
    replace_net,
    trainable_tensors,
)
from diffusion_rl.training.rollout_ranks import RolloutGroup, launch_place, serve_rollout_rank
from tests.helpers.common import compose_cfg


def snapshot(net):
    return {n: t.detach().clone() for n, t in trainable_tensors(net).items()}


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    torch.manual_seed(0)
    return build(compose_cfg(["task.prompts_per_batch=2", "task.group_size=4"], tmp_path_factory.mktemp("c")))


def _rollout_rank(rank: int, size: int, store_path: str, engine: RolloutEngine, threads: int) -> None:
    # a network of its own: spawn hands every child the same shared-memory tensors, where a launch's
    # ranks each build one
    engine = replace_net(engine, copy.deepcopy(engine.bundle.net))
    group = RolloutGroup(dist.ProcessGroupGloo(dist.FileStore(store_path, size), rank, size,
                                               datetime.timedelta(seconds=120)), rank, size)
    serve_rollout_rank(group, engine, None, threads)


@contextmanager
def rollout_ranks(engine: RolloutEngine, ranks: int, tmp_path) -> Iterator[RolloutGroup]:
    """This process as rank 0 of a gloo rollout group, with ``ranks`` rollout ranks in spawned processes;
    each builds nothing: it gets a copy of ``engine`` with a network of other weights, so the state the
    trainer sends is what it samples with."""
    size, store = ranks + 1, str(tmp_path / "store")
    other = copy.deepcopy(engine.bundle.net)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rollout_rank, args=(r, size, store, replace_net(engine, other), torch.get_num_threads()))
             for r in range(1, size)]
    for p in procs:
        p.start()
    group = RolloutGroup(dist.ProcessGroupGloo(dist.FileStore(store, size), 0, size, datetime.timedelta(seconds=120)),
                         0, size)
    try:
        yield group
    finally:
        group.exit()
        for p in procs:
            p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * ranks


@pytest.mark.parametrize("worker,k,stop_at,every", [("inline", 1, None, 1), ("inline", 2, None, 1), ("process", 1, None, 1),
                                                     ("process", 2, None, 1), ("process", 2, 3, 1), ("ranks", 1, None, 1),
                                                     ("ranks", 2, 3, 1), ("inline", 1, None, 2), ("process", 2, 4, 3),
                                                     ("ranks", 0, None, 2)])
def test_each_job_is_sampled_with_the_weights_of_step_j_minus_k(parts, worker, k, stop_at, every, tmp_path):
    """``stop_at``: the worker is stopped before that batch (as after a failed fit) and the pipeline goes
    on: the jobs it had not returned are sampled again, by a new worker, with their own weights. With
    rollout ranks (two of them), the ranks are reset and sent the trainer's state again. ``every``: the
    weights are pushed every that many RL steps, so job ``j`` samples with the newest multiple of it."""
    c = parts
    engine = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=3)
    with rollout_ranks(engine, 2, tmp_path) if worker == "ranks" else nullcontext() as group:
        taken, batches, versions = run_schedule(engine, worker, k, stop_at, group, every)
    assert [d.job for d, _ in taken] == list(range(len(batches) - k))
    net = copy.deepcopy(c.bundle.net)
    differs = 0
    for done, metrics in taken:
        j = done.job
        assert done.version == max(0, j - k) // every * every
        assert metrics["rollout/staleness"] == j - done.version <= k + every - 1
        assert metrics["rollout/queue_len"] == k
        load_tensors(net, versions[done.version])
        want = engine(batches[j], net, j)
        assert torch.equal(done.rollout.completion_ids, want.completion_ids), j
        assert torch.equal(done.rollout.advantages, want.advantages), j
        load_tensors(net, versions[done.version + 1])  # the next version's weights sample otherwise
        differs += not torch.equal(engine(batches[j], net, j).completion_ids, want.completion_ids)
    assert differs >= len(taken) - 1


def run_schedule(engine: RolloutEngine, worker: str, k: int, stop_at: int | None, group: RolloutGroup | None,
                 every: int = 1):
    """The trainer's side of ``k + 4`` batches, each RL step a large random change of the weights:
    (the jobs taken with their metrics, the batches, the weights of each version)."""
    policy = copy.deepcopy(engine.bundle.net)
    versions = [snapshot(policy)]  # version v: the weights after v RL steps
    batches = [engine.task.splits.train[2 * j:2 * j + 2] for j in range(k + 4 + every)]
    pipe = RolloutPipeline(engine, k, worker, threads=torch.get_num_threads(), group=group, push_every=every)
    taken = []
    try:
        for j, items in enumerate(batches):
            if j == stop_at:
                pipe.close()
            out = pipe.step(j, items, policy)
            if out is None:
                assert j < k  # the first k batches fill the pipeline
                continue
            done, metrics = out
            taken.append((done, metrics))
            with torch.no_grad():  # an RL step: a large change, so that each version samples differently
                gen = torch.Generator().manual_seed(j)
                for p in trainable_tensors(policy).values():
                    p.add_(torch.randn(p.shape, generator=gen) * 0.5)
            pipe.finish_step()
            versions.append(snapshot(policy))
    finally:
        pipe.close()
    return taken, batches, versions


def test_a_version_overwritten_in_its_slot_is_refused(parts):
    slots = WeightSlots(parts.bundle.net, 2)
    tensors = snapshot(parts.bundle.net)
    slots.write(0, tensors)
    slots.write(2, tensors)  # slot 0 again
    with pytest.raises(RuntimeError, match="version 0 were overwritten"):
        slots.read(0)
    assert slots.read(2)


def test_a_worker_failure_reaches_the_trainer_with_its_traceback(parts, monkeypatch):
    c = parts
    engine = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=3)
    pipe = RolloutPipeline(engine, 1, "process", threads=1)
    bad = [{"no": "such item"}]  # the task cannot build a prompt from it: the worker raises
    try:
        assert pipe.step(0, bad, c.bundle.net) is None
        with pytest.raises(RuntimeError, match="the rollout worker failed:(.|\n)*Traceback"):
            pipe.step(1, bad, c.bundle.net)
    finally:
        pipe.close()


def test_a_rollout_rank_failure_reaches_the_trainer_and_the_rank_serves_on(parts, tmp_path):
    c = parts
    engine = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=3)
    with rollout_ranks(engine, 1, tmp_path) as group:
        pipe = RolloutPipeline(engine, 0, "ranks", group=group)
        try:
            with pytest.raises(RuntimeError, match="rollout rank 1 failed on job 0:(.|\n)*Traceback"):
                pipe.step(0, [{"no": "such item"}], c.bundle.net)
            done, _ = pipe.step(1, c.task.splits.train[:2], c.bundle.net)  # the same rank, the next job
            assert done.job == 1 and done.rollout.completion_ids.shape[0] == 2 * c.task.cfg.group_size
        finally:
            pipe.close()


def test_the_rollout_group_meets_where_torchrun_or_srun_says():
    launcher = ("TORCHELASTIC_RUN_ID", "RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_PROCID", "SLURM_JOB_NAME")
    plain = {k: v for k, v in os.environ.items() if k not in launcher}
    with mock.patch.dict(os.environ, plain, clear=True):  # restored whole: Lightning sets MASTER_* as it reads them
        assert launch_place() is None  # a plain process
        torchrun = {"TORCHELASTIC_RUN_ID": "x", "RANK": "2", "GROUP_RANK": "1", "LOCAL_RANK": "0",
                    "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
        os.environ.update(torchrun)
        assert launch_place() == ("env://", 2, 3)  # torchrun's store, from MASTER_ADDR and MASTER_PORT
        os.environ["WORLD_SIZE"] = "1"
        assert launch_place() is None  # one process: nobody to sample for it
        for key in torchrun:
            del os.environ[key]
        os.environ.update({"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
                           "SLURM_NODEID": "0", "SLURM_JOB_ID": "4321987", "SLURM_JOB_NAME": "diffusion-rl",
                           "SLURM_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[07-08]"})
        assert launch_place() == ("tcp://gpu07:16987", 1, 4)  # the first node; the port from the job id


@pytest.mark.parametrize("field,value,match", [("staleness", -1, "must be >= 0"),
                                               ("worker", "thread", "allowed: process, inline, ranks"),
                                               ("worker_threads", -2, "must be >= 0"),
                                               ("push_every", 0, "must be >= 1"),
                                               ("push_every", 2, "takes rollout.staleness >= 1")])
def test_bad_rollout_pipeline_settings_are_refused(field, value, match):
    with pytest.raises(ConfigError, match=match):
        RolloutConfig(**{field: value}).validate()
