"""Rollouts that do not wait for training: bounded staleness (``rollout.staleness=k``, k >= 1).

The schedule is fixed, not timed: which weights sample which batch does not depend on how fast
either side runs. At training batch ``r`` the trainer

1. writes its trainable weights as version ``V`` (the RL steps trained so far) when ``V`` is new,
2. submits job ``r`` (batch ``r``'s task items) to be sampled with version ``V``,
3. from batch ``k`` on, takes job ``r - k``'s rollout and trains on it (before that it trains on nothing).

So job ``j`` is sampled with version ``max(0, j - k)`` and trained when the policy is version ``j``:
its staleness is ``min(j, k)`` RL steps (``mu`` optimizer steps each), never more; the sampler runs
job ``r`` while the trainer trains on job ``r - k``. Staleness 0 is the synchronous loop itself
(``DiffusionRLModule`` does not build this pipeline then); a pipeline built at 0 runs in lockstep, which
the tests use to check the worker, the slots and the old policy against that loop.

``rollout.push_every=n`` sends the worker new weights every ``n`` RL steps only (for a large network
whose push costs more than a little staleness): version ``V`` is then the newest multiple of ``n``,
job ``j`` is sampled with ``n * floor(max(0, j - k) / n)`` and its staleness is at most ``k + n - 1``.

The old policy of the objectives is the policy that sampled the job: the module loads the job's
version into its frozen copy before the job's updates (``old_policy=copy``), so the ratios are against
the generating weights and the objective's clipping truncates them as in the synchronous loop.

The sampler runs in a worker, :class:`RolloutWorker`, which owns a copy of the network and the
rollout engine (``rl/rollout.py``: sampling, rewards, advantages). Three backends run it:
``rollout.worker=process`` (a ``torch.multiprocessing`` spawn process with ``rollout.worker_threads``
intra-op threads; tensors travel through shared memory), ``rollout.worker=ranks`` (ranks ``1..R`` of
a torchrun or srun launch, on a gloo process group of their own: ``training/rollout_ranks.py``) and
``rollout.worker=inline`` (the same worker called in the trainer's process: no overlap, the reference
the other two must equal bit for bit at equal thread counts). Weights travel through ``k + 1`` shared-memory slots, version ``V`` in slot
``V mod (k + 1)``: the trainer overwrites a slot only after the worker returned the last job that read
it (job ``V - 1`` reads version ``V - k - 1``, and was trained one batch before ``V`` is written).

A checkpoint holds the jobs submitted and not trained (their items and versions) and the weights of
those versions (:meth:`RolloutPipeline.state`); a resume samples them again, and since every row's
noise is keyed by the run seed, the job and the row (``sampling/noise.py``), they come out as they
were: nothing is lost or repeated.
"""

from __future__ import annotations

import copy
import os
import queue
import time
import traceback
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
import torch.multiprocessing as mp
from torch import nn

from diffusion_rl.rl.batch import Rollout
from diffusion_rl.rl.rollout import RolloutEngine


