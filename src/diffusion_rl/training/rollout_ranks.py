"""Rollout workers as ranks of their own (``rollout.worker=ranks``): a torchrun or SLURM launch of
``1 + R`` processes in which rank 0 trains and ranks ``1..R`` sample.

The ranks form a rollout group, a gloo process group of their own over the launch's rendezvous
(torchrun's store, or SLURM's first node as Lightning finds it). It is not torch.distributed's
default group: the trainer is one process to Lightning (the training group has one rank), so nothing
of Lightning's or ours that looks for a default group mistakes the rollout ranks for data-parallel
peers. The schedule is :class:`~diffusion_rl.training.async_rollout.RolloutPipeline`'s, unchanged:
job ``j`` goes to rollout rank ``1 + j mod R`` with the weights of RL step ``max(0, j - k)``, so a run
samples the same rollouts whichever worker backend runs them and however many ranks there are.

Messages go from the trainer to a rollout rank and back, in an order both sides know from the
schedule, so neither side polls: a rank serves what arrives in order, and the trainer receives
job ``j``'s result from its rank when it trains on it. Each message is a header (kind, job, version,
payload bytes) and its payload, ``torch.save``'d. The trainer's sends do not block (the rank may be
sampling); receives do.

1. ``STATE`` (once per start): every parameter and buffer of the policy, so frozen weights (a LoRA
   base) and the warm start reach the rank as they are in the trainer, whatever the rank loaded.
2. ``WEIGHTS`` before a job whose version the rank does not hold: the trainable tensors of that version.
3. ``JOB``: the task items; the rank answers ``DONE`` with the scored rollout, or ``ERROR`` with
   its traceback (and goes on serving).
4. ``RESET`` when the pipeline closes (the trainer drained the jobs in flight first), ``EXIT`` when
   the trainer's run ends, however it ends.

A rank that dies or hangs is torchrun's (or srun's) to handle: it stops the whole launch.
"""

from __future__ import annotations

import io
import logging
import os
import traceback
from collections import deque
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rl.rollout import RolloutEngine
from diffusion_rl.training.async_rollout import Done, Job, RolloutWorker, WeightSlots

log = logging.getLogger(__name__)

STATE, WEIGHTS, JOB, DONE, ERROR, RESET, EXIT = range(7)
HEADER_TAG, PAYLOAD_TAG = 0, 1
# a rank waits for its next job while the trainer trains, evaluates or warm-starts: far longer than any
# collective's usual timeout. A dead process is the launcher's to notice (torchrun stops the launch).
WAIT = timedelta(hours=24)


def launch_place() -> tuple[str, int, int] | None:
    """The rendezvous of a torchrun or srun launch of several processes, as (url, rank, world size),
    read by Lightning's cluster environments; None when this process was not started by one."""
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if TorchElasticEnvironment.detect():  # torchrun: its agent's store, from MASTER_ADDR / MASTER_PORT
        env = TorchElasticEnvironment()
        return ("env://", env.global_rank(), env.world_size()) if env.world_size() > 1 else None
    if SLURMEnvironment.detect():  # srun: the first node, the port from the job id (or MASTER_PORT)
        slurm = SLURMEnvironment()
        rank, world = slurm.global_rank(), slurm.world_size()
        return (f"tcp://{slurm.main_address}:{slurm.main_port}", rank, world) if world > 1 else None
    return None


def encode(obj: Any) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)


def decode(data: torch.Tensor, device: torch.device | str = "cpu") -> Any:
    # our own processes' messages (dataclasses of tensors): not loaded from an untrusted file
    return torch.load(io.BytesIO(data.numpy().tobytes()), map_location=device, weights_only=False)


class RolloutGroup:
    """Rank 0 (the trainer) and the rollout ranks, on a gloo process group of their own."""

    def __init__(self, pg: Any, rank: int, size: int):
        self.pg, self.rank, self.size = pg, rank, size
        self.sending: deque[tuple[list[Any], list[torch.Tensor]]] = deque()  # works and the tensors they read

    @classmethod
    def join(cls) -> RolloutGroup:
        place = launch_place()
        if place is None:
            raise ConfigError("rollout.worker", "ranks", "takes a torchrun or srun launch of 1 + R processes "
                              "(rank 0 trains, ranks 1..R sample), e.g. torchrun --nproc_per_node=3 src/train.py ...")
        url, rank, size = place
        store, rank, size = next(dist.rendezvous(url, rank, size, timeout=timedelta(minutes=10)))
        pg = dist.ProcessGroupGloo(dist.PrefixStore("diffusion_rl/rollout", store), rank, size, WAIT)
        log.info("rollout group: rank %d of %d (%s)", rank, size, "trainer" if rank == 0 else "rollout rank")
        return cls(pg, rank, size)

    @property
    def rollout_ranks(self) -> list[int]:
        return list(range(1, self.size))

    def send(self, dst: int, kind: int, payload: Any = None, job: int = -1, version: int = -1) -> None:
        """Queue a message to ``dst`` without waiting for it to be received."""
        data = encode(payload) if payload is not None else torch.empty(0, dtype=torch.uint8)
        header = torch.tensor([kind, job, version, data.numel()], dtype=torch.int64)
        works = [self.pg.send([header], dst, HEADER_TAG)]
        if data.numel():
            works.append(self.pg.send([data], dst, PAYLOAD_TAG))
        self.sending.append((works, [header, data]))
        while self.sending and all(w.is_completed() for w in self.sending[0][0]):
            self.sending.popleft()

    def recv(self, src: int, device: torch.device | str = "cpu") -> tuple[int, int, int, Any]:
        """The next message from ``src``: (kind, job, version, payload)."""
        header = torch.empty(4, dtype=torch.int64)
        self.pg.recv([header], src, HEADER_TAG).wait()
        kind, job, version, size = (int(v) for v in header.tolist())
        payload = None
        if size:
            data = torch.empty(size, dtype=torch.uint8)
            self.pg.recv([data], src, PAYLOAD_TAG).wait()
            payload = decode(data, device)
        return kind, job, version, payload

    def flush(self) -> None:
        """Wait until every queued message was received."""
        while self.sending:
            for w in self.sending.popleft()[0]:
                w.wait()

    def backend(self, slots: WeightSlots, policy: nn.Module) -> RanksBackend:
        """The pipeline's side of the group, starting the ranks with ``policy``'s state."""
        return RanksBackend(self, slots, policy)

    def exit(self) -> None:
        """The trainer's run ended: the rollout ranks return."""
        for r in self.rollout_ranks:
            self.send(r, EXIT)
        self.flush()


