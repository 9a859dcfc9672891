"""SPG, Sandwiched Policy Gradient: a lower bound of log pi for rewarded samples, an upper one for the rest.

For sample ``i`` with advantage ``A_i = r_i - mean_G(r)`` and ``len_i`` completion tokens::

    s_i  = ELBO_i                                   if A_i > 0
         = w * EUBO_i + (1 - w) * ELBO_i            if A_i <= 0       (negative=mix, w = 0.5)
    loss = sum_i (-A_i * s_i * len_i) / sum_i len_i

``ELBO_i`` = mean over Monte Carlo samples ``k`` of the mean log p of the masked completion tokens;
``EUBO_i = (1/beta) * mean_l log mean_k [ p_kl^beta * m_kl / t_k ]`` over the tokens masked in some
sample (``likelihood/elbo.py``'s ``eubo_from_logps``), ``t_k`` the share of the completion masked.
The paper's argument: a good sample's likelihood is pushed up through a lower bound and a bad one's
down through an upper bound, so neither step is taken on an overestimate. This per-token EUBO is a
mean-field bound: on an exactly enumerated 2-token completion it lies above log p / L only where
revealing a token moves the other's probability the same way for both (``tests/unit/likelihood/test_elbo.py``). No
ratio, no clip, no KL in the method. Metrics: ``spg/frac_upper`` (share of rows on the upper-bound
side) and ``spg/upper_minus_elbo`` (their mean ``s_i - ELBO_i``).

Source: Wang et al. 2025, "SPG: Sandwiched Policy Gradient for Masked Diffusion Language Models"
(arXiv:2510.09541); facebookresearch/SPG @ a1c7120, ``spg/spg_trainer.py``: ``compute_loss``
(~L87-126), the masks of ``forward_process`` (``block_random``, ~L334-378), the bounds of
``_get_per_seq_logps`` (~L489-556); the scripts ``spg/slurm_scripts/spg_{mix,eubo}/*.sbatch`` (4
iterations per rollout, ``num_t = 2``, ``min_t = 0``, ``max_t = 1``, lr 3e-6, G = 6; beta_EUBO 1.0
on Sudoku, else 1.5 with mix; 2.0 on Countdown with eubo).
``negative`` = SPG's ``logp_estimation`` (``eubo | mix | elbo | zero``). The masks are SPG's by default
(``likelihood=spg_blocks``, whose docstring lists each masking quirk and its switch); ``likelihood=elbo``
with ``weighting=mean`` works too. Deviations from the public code:

- the length-weighted mean runs over the global batch; SPG's over each device's micro-batch (3 or 6
  sequences), then averaged over micro-batches;
- the rollout is reused for ``mu`` updates uncorrected, as there; each update draws its own masks
  (seeds ``mask_seeds(run_seed, rollout, sample, inner_iter)``: per sample, not SPG's one seed per
  iteration for the batch);
- the EUBO is computed in log space (logsumexp); SPG takes ``p ** beta`` and drops tokens where it
  underflows to 0, which changes nothing else;
- KL anchor: SPG refuses ``beta != 0``; here ``objective.beta`` (0.04 by default, the project's
  Sudoku anchor: its reward ignores the given cells) adds the shared k3 KL to the warm start on each
  Monte Carlo sample's scored tokens, as StableDRL's does; ``beta=0`` is the public setting;
- ``ratio/*`` is a diagnostic the method does not use: the per-sequence ELBO log-ratio of the policy
  against the rollout (old) policy on the same masks, ``ratio_diagnostic=true``, at one extra
  forward without gradients per update; ``false`` computes no old policy values at all (and
  keeps no frozen copy of it). Nothing is clipped, so ``ratio/clip_frac_*`` are 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError, check_choice
from diffusion_rl.likelihood.elbo import ELBOEstimator, ELBOSample, elbo_from_logps, eubo_from_logps
from diffusion_rl.likelihood.spg_blocks import SPGBlocksEstimator
from diffusion_rl.likelihood.uniform_elbo import UniformELBOEstimator
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.objectives.base import OBJECTIVES, LogpUnits, Objective, StepContext
from diffusion_rl.rl.objectives.config import ObjectiveConfig
from diffusion_rl.rl.objectives.losses import agg_loss, masked_mean, ratio_metrics

NEGATIVE_BOUNDS = ("eubo", "mix", "elbo", "zero")


@dataclass
class SPGConfig(ObjectiveConfig):
    name: str = "spg"
    mu: int = 4  # the public scripts' num_iterations: each rollout serves 4 updates, uncorrected
    negative: str = "mix"  # the log pi proxy for A <= 0: eubo | mix | elbo | zero (SPG's logp_estimation)
    eubo_beta: float = 1.5  # the public default (mix on GSM8K, MATH500, Countdown; Sudoku runs 1.0)
    mix_weight: float = 0.5  # w of the EUBO in mix
    # log the ELBO log-ratio against the rollout policy (one forward without gradients per update)
    ratio_diagnostic: bool = True

    def validate(self) -> None:
        super().validate()
        check_choice("objective.negative", self.negative, NEGATIVE_BOUNDS)
        if not self.eubo_beta >= 1:  # the power mean of order beta bounds the arithmetic mean only for beta >= 1
            raise ConfigError("objective.eubo_beta", self.eubo_beta, "must be >= 1 (below 1 the EUBO is no upper bound)")
        if not 0 <= self.mix_weight <= 1:
            raise ConfigError("objective.mix_weight", self.mix_weight, "must be in [0, 1]")


def spg_loss(
    logp: torch.Tensor,  # (B, L) each row's ELBO, repeated over its completion tokens, with grad
    old_logp: torch.Tensor | None,  # (B, L) the old policy's, or None (no diagnostic)
    advantages: torch.Tensor,  # (B, 1), or (B, L) with per-token TIS weights
    mask: torch.Tensor,  # (B, L) completion tokens
    cfg: SPGConfig,
    *,
    group_size: int,
    surrogate: torch.Tensor | None = None,  # (B, L) s_i, the sandwiched bound (default: the ELBO)
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SPG's loss: the token-mean of ``-A_i s_i`` over every completion token, i.e.
    ``sum_i len_i (-A_i s_i) / sum_i len_i``; a pure function of tensors (``group_size`` unused)."""
    s = (logp if surrogate is None else surrogate).float()
    adv = advantages.detach().float()
    loss = agg_loss(-adv * s, mask, "token-mean")
    with torch.no_grad():
        row_mask = mask.sum(-1) > 0  # (B,) rows with completion tokens
        row_elbo, row_s = masked_mean(logp.float(), mask, -1), masked_mean(s, mask, -1)  # (B,) each
        upper = (adv[:, 0] <= 0) & row_mask  # (B,) rows on the upper-bound side
        metrics = {"spg/frac_upper": upper.float().sum() / row_mask.sum().clamp_min(1),
                   "spg/upper_minus_elbo": masked_mean(row_s - row_elbo, upper.float())}
        if old_logp is not None:
            lr = masked_mean(logp.float() - old_logp.float(), mask, -1)[:, None]  # (B, 1) per-sequence log-ratio
            metrics.update(ratio_metrics(lr, row_mask[:, None].float()))  # a diagnostic: nothing is clipped
    return loss, metrics


