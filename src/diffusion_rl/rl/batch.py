"""The rollout batch every objective reads (:class:`Rollout`), built by :mod:`diffusion_rl.rl.rollout`.

It sits below the objectives and the rollout engine, so both import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

import torch

from diffusion_rl.core.distributed import Shard
from diffusion_rl.rl.tree import Tree
from diffusion_rl.sampling.trajectory import TrajectoryRecorder
from diffusion_rl.sampling.uniform_trajectory import Trajectory, UniformTrajectory


@dataclass
class Rollout:
    """One rollout batch as the objectives read it; made by :mod:`diffusion_rl.rl.rollout`.

    Samples are prompt-major: rows ``g*G .. g*G+G-1`` share prompt ``g``. The tensors hold this
    process's rows (``shard``); ``all_rewards`` holds every process's.
    """

    rollout_id: int
    group_size: int
    prompt_ids: torch.Tensor  # (n, P) left-padded
    prompt_mask: torch.Tensor  # (n, P)
    completion_ids: torch.Tensor  # (n, L)
    completion_mask: torch.Tensor  # (n, L) 1 up to and including the first EOS
    texts: list[str]  # decoded completions (up to the first EOS)
    items: list[dict[str, Any]]  # the task item of each row
    rewards: torch.Tensor  # (n,) composite reward
    all_rewards: torch.Tensor  # (N,) composite reward of every process's rows
    reward_components: dict[str, torch.Tensor]  # reward function name -> (n,) its unweighted values
    advantages: torch.Tensor  # (n,) or (n, K) per selected step, from the advantage estimator
    shard: Shard = field(default_factory=Shard)
    # the sampler's recorded steps (EGSPO); a uniform-noise sampler's are a UniformTrajectory (DiffusionGemma)
    trajectory: Trajectory | None = None
    selected_steps: torch.Tensor | None = None  # (n, K) steps an objective trains on, -1 = unused slot
    metrics: dict[str, float] = field(default_factory=dict)  # logged with the first inner update
    loss_mask: torch.Tensor | None = None  # (n, L) 1 = a token the reward reads (task.loss_mask=reward)
    # (n, L) the sampler's temperature-1 log-prob of each completion token, from the logits it was
    # committed with (0 where filled without a forward); None: not recorded (no mismatch, no TIS)
    sampler_logp: torch.Tensor | None = None
    # (n, L) bool: the task's pinned tokens (Task.pinned_completion: Sudoku's givens), in the canvas from
    # the start: never masked by an estimator, never scored; None: nothing pinned
    pinned: torch.Tensor | None = None
    # per-row tensors (n, ...) by name that the objective's rollout-time hook attached (Objective.revise_rollout)
    # for its plan to read: IGPO's hint positions and their entropies (rl/objectives/igpo.py); {}: none
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    # tree rollouts (rollout.tree, rl/tree.py): every node of this process's trees, the rows being the
    # leaves; None: G independent samples per prompt
    tree: Tree | None = None

    # The fields that are not one value per row of this process, so :meth:`select` leaves them as they
    # are: ``rollout_id`` and ``group_size`` describe the batch; ``all_rewards`` holds every process's
    # rows (N,), which only a gather after every process selected can renew; ``shard`` places this
    # process's rows among all processes, which the selection moves; ``metrics`` are batch-level
    # floats. The caller renews the two that the selection changes (RolloutEngine).
    NOT_PER_ROW: ClassVar[frozenset[str]] = frozenset(
        {"rollout_id", "group_size", "all_rewards", "shard", "metrics"})

    def select(self, keep: torch.Tensor) -> Rollout:
        """The rollout of rows ``keep`` only (indices (n',) in that order, or a bool mask (n,)), for
        DAPO's dynamic sampling. Generic over the fields, so a new one cannot escape the filter: every
        field outside :attr:`NOT_PER_ROW` is per-row and is selected (a tensor whose first dimension is
        the batch's n, a list of n, a dict of such tensors, the trajectory recorder, or None); anything
        else raises a TypeError naming the field."""
        n = self.completion_ids.shape[0]
        if keep.dtype == torch.bool:
            if keep.shape != (n,):
                raise ValueError(f"a bool mask of the {n} rows expected, got shape {tuple(keep.shape)}")
            keep = keep.nonzero()[:, 0]
        rows = keep.tolist()

        def pick(name: str, value: Any) -> Any:
            if value is None:
                return None
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n:
                return value[keep]
            if isinstance(value, list) and len(value) == n:
                return [value[i] for i in rows]
            if isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values()):
                return {k: pick(f"{name}[{k!r}]", v) for k, v in value.items()}
            if isinstance(value, TrajectoryRecorder | UniformTrajectory):
                return value.select(keep)
            if isinstance(value, Tree):  # its nodes hold every leaf's ancestors: kept whole or not at all
                raise TypeError(f"Rollout.{name}: a tree rollout is kept whole, select() cannot keep some of its "
                                "leaves (rollout.oversample must be 1 with rollout.tree)")
            raise TypeError(f"Rollout.{name} ({type(value).__name__}) is not one value per row of the {n}: "
                            "select() cannot keep its rows; list it in Rollout.NOT_PER_ROW if it is batch-level")

        return replace(self, **{f.name: pick(f.name, getattr(self, f.name))
                               for f in fields(self) if f.name not in self.NOT_PER_ROW})

    @property
    def unpinned_mask(self) -> torch.Tensor:
        """(n, L) every completion position, the EOS padding after the first EOS included, but the task's
        pinned ones, which are context: the whole generated sequence (ESPO's and BGPO's
        ``elbo_tokens=all``, JustGRPO's ``tokens=all``)."""
        every = torch.ones_like(self.completion_mask)
        return every if self.pinned is None else every * (~self.pinned).to(every.dtype)

    @property
    def scored_mask(self) -> torch.Tensor:
        """(n, L) the tokens the policy gradient acts on: up to the first EOS, not pinned and, with
        ``task.loss_mask=reward``, read by the reward."""
        mask = self.completion_mask if self.loss_mask is None else self.completion_mask * self.loss_mask
        return mask if self.pinned is None else mask * (~self.pinned).to(mask.dtype)
