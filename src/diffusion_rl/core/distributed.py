"""A process's share of a rollout batch, and the gather that lets losses see the whole batch.

Under data parallelism (DDP, FSDP) every process reads the same prompts, expands them to the same
``N = prompts x G`` rows, and keeps the contiguous rows ``[offset, offset + N / W)`` (``W``
processes), so a group of ``G`` completions may span processes. Whatever couples rows (group
advantages, StableDRL's per-group softmax, metrics) is computed on the gathered ``(N, ...)`` tensors,
identically on every process, so results do not depend on ``W``.

:meth:`Shard.gather` returns the global tensor with the local rows still attached to the autograd
graph (the other rows are constants). Every process then computes the same global loss ``J``; its
backward gives process ``r`` the gradient through its own rows, and the strategy's gradient
*average* makes ``(1 / W) dJ/dtheta``: the caller multiplies the loss by :attr:`Shard.world_size`
before ``backward`` (``DiffusionRLModule`` does). No autograd collective is needed, so this works on
any backend, gloo included. Knows nothing of Lightning.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from diffusion_rl.core.errors import ConfigError

# where the launchers put a process's place: torchrun (RANK, GROUP_RANK), SLURM's srun (SLURM_PROCID),
# Lightning's own launcher for the processes it starts (NODE_RANK, LOCAL_RANK)
RANK_VARIABLES = ("RANK", "GROUP_RANK", "SLURM_PROCID", "NODE_RANK", "LOCAL_RANK")


def is_first_process() -> bool:
    """Whether this is the first process of a launch (global rank 0), from what the launcher set in
    the environment: known before any process group exists, so the first process alone can load
    weights (FSDP) and check what only it writes."""
    return all(int(os.environ.get(k) or 0) == 0 for k in RANK_VARIABLES)


@dataclass(frozen=True)
class Shard:
    """Rows ``[offset, offset + n)`` of a global batch of ``n * world_size`` rows on process ``rank``."""

    rank: int = 0
    world_size: int = 1
    offset: int = 0

    @staticmethod
    def current(num_rows: int) -> Shard:
        """This process's share of ``num_rows`` global rows (the whole batch without a process group)."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return Shard()
        world, rank = dist.get_world_size(), dist.get_rank()
        if num_rows % world:
            raise ConfigError(
                "task.prompts_per_batch",
                num_rows,
                f"prompts_per_batch * group_size = {num_rows} rows must be divisible by the "
                f"number of processes ({world})",
            )
        return Shard(rank, world, rank * (num_rows // world))

    def rows(self, num_rows: int) -> slice:
        """The local slice of a global batch of ``num_rows`` rows."""
        n = num_rows // self.world_size
        return slice(self.offset, self.offset + n)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every process's ``x`` along dim 0; the local part keeps its gradient. (n, ...) -> (N, ...)"""
        if self.world_size == 1:
            return x
        flag = x.dtype == torch.bool  # not every backend reduces booleans
        src = (x.to(torch.uint8) if flag else x).detach().contiguous()
        parts = [torch.empty_like(src) for _ in range(self.world_size)]
        dist.all_gather(parts, src)
        if flag:
            parts = [p.bool() for p in parts]
        parts[self.rank] = x
        return torch.cat(parts)

    def all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of ``x`` over processes (a new tensor; ``x`` is left alone)."""
        if self.world_size == 1:
            return x
        out = x.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out