def trainable_tensors(net: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors that change in training (the weights a rollout worker must be sent)."""
    return {name: p for name, p in net.named_parameters() if p.requires_grad}


class WeightSlots:
    """``k + 1`` copies of the trainable tensors, version ``V`` (a multiple of ``every``, the push
    interval) in slot ``(V / every) mod (k + 1)``, in shared memory when a process reads them."""

    def __init__(self, net: nn.Module, count: int, every: int = 1):
        self.every = every
        self.slots = [{n: t.detach().to("cpu", copy=True) for n, t in trainable_tensors(net).items()}
                      for _ in range(count)]
        self.versions = [-1] * count  # the version each slot holds (the trainer's view)

    def share(self) -> None:
        for slot in self.slots:
            for t in slot.values():
                t.share_memory_()

    def index(self, version: int) -> int:
        """The slot of version ``version``."""
        return version // self.every % len(self.slots)

    def holds(self, version: int) -> bool:
        return self.versions[self.index(version)] == version

    def write(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        i = self.index(version)
        with torch.no_grad():
            for name, t in self.slots[i].items():
                t.copy_(tensors[name].detach())
        self.versions[i] = version

    def read(self, version: int) -> dict[str, torch.Tensor]:
        i = self.index(version)
        if self.versions[i] != version:
            raise RuntimeError(f"weights of version {version} were overwritten (slot {i} holds {self.versions[i]})")
        return self.slots[i]

    def load_into(self, version: int, net: nn.Module) -> None:
        load_tensors(net, self.read(version))


def load_tensors(net: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    params = dict(net.named_parameters())
    with torch.no_grad():
        for name, t in tensors.items():
            params[name].copy_(t)


@dataclass
class Job:
    job: int  # the rollout id (the batch index)
    version: int  # the weights it is sampled with
    items: list[dict[str, Any]]


@dataclass
class Done:
    job: int
    version: int
    rollout: Rollout
    reward_failures: int  # the rewards that failed in this job (the task's count went up by it)
    busy_s: float  # the job's sampling and scoring time
    idle_s: float  # the worker's wait for this job after the previous one


class RolloutWorker:
    """Samples and scores jobs with its own network, loading each job's version from the slots."""

    def __init__(self, engine: RolloutEngine, slots: WeightSlots, device: torch.device | None = None):
        self.engine, self.slots = engine, slots
        self.net = engine.bundle.net
        self.device = device  # where the network samples; None: where it is
        self.loaded = -1
        self.last_end: float | None = None

    def run(self, job: Job) -> Done:
        start = time.perf_counter()
        idle = 0.0 if self.last_end is None else start - self.last_end
        if job.version != self.loaded:
            # unchecked: in a worker process the slots' ``versions`` are the trainer's view at start-up
            load_tensors(self.net, self.slots.slots[self.slots.index(job.version)])
            self.loaded = job.version
        failures = int(getattr(self.engine.task, "reward_failures", 0))
        ro = self.engine(job.items, self.net, job.job)
        self.last_end = time.perf_counter()
        failures = int(getattr(self.engine.task, "reward_failures", 0)) - failures
        return Done(job.job, job.version, ro, failures, self.last_end - start, idle)


def _serve(worker: RolloutWorker, inbox: Any, outbox: Any, threads: int) -> None:
    """The worker process: jobs in, results out, until ``None`` or the trainer's process is gone."""
    if threads:
        torch.set_num_threads(threads)
    if worker.device is not None:  # it came through the pipe on the CPU (see RolloutPipeline._start)
        worker.net.to(worker.device)
    parent = os.getppid()
    while True:
        try:
            job = inbox.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the trainer died (SIGKILL): nobody will read what we sample
                return
            continue
        if job is None:
            return
        try:
            outbox.put(("done", worker.run(job)))
        except BaseException:  # noqa: BLE001 - the trainer raises it, with this traceback
            outbox.put(("error", traceback.format_exc()))
            return


class InlineBackend:
    """The worker in the trainer's process, run at submission: the reference for the process backend."""

    def __init__(self, worker: RolloutWorker):
        self.worker = worker
        self.done: deque[Done] = deque()

    def submit(self, job: Job) -> None:
        self.done.append(self.worker.run(job))

    def take(self) -> Done:
        return self.done.popleft()

    def close(self) -> None:
        self.done.clear()


class ProcessBackend:
    """The worker in a spawned process; results come back in submission order."""

    def __init__(self, worker: RolloutWorker, threads: int):
        ctx = mp.get_context("spawn")
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        worker.slots.share()
        self.proc = ctx.Process(target=_serve, args=(worker, self.inbox, self.outbox, threads), daemon=True,
                                name="rollout-worker")
        with spawn_start_method():
            self.proc.start()

    def submit(self, job: Job) -> None:
        self.inbox.put(job)

    def take(self) -> Done:
        while True:
            try:
                kind, value = self.outbox.get(timeout=1.0)
            except queue.Empty:
                if not self.proc.is_alive():
                    raise RuntimeError(f"the rollout worker process died (exit code {self.proc.exitcode})") from None
                continue
            if kind == "error":
                raise RuntimeError(f"the rollout worker failed:\n{value}")
            return value

    def close(self) -> None:
        if self.proc.is_alive():
            self.inbox.put(None)
            self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class Backend(Protocol):
    """Where the worker runs: jobs in (:meth:`submit`), results out in submission order (:meth:`take`)."""

    def submit(self, job: Job) -> None: ...

    def take(self) -> Done: ...

    def close(self) -> None: ...


class RemoteWorkers(Protocol):
    """Workers in other processes of the launch (``training/rollout_ranks.py``'s rollout group)."""

    def backend(self, slots: WeightSlots, policy: nn.Module) -> Backend: ...


@contextmanager
def spawn_start_method() -> Iterator[None]:
    """Python's spawn hands the child the parent's global start method, which the child then sets: inside
    a joblib (loky) worker of a Hydra multirun that is ``loky``, which a fresh interpreter does not know,
    and the child dies before running anything. ``spawn`` while the child starts, the caller's after."""
    before = mp.get_start_method(allow_none=True)
    mp.set_start_method("spawn", force=True)
    try:
        yield
    finally:
        mp.set_start_method(before, force=True)


class RolloutPipeline:
    """The trainer's side of the schedule (see the module docstring): :meth:`step` per training batch."""

    def __init__(self, engine: RolloutEngine, staleness: int, worker: str = "process", threads: int = 1,
                 group: RemoteWorkers | None = None, push_every: int = 1):
        if staleness < 0 or push_every < 1:
            raise ValueError(f"staleness must be >= 0 and push_every >= 1, not {staleness} and {push_every}")
        if (worker == "ranks") != (group is not None):
            raise ValueError("rollout.worker=ranks takes the rollout group of the launch, and only it does")
        self.engine, self.k, self.kind, self.threads, self.group = engine, staleness, worker, threads, group
        self.every = push_every
        self.slots = WeightSlots(engine.bundle.net, staleness + 1, push_every)
        self.trained = 0  # RL steps trained: the version of the weights now
        self.pending: deque[Job] = deque()  # submitted, not trained, in order
        self.backend: Backend | None = None
        self.resubmit: list[Job] = []  # restored from a checkpoint: sampled again before the next job

    def _start(self, policy: nn.Module) -> None:
        if self.group is not None:  # rollout ranks: they hold their own networks and receive its state
            self.backend = self.group.backend(self.slots, policy)
            self._resubmit()
            return
        # the worker's own copy, never the policy's storage; a process gets it on the CPU (CUDA tensors
        # sent to another process stay owned by the sender) and moves it to the policy's device itself
        net = copy.deepcopy(policy).requires_grad_(False).eval()
        if self.kind == "inline":
            self.backend = InlineBackend(RolloutWorker(replace_net(self.engine, net), self.slots))
        else:
            device = next(policy.parameters()).device
            worker = RolloutWorker(replace_net(self.engine, net.cpu()), self.slots, device)
            self.backend = ProcessBackend(worker, self.threads)
        self._resubmit()

    def _resubmit(self) -> None:
        assert self.backend is not None
        for job in self.resubmit:
            self.backend.submit(job)
        self.resubmit = []

    def step(self, job_id: int, items: list[dict[str, Any]], policy: nn.Module) -> tuple[Done, dict[str, float]] | None:
        """Submit batch ``job_id`` and return the job to train on now with its metrics, or None while
        the first ``k`` jobs fill the pipeline."""
        version = self.trained - self.trained % self.every  # the newest weights pushed
        if not self.slots.holds(version):
            self.slots.write(version, trainable_tensors(policy))
        if self.backend is None:
            self._start(policy)
        assert self.backend is not None
        job = Job(job_id, version, items)
        self.backend.submit(job)
        self.pending.append(job)
        if len(self.pending) <= self.k:
            return None
        expected = self.pending.popleft()
        t0 = time.perf_counter()
        done = self.backend.take()
        wait = time.perf_counter() - t0
        if done.job != expected.job:
            raise RuntimeError(f"the rollout worker returned job {done.job}, expected {expected.job}")
        gap = self.trained - done.version
        if not 0 <= gap <= self.bound:
            raise RuntimeError(f"job {done.job} was sampled {gap} RL steps ago, beyond rollout.staleness={self.k} "
                               f"(+ rollout.push_every={self.every} - 1)")
        metrics = {"rollout/staleness": float(gap), "rollout/policy_version": float(done.version),
                   "rollout/queue_len": float(len(self.pending)), "time/trainer_wait_s": wait,
                   "time/worker_busy_s": done.busy_s, "time/worker_idle_s": done.idle_s}
        return done, metrics

    @property
    def bound(self) -> int:
        """The most RL steps a job's weights can lag the policy's: ``k``, plus ``n - 1`` when the weights
        are pushed every ``n`` steps."""
        return self.k + self.every - 1

    def finish_step(self) -> None:
        """The trainer trained on the job :meth:`step` returned: the weights are one version newer."""
        self.trained += 1

    def load_version(self, version: int, net: nn.Module) -> None:
        self.slots.load_into(version, net)

    # ---- checkpoints --------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Plain data for a checkpoint: the jobs not trained and the weights of their versions."""
        versions = sorted({job.version for job in self.pending})
        return {"trained": self.trained,
                "pending": [{"job": j.job, "version": j.version, "items": j.items} for j in self.pending],
                "weights": {v: {n: t.clone() for n, t in self.slots.read(v).items()} for v in versions}}

    def load_state(self, state: dict[str, Any]) -> None:
        self.close()
        self.trained = int(state["trained"])
        self.pending = deque(Job(int(p["job"]), int(p["version"]), list(p["items"])) for p in state["pending"])
        self.slots.versions = [-1] * len(self.slots.slots)
        for version, tensors in state["weights"].items():
            self.slots.write(int(version), tensors)
        self.resubmit = list(self.pending)

    def close(self) -> None:
        """Stop the worker; the jobs not trained are sampled again if the pipeline goes on."""
        if self.backend is not None:
            self.backend.close()
            self.backend = None
            self.resubmit = list(self.pending)


def replace_net(engine: RolloutEngine, net: nn.Module) -> RolloutEngine:
    """The same engine sampling with ``net``, counting its reward failures apart (the trainer adds each
    job's count when it trains on the job)."""
    clone = copy.copy(engine)
    clone.bundle = replace(engine.bundle, net=net)
    clone.task = copy.copy(engine.task)
    return clone
