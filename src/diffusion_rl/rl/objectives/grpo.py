"""GRPO with conditional clipping and fixed group normalisation (d1's diffu-GRPO;
docs/methods.md §4).

    rho = exp(logp_theta - logp_old)        per token (one-step estimator) or per sequence (ELBO)
    loss_unit = -min(rho * A, clip(rho, 1 - eps, 1 + eps_high) * A)

averaged over each sequence's completion tokens, then over the batch (1/G per group); the KL to the
reference policy is added by :class:`~diffusion_rl.rl.objectives.base.Objective` on the same units.
Source: d1 (Zhao et al. 2025), ``diffu_grpo_trainer.py``. Deviations: mask seeds are per sample (see
``likelihood/one_step.py``); the KL term is aggregated on its own (verl's form, d1 adds it per token
before the mean: the same value), and computed only when ``beta > 0`` so no reference model is held
otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rl.objectives.base import (
    OBJECTIVES,
    Forward,
    Objective,
    ObjectiveConfig,
    Scores,
    StepContext,
    agg_loss,
    ratio_metrics,
)


@dataclass
class GRPOConfig(ObjectiveConfig):
    name: str = "grpo"
    eps: float = 0.5  # d1's clip range: rho in [1 - eps, 1 + eps_high]
    eps_high: float = 0.5
    # the tokens the KL anchor covers (per-token estimators): completion (every token up to EOS) |
    # ignored (only those the reward ignores, with task.loss_mask=reward: it holds the Sudoku givens
    # the model copies without pulling the empty cells back to the warm start's answers)
    kl_tokens: str = "completion"

    def validate(self) -> None:
        super().validate()
        if self.kl_tokens not in ("completion", "ignored"):
            raise ConfigError("objective.kl_tokens", self.kl_tokens, "allowed: completion, ignored")
        if not 0 < self.eps < 1:
            raise ConfigError("objective.eps", self.eps, "must be in (0, 1)")
        if self.eps_high <= 0:
            raise ConfigError("objective.eps_high", self.eps_high, "must be > 0")


def grpo_loss(
    logp: torch.Tensor,  # (B, U) per token or (B, 1) per sequence, with grad
    old_logp: torch.Tensor,  # (B, U) no grad
    advantages: torch.Tensor,  # (B, 1) or (B, U)
    mask: torch.Tensor,  # (B, U) completion mask (all ones per sequence)
    cfg: GRPOConfig,
    *,
    group_size: int,
    surrogate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss and its metrics; pure function of tensors (``surrogate`` is not used)."""
    log_ratio = logp - old_logp.detach()  # (B, U)
    per_unit, low, high = clipped_surrogate(log_ratio, advantages, cfg.eps, cfg.eps_high)  # (B, U) each
    loss = agg_loss(per_unit, mask, "seq-mean-token-mean")
    return loss, ratio_metrics(log_ratio, mask, low, high)


def clipped_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, eps: float,
                      eps_high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's conditional clip per unit, ``-min(rho A, clip(rho, 1 - eps, 1 + eps_high) A)`` with
    ``rho = exp(log_ratio)``, and the units where the clip holds the gradient (below with ``A < 0``,
    above with ``A > 0``). (B, U) and (B, U) or (B, 1) -> three (B, U); shared by the objectives
    whose ratios are clipped this way (GRPO and EGSPO through :func:`grpo_loss`, coupled-GRPO, ESPO)."""
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps_high)
    per_unit = -torch.min(ratio * advantages, clipped * advantages)
    return per_unit, (ratio < 1 - eps) & (advantages < 0), (ratio > 1 + eps_high) & (advantages > 0)


@OBJECTIVES.register("grpo")
class GRPO(Objective):
    config_class = GRPOConfig
    cfg: GRPOConfig
    policy_loss = staticmethod(grpo_loss)
    advantages: ClassVar[tuple[str, ...]] = ("group", "group_std", "loo", "per_token")

    def check_advantage(self, name: str) -> None:
        super().check_advantage(name)
        if name == "per_token" and not self.likelihood.per_token:
            raise ConfigError("advantage.name", name, "needs a per-token likelihood (likelihood=one_step)")

    def score(self, ctx: StepContext, forward: Forward, role: str) -> Scores:
        ro = ctx.rollout
        seeds = self.mask_seeds(ctx, role)
        logp = self.likelihood(forward, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.scored_mask, seeds,
                               pinned=ro.pinned)
        if logp.dim() == 1:  # a sequence-level estimator (ELBO): one unit per sequence
            return Scores(logp[:, None], torch.ones_like(logp)[:, None])
        # the policy gradient acts on the tokens the reward reads; the KL anchor on kl_tokens
        kl_mask = ro.completion_mask
        if self.cfg.kl_tokens == "ignored" and ro.loss_mask is not None:
            kl_mask = ro.completion_mask * (1 - ro.loss_mask)
        if ro.pinned is not None:  # a pinned token is context, not the policy's
            kl_mask = kl_mask * (~ro.pinned).to(kl_mask.dtype)
        return Scores(logp, ro.scored_mask, kl_logp=logp, kl_mask=kl_mask)
