"""The pure tensor pieces the policy losses share (verl's ``core_algos``): the k3 KL penalty, the
reductions of per-unit values (``agg_loss``), PPO's conditional clip and the ``ratio/*`` metrics.

Every function here takes and returns tensors only; the objectives (``rl/objectives/<name>.py``) and
the template that calls their losses (``rl/objectives/base.py``) import them from here.
"""

from __future__ import annotations

import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "group-token-mean")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k3 estimator ``exp(ref - logp) - (ref - logp) - 1`` per unit (>= 0, unbiased for KL(pi || ref))."""
    d = ref_logp.detach() - logp
    return torch.exp(d) - d - 1


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp_min(1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1)


def agg_loss(values: torch.Tensor, mask: torch.Tensor, mode: str = "seq-mean-token-mean",
             group_size: int = 0) -> torch.Tensor:
    """Reduce per-unit values ``(B, ..., U)`` to a scalar.

    ``token-mean``: mean over every unit that counts; ``seq-mean-token-mean``: mean over each row's
    units (the last dimension), then over rows (GRPO's ``1/|o|``); ``seq-mean-token-sum``: sum over
    each row's units, mean over rows; ``group-token-mean``: mean over every unit of a prompt's group of
    ``group_size`` rows, then over groups (d1's token mean over a micro-batch of one group). Units
    outside ``mask`` never count, whatever they hold.
    """
    if mode == "group-token-mean":
        if group_size < 1 or values.shape[0] % group_size:
            raise ValueError(f"group-token-mean needs rows in whole groups, got {values.shape[0]} rows, group {group_size}")
        groups = values.shape[0] // group_size
        return agg_loss(values.reshape(groups, -1), mask.reshape(groups, -1), "seq-mean-token-mean")
    m = mask.to(values.dtype)
    v = torch.where(mask.bool(), values, torch.zeros_like(values))
    if mode == "token-mean":
        return v.sum() / m.sum().clamp_min(1)
    if mode == "seq-mean-token-mean":
        return (v.sum(-1) / m.sum(-1).clamp_min(1)).mean()
    if mode == "seq-mean-token-sum":
        return v.sum(-1).mean()
    raise ValueError(f"unknown aggregation {mode!r}; allowed: {', '.join(AGG_MODES)}")


def clipped_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, eps: float,
                      eps_high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's conditional clip per unit, ``-min(rho A, clip(rho, 1 - eps, 1 + eps_high) A)`` with
    ``rho = exp(log_ratio)``, and the units where the clip holds the gradient (below with ``A < 0``,
    above with ``A > 0``). (B, U) and (B, U) or (B, 1) -> three (B, U); shared by the objectives
    whose ratios are clipped this way (GRPO and EGSPO through ``grpo_loss``, coupled-GRPO, ESPO, IGPO)."""
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps_high)
    per_unit = -torch.min(ratio * advantages, clipped * advantages)
    return per_unit, (ratio < 1 - eps) & (advantages < 0), (ratio > 1 + eps_high) & (advantages > 0)


def check_per_sample(advantages: torch.Tensor, objective: str) -> None:
    """Refuse per-unit advantages in a loss that weighs whole samples: (B,) or (B, 1) pass, (B, U) raises."""
    if advantages.dim() == 2 and advantages.shape[1] != 1:
        raise ValueError(f"{objective} needs one advantage per sample, got {tuple(advantages.shape)}")


def ratio_metrics(log_ratio: torch.Tensor, mask: torch.Tensor, clipped_low: torch.Tensor | None = None,
                  clipped_high: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``ratio/log_mean|log_std|log_min|log_max`` over the units that count, and the fractions of
    them clipped below / above (``ratio/clip_frac_low|high``). All (B, U); detached. Without the clipped
    units, or with one of the two missing (a ratio-free objective's diagnostic ``ratio_diagnostic``:
    nothing is clipped), both fractions are 0."""
    with torch.no_grad():
        if clipped_low is None or clipped_high is None:
            clipped_low = clipped_high = torch.zeros_like(log_ratio, dtype=torch.bool)  # (B, U)
        m = mask.bool()
        vals = log_ratio.detach()[m] if bool(m.any()) else log_ratio.new_zeros(1)
        return {
            "ratio/log_mean": vals.mean(),
            "ratio/log_std": vals.std() if vals.numel() > 1 else vals.new_zeros(()),
            "ratio/log_min": vals.min(),
            "ratio/log_max": vals.max(),
            "ratio/clip_frac_low": masked_mean(clipped_low.float(), mask.float()),
            "ratio/clip_frac_high": masked_mean(clipped_high.float(), mask.float()),
        }
