"""GRPO with conditional clipping and fixed group normalisation (d1's diffu-GRPO;
docs/methods.md §4).

    rho = exp(logp_theta - logp_old)        per token (one-step estimator) or per sequence (ELBO)
    loss_unit = -min(rho * A, clip(rho, 1 - eps, 1 + eps_high) * A)

averaged over the units of ``agg`` (default ``group-token-mean``: every completion token of a prompt's
group, then over groups); the k3 KL to the reference policy is added by
:class:`~diffusion_rl.rl.objectives.base.Objective` on the same units with the same aggregation.

Source: d1 (Zhao et al. 2025), dllm-reasoning/d1 @ 837888f, ``diffu-grpo/diffu_grpo_trainer.py``
(``compute_loss``; advantages ``rewards - mean`` in ``_generate_and_score_completions``) and
``slurm_scripts/train.yaml`` / ``*.sbatch``. The defaults are that code's regime: eps 0.5 both sides,
beta 0.04, ``num_iterations`` 12 (``mu``; its Sudoku and Countdown scripts run 8:
``conf/recipe/grpo_<task>.yaml``), the one-step estimator with the prompt masked at 0.15 and one mask
per inner iteration shared by the old and the new policy, ``advantage=group`` (no std), the token mean
over a micro-batch that holds one group (``per_device_train_batch_size`` = ``num_generations`` = 6),
and ``optim=d1`` (lr 3e-6, weight decay 0.1, total-norm clip 0.2). Deviations: mask seeds are per
sample (``likelihood/one_step.py``); the KL term is aggregated on its own (verl's form; d1 adds it
per token before the mean: the same value); it is computed only when ``beta > 0``, so no reference
model is held otherwise; d1's ``train.yaml`` asks TRL to move the reference towards the policy every
64 steps (``sync_ref_model``), which TRL does not do for the LoRA runs d1 made (the reference is the
base with the adapters off, not a copy to move): the reference here stays fixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from diffusion_rl.core.errors import ConfigError, check_choice
from diffusion_rl.likelihood import LIKELIHOODS
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.advantages import AdvantageConfig
from diffusion_rl.rl.objectives.base import OBJECTIVES, LogpUnits, Objective, StepContext
from diffusion_rl.rl.objectives.config import ObjectiveConfig, check_clip
from diffusion_rl.rl.objectives.losses import AGG_MODES, agg_loss, clipped_surrogate, ratio_metrics


@dataclass
class GRPOConfig(ObjectiveConfig):
    name: str = "grpo"
    mu: int = 12  # d1's num_iterations (train.yaml); its Sudoku / Countdown scripts: 8 (conf/recipe/)
    eps: float = 0.5  # d1's clip range: rho in [1 - eps, 1 + eps_high]
    eps_high: float = 0.5
    # how the per-unit losses (and the KL) reduce: group-token-mean is d1's token mean over a
    # micro-batch of one group; seq-mean-token-mean is GRPO's paper form (1/|o| per sequence, then 1/G)
    agg: str = "group-token-mean"
    # the tokens the KL anchor covers (per-token estimators): completion (every token up to EOS) |
    # ignored (only those the reward ignores, with task.loss_mask=reward: it holds the Sudoku givens
    # the model copies without pulling the empty cells back to the warm start's answers)
    kl_tokens: str = "completion"

    def validate(self) -> None:
        super().validate()
        check_choice("objective.agg", self.agg, AGG_MODES)
        check_choice("objective.kl_tokens", self.kl_tokens, ("completion", "ignored"))
        check_clip(self.eps, self.eps_high)


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
    loss = agg_loss(per_unit, mask, cfg.agg, group_size)
    return loss, ratio_metrics(log_ratio, mask, low, high)


@OBJECTIVES.register("grpo")
class GRPO(Objective):
    config_class = GRPOConfig
    cfg: GRPOConfig
    policy_loss = staticmethod(grpo_loss)
    token_credit = True
    # a uniform-noise model: the sampler's trajectory likelihood or the uniform-noise ELBO, per sequence
    uniform_likelihoods: ClassVar[tuple[str, ...]] = ("trajectory", "uniform_elbo")

    def __init__(self, cfg: GRPOConfig, likelihood):
        super().__init__(cfg, likelihood)
        self.kl_agg = cfg.agg  # the KL reduces as the policy loss (d1 adds it per token before the mean)

    def check_advantage(self, cfg: AdvantageConfig) -> None:
        super().check_advantage(cfg)
        if cfg.credit == "token" and not self.likelihood.per_token:
            per_token = [n for n in LIKELIHOODS.names() if LIKELIHOODS.get(n).per_token]
            raise ConfigError("advantage.credit", cfg.credit, "needs a per-token likelihood: "
                              f"likelihood={' | '.join(per_token)} (or advantage.credit=sequence)")

    def logp_units(self, ctx: StepContext, forward: Forward, role: str) -> LogpUnits:
        # the policy gradient acts on the tokens the reward reads; the KL anchor on kl_tokens
        return self.token_logp(ctx, forward, role, kl_tokens=self.cfg.kl_tokens)
