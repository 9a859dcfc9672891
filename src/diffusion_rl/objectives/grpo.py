"""GRPO with conditional clipping and fixed group normalisation (d1's diffu-GRPO; SPEC §4).

    rho = exp(logp_theta - logp_old)        per token (one-step estimator) or per sequence (ELBO)
    loss_unit = -min(rho * A, clip(rho, 1 - eps, 1 + eps_high) * A) + beta * k3(ref, theta)

averaged over each sequence's completion tokens, then over the batch (1/G per group). Source: d1
(Zhao et al. 2025), ``diffu_grpo_trainer.py``. Deviation: mask seeds are per sample (see
``likelihood/one_step.py``); the KL term is added only when ``beta > 0`` so no reference model is
held otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffusion_rl.errors import ConfigError
from diffusion_rl.likelihood.base import mask_seeds
from diffusion_rl.objectives.base import (
    OBJECTIVES,
    Objective,
    ObjectiveConfig,
    StepContext,
    k3_kl,
    masked_mean,
)


@dataclass
class GRPOConfig(ObjectiveConfig):
    name: str = "grpo"
    eps: float = 0.5
    eps_high: float = 0.5

    def validate(self) -> None:
        super().validate()
        if not 0 < self.eps < 1:
            raise ConfigError("objective.eps", self.eps, "must be in (0, 1)")
        if self.eps_high <= 0:
            raise ConfigError("objective.eps_high", self.eps_high, "must be > 0")


def grpo_loss(
    logp: torch.Tensor,  # (B, L) per token, or (B,) per sequence
    old_logp: torch.Tensor,  # same shape, no grad
    advantages: torch.Tensor,  # (B,)
    mask: torch.Tensor,  # (B, L) completion mask (ignored for (B,) inputs)
    eps: float,
    eps_high: float,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss and its metrics; pure function of tensors."""
    if logp.dim() == 1:  # sequence-level ratios: one unit per sequence
        logp, old_logp, mask = logp[:, None], old_logp[:, None], torch.ones_like(logp)[:, None]
        ref_logp = None if ref_logp is None else ref_logp[:, None]
    mask = mask.float()
    adv = advantages[:, None]  # (B, 1)
    log_ratio = logp - old_logp.detach()  # (B, L)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps_high)
    per_unit = -torch.min(ratio * adv, clipped * adv)  # (B, L)
    kl = None
    if ref_logp is not None and beta > 0:
        kl = k3_kl(logp, ref_logp.detach())
        per_unit = per_unit + beta * kl
    loss = masked_mean(per_unit, mask, dim=-1).mean()
    with torch.no_grad():
        lr = log_ratio.detach()
        m = mask.bool()
        vals = lr[m] if bool(m.any()) else lr.new_zeros(1)
        metrics = {
            "ratio/log_mean": vals.mean(),
            "ratio/log_std": vals.std() if vals.numel() > 1 else vals.new_zeros(()),
            "ratio/log_min": vals.min(),
            "ratio/log_max": vals.max(),
            "ratio/clip_frac_low": masked_mean(((ratio < 1 - eps) & (adv < 0)).float(), mask),
            "ratio/clip_frac_high": masked_mean(((ratio > 1 + eps_high) & (adv > 0)).float(), mask),
        }
        if kl is not None:
            metrics["train/kl"] = masked_mean(kl.detach(), mask)
    return loss, metrics


@OBJECTIVES.register("grpo")
class GRPO(Objective):
    config_class = GRPOConfig

    @staticmethod
    def _args(ctx: StepContext) -> tuple:
        ro = ctx.rollout
        seeds = mask_seeds(ctx.run_seed, ro.rollout_id, ro.completion_ids.shape[0], ctx.inner_iter, ro.shard.offset)
        return ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask, seeds

    def old_values(self, ctx: StepContext) -> torch.Tensor:
        return self.likelihood(ctx.old_policy, *self._args(ctx))

    def loss(self, ctx: StepContext):
        ro = ctx.rollout
        args = self._args(ctx)
        old = self.behaviour(ctx)
        with torch.no_grad():
            ref = self.likelihood(ctx.ref_policy, *args) if ctx.ref_policy is not None and self.cfg.beta > 0 else None
        logp = self.likelihood(ctx.policy, *args)
        g = ro.shard.gather  # every process's rows (identity on one process)
        return grpo_loss(g(logp), g(old), g(ro.advantages), g(ro.completion_mask), self.cfg.eps, self.cfg.eps_high,
                         None if ref is None else g(ref), self.cfg.beta)
