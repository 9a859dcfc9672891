"""The bounded-staleness schedule (``training/async_rollout.py``): job ``j`` is sampled with the weights
of RL step ``max(0, j - k)``, whichever backend runs the worker, checked against the rollout engine
run directly with those weights."""

import copy

import pytest
import torch

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rl.rollout import RolloutConfig, RolloutEngine
from diffusion_rl.training.async_rollout import (
    RolloutPipeline,
    WeightSlots,
    load_tensors,
    trainable_tensors,
)
from tests.helpers.common import compose_cfg


def snapshot(net):
    return {n: t.detach().clone() for n, t in trainable_tensors(net).items()}


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    torch.manual_seed(0)
    return build(compose_cfg(["task.prompts_per_batch=2", "task.group_size=4"], tmp_path_factory.mktemp("c")))


@pytest.mark.parametrize("worker,k,stop_at", [("inline", 1, None), ("inline", 2, None), ("process", 1, None),
                                               ("process", 2, None), ("process", 2, 3)])
def test_each_job_is_sampled_with_the_weights_of_step_j_minus_k(parts, worker, k, stop_at):
    """``stop_at``: the worker is stopped before that batch (as after a failed fit) and the pipeline goes
    on: the jobs it had not returned are sampled again, by a new worker, with their own weights."""
    c = parts
    engine = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=3)
    policy = copy.deepcopy(c.bundle.net)
    versions = [snapshot(policy)]  # version v: the weights after v RL steps
    batches = [c.task.splits.train[2 * j:2 * j + 2] for j in range(k + 4)]
    pipe = RolloutPipeline(engine, k, worker, threads=torch.get_num_threads())
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
    assert [d.job for d, _ in taken] == list(range(len(batches) - k))
    net = copy.deepcopy(c.bundle.net)
    differs = 0
    for done, metrics in taken:
        j = done.job
        assert done.version == max(0, j - k)
        assert metrics["rollout/staleness"] == min(j, k) <= k
        assert metrics["rollout/queue_len"] == k
        load_tensors(net, versions[done.version])
        want = engine(batches[j], net, j)
        assert torch.equal(done.rollout.completion_ids, want.completion_ids), j
        assert torch.equal(done.rollout.advantages, want.advantages), j
        load_tensors(net, versions[done.version + 1])  # the next version's weights sample otherwise
        differs += not torch.equal(engine(batches[j], net, j).completion_ids, want.completion_ids)
    assert differs >= len(taken) - 1


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


@pytest.mark.parametrize("field,value,match", [("staleness", -1, "must be >= 0"), ("worker", "thread", "allowed: process, inline"),
                                               ("worker_threads", -2, "must be >= 0")])
def test_bad_rollout_pipeline_settings_are_refused(field, value, match):
    with pytest.raises(ConfigError, match=match):
        RolloutConfig(**{field: value}).validate()