@OBJECTIVES.register("spg")
class SPG(Objective):
    config_class = SPGConfig
    cfg: SPGConfig
    policy_loss = staticmethod(spg_loss)
    uniform_likelihoods = ("uniform_elbo",)  # its ELBO side only: objective.negative=elbo or zero

    def __init__(self, cfg: SPGConfig, likelihood):
        super().__init__(cfg, likelihood)
        if isinstance(likelihood, UniformELBOEstimator):  # per-position terms; no EUBO without a mask token
            if cfg.negative not in ("elbo", "zero"):
                raise ConfigError("objective.negative", cfg.negative, "the EUBO bounds masked-token probabilities: "
                                  "with likelihood=uniform_elbo use objective.negative=elbo or zero")
            return
        if not isinstance(likelihood, (SPGBlocksEstimator, ELBOEstimator)):
            raise ConfigError("likelihood.name", likelihood.cfg.name,
                              "spg needs likelihood=spg_blocks (SPG's masks) or likelihood=elbo")
        if isinstance(likelihood, ELBOEstimator) and likelihood.cfg.weighting != "mean":
            raise ConfigError("likelihood.weighting", likelihood.cfg.weighting,
                              "objective=spg needs likelihood.weighting=mean (its bounds are per-token means)")

    def needs_old_logp(self) -> bool:
        return self.cfg.ratio_diagnostic or self.cfg.behaviour_correction != "none"

    def negative_bound(self, s: ELBOSample, elbo: torch.Tensor) -> torch.Tensor:
        """The proxy of log pi for samples with ``A <= 0``, (n,)."""
        c = self.cfg
        if c.negative == "elbo":
            return elbo
        if c.negative == "zero":  # SPG's ablation: those samples give no gradient
            return torch.zeros_like(elbo)
        eubo = eubo_from_logps(s.token_logps, s.masked, s.t, c.eubo_beta)  # (n,)
        return eubo if c.negative == "eubo" else c.mix_weight * eubo + (1 - c.mix_weight) * elbo

    def logp_units(self, ctx: StepContext, forward: Forward, role: str) -> LogpUnits:
        ro = ctx.rollout
        data = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.scored_mask)
        s = self.likelihood.sample(forward, *data, self.mask_seeds(ctx, role), pinned=ro.pinned)
        elbo = elbo_from_logps(s.token_logps, s.masked, s.t, "mean")  # (n,)
        L = ro.completion_ids.shape[1]
        surrogate = None
        if role == "policy":
            bound = torch.where(ro.advantages > 0, elbo, self.negative_bound(s, elbo))  # (n,)
            surrogate = bound[:, None].expand(-1, L)
        # each sequence counts once per completion token (SPG's len_i weights): its bound is repeated
        # over them and the loss takes their token-mean; the KL anchor acts on every sample's scored tokens
        return LogpUnits(elbo[:, None].expand(-1, L), ro.scored_mask, kl_logp=s.token_logps.transpose(0, 1),
                      kl_mask=s.masked.transpose(0, 1), surrogate=surrogate)