class RanksBackend:
    """The trainer's side: job ``j`` to rollout rank ``1 + j mod R``, results taken in submission order."""

    def __init__(self, group: RolloutGroup, slots: WeightSlots, policy: nn.Module):
        if group.size < 2:
            raise ConfigError("rollout.worker", "ranks", "needs at least one rollout rank besides the trainer "
                              "(torchrun --nproc_per_node=2 or more)")
        self.group, self.slots = group, slots
        self.device = next(policy.parameters()).device
        self.held = {r: -1 for r in group.rollout_ranks}  # the version each rank holds
        self.in_flight: deque[tuple[int, int]] = deque()  # (job, rank), in submission order
        state = {n: t.detach().cpu() for n, t in policy.state_dict().items()}
        for r in group.rollout_ranks:
            group.send(r, STATE, state)

    def rank_of(self, job: int) -> int:
        return 1 + job % (self.group.size - 1)

    def submit(self, job: Job) -> None:
        r = self.rank_of(job.job)
        if self.held[r] != job.version:
            self.group.send(r, WEIGHTS, {n: t.cpu() for n, t in self.slots.read(job.version).items()},
                            version=job.version)
            self.held[r] = job.version
        self.group.send(r, JOB, job.items, job=job.job, version=job.version)
        self.in_flight.append((job.job, r))

    def take(self) -> Done:
        job, r = self.in_flight.popleft()
        kind, got, _, payload = self.group.recv(r, self.device)
        if kind == ERROR:
            raise RuntimeError(f"rollout rank {r} failed on job {got}:\n{payload}")
        if kind != DONE or got != job:
            raise RuntimeError(f"rollout rank {r} answered message {kind} for job {got}, expected job {job}")
        return payload

    def close(self) -> None:
        while self.in_flight:  # sampled ahead and not trained: received and dropped, so no send is left open
            job, r = self.in_flight.popleft()
            self.group.recv(r)
        for r in self.group.rollout_ranks:
            self.group.send(r, RESET)
        self.group.flush()


def serve_rollout_rank(group: RolloutGroup, engine: RolloutEngine, device: torch.device | None,
                       threads: int) -> dict[str, Any]:
    """A rollout rank's whole run: serve the trainer's messages until ``EXIT``."""
    if threads:
        torch.set_num_threads(threads)
    net = engine.bundle.net
    slots = WeightSlots(net, 1)  # the trainable tensors' names, before they are frozen here
    net.requires_grad_(False).eval()
    if device is not None:
        net.to(device)
    worker = RolloutWorker(engine, slots)
    jobs, busy = 0, 0.0
    while True:
        kind, job, version, payload = group.recv(0)
        if kind == STATE:
            net.load_state_dict(payload)
            worker.loaded, slots.versions = -1, [-1]
        elif kind == WEIGHTS:
            slots.write(version, payload)
        elif kind == JOB:
            try:
                done = worker.run(Job(job, version, payload))
            except Exception:  # noqa: BLE001 - the trainer raises it, with this traceback
                group.send(0, ERROR, traceback.format_exc(), job=job)
                continue
            jobs, busy = jobs + 1, busy + done.busy_s
            group.send(0, DONE, done, job=job, version=version)
        elif kind == RESET:
            group.flush()
        elif kind == EXIT:
            group.flush()
            return {"process": group.rank, "rollout_jobs": jobs, "rollout_busy_s": busy}
        else:
            raise RuntimeError(f"rollout rank {group.rank}: unknown message {kind}")


def rank_device(accelerator: str) -> torch.device | None:
    """Where a rollout rank samples: its node-local GPU when the run uses GPUs, else the CPU."""
    if accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID") or 0))
    return None
