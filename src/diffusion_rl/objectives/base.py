"""What every objective shares: the config, group-relative advantages, the step context, k3 KL.

An objective turns one rollout batch into a scalar loss for one inner update. It asks its likelihood
estimator for ``log pi_theta`` (with gradients) and ``log pi_ref`` (without), gets ``log pi_old``
from :meth:`Objective.behaviour`, then calls a pure tensor loss function on the rows of all
processes (``rollout.shard.gather``). Objectives know nothing of Lightning.

The behaviour policy's values come from :meth:`Objective.old_values`, which the module either calls
during each inner update with a frozen copy of the policy (``old_policy=copy``) or calls for every
inner iteration right after the rollout, while the policy still *is* the behaviour policy
(``old_policy=cached``: no second model); :meth:`Objective.behaviour` reads whichever applies.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from diffusion_rl.distributed import Shard
from diffusion_rl.errors import ConfigError
from diffusion_rl.registry import Registry

OBJECTIVES: Registry[type[Objective]] = Registry("objective.name")

Forward = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


@dataclass
class ObjectiveConfig:
    name: str = "grpo"
    mu: int = 4  # inner updates per rollout batch
    beta: float = 0.0  # weight of the k3 KL to the reference policy (0: no reference model)
    scale_rewards: str = "none"  # "group": divide advantages by the group's std + 1e-4

    def validate(self) -> None:
        if self.mu < 1:
            raise ConfigError("objective.mu", self.mu, "must be >= 1")
        if self.beta < 0:
            raise ConfigError("objective.beta", self.beta, "must be >= 0")
        if self.scale_rewards not in ("none", "group"):
            raise ConfigError("objective.scale_rewards", self.scale_rewards, "allowed: none, group")


@dataclass
class Rollout:
    """One rollout batch; samples are prompt-major: rows ``g*G .. g*G+G-1`` share prompt ``g``."""

    rollout_id: int
    group_size: int
    prompt_ids: torch.Tensor  # (N, P)
    prompt_mask: torch.Tensor  # (N, P)
    completion_ids: torch.Tensor  # (N, L)
    completion_mask: torch.Tensor  # (N, L) 1 up to and including the first EOS
    rewards: torch.Tensor  # (N,)
    advantages: torch.Tensor  # (N,)
    extras: dict[str, Any] = field(default_factory=dict)  # e.g. the recorded trajectory
    # this process's rows of the global batch (mask seeds use global row ids: shard.offset + j)
    shard: Shard = field(default_factory=Shard)


@dataclass
class StepContext:
    """What an objective may use for one inner update."""

    rollout: Rollout
    inner_iter: int
    run_seed: int
    policy: Forward  # with gradients
    old_policy: Forward | None  # frozen behaviour policy (None with old_policy=cached)
    ref_policy: Forward | None  # frozen reference policy (beta > 0)
    cache: dict[str, Any] = field(default_factory=dict)  # per-rollout memo shared across inner iters
    old_values: dict[int, Any] = field(default_factory=dict)  # inner iter -> precomputed old_values()


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "none") -> torch.Tensor:
    """``A_j = r_j - mean_G(r)``; ``scale="group"`` divides by the group's std + 1e-4.

    The std is the unbiased one (``torch.std``), as d1 and TRL compute it. (N,) -> (N,)
    """
    r = rewards.float().view(-1, group_size)  # (N/G, G)
    adv = r - r.mean(-1, keepdim=True)
    if scale == "group":
        adv = adv / (r.std(-1, keepdim=True) + 1e-4)
    return adv.reshape(-1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k3 estimator ``exp(ref - logp) - (ref - logp) - 1`` (>= 0, unbiased for KL(pi || ref))."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp_min(1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1)


class Objective(ABC):
    """Subclasses register with ``@OBJECTIVES.register(name)`` and set ``config_class``."""

    config_class: type[ObjectiveConfig] = ObjectiveConfig
    needs_trajectory: bool = False  # ask the sampler to record per-step data (EGSPO)

    def __init__(self, cfg: ObjectiveConfig, likelihood):
        cfg.validate()
        self.cfg = cfg
        self.likelihood = likelihood

    def make_recorder(self):
        """A :class:`~diffusion_rl.sampling.StepRecorder` for the rollout, or None (the default)."""
        return None

    def on_rollout(self, rollout: Rollout, recorder, task) -> dict[str, float]:
        """Called once per rollout after rewards and advantages are set, with the recorder used.

        Objectives that need more than final rewards (EGSPO-SA scores greedy completions) put it
        into ``rollout.extras`` here. Returns extra metrics to log.
        """
        return {}

    def old_values(self, ctx: StepContext) -> Any:
        """What inner update ``ctx.inner_iter`` needs from the behaviour policy ``ctx.old_policy``
        (e.g. log-probs or ELBOs on that iteration's mask seeds); called without gradients.

        Objectives that implement it support ``old_policy=cached``.
        """
        raise NotImplementedError(f"objective {self.cfg.name} does not support old_policy=cached")

    @classmethod
    def supports_cached_old(cls) -> bool:
        return cls.old_values is not Objective.old_values

    def behaviour(self, ctx: StepContext) -> Any:
        """:meth:`old_values` for this inner update: precomputed at rollout time, or computed now."""
        if ctx.inner_iter in ctx.old_values:
            return ctx.old_values[ctx.inner_iter]
        with torch.no_grad():
            return self.old_values(ctx)

    def precompute_old(self, ctx: StepContext, num_iters: int) -> None:
        """Fill ``ctx.old_values`` for inner iterations ``0 .. num_iters - 1`` (``ctx.old_policy`` must
        be the behaviour policy now)."""
        with torch.no_grad():
            for it in range(num_iters):
                ctx.inner_iter = it
                ctx.old_values[it] = self.old_values(ctx)
        ctx.inner_iter = 0

    @abstractmethod
    def loss(self, ctx: StepContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Scalar loss for one inner update and a dict of detached metrics (``/`` names).

        The loss is the one of the *global* batch (every process computes the same value from
        gathered tensors); see :mod:`diffusion_rl.distributed` for how its gradient is averaged."""
