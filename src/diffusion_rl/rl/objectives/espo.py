"""ESPO: ELBO-based sequence-level policy optimisation, one PPO ratio per sequence.

With ``ELBO_b`` the sum of the per-position terms of ESPO's estimator (``likelihood/stratified.py``:
mask counts spread evenly over the batch, each masked set paired with its complement, two Monte Carlo
draws) over the ``n_b`` positions it covers, on the same masks for the new, old and reference policy::

    rho_b = exp((ELBO_theta,b - ELBO_old,b) / n_b)                 (n_b = L: every generated position)
    loss  = mean_b -min(rho_b A_b, clip(rho_b, 1 - eps, 1 + eps_high) A_b)
          + beta * sum_b 1/2 (ELBO_theta,b - ELBO_ref,b)^2 / sum_b n_b                   (= B * L)

``A`` is the leave-one-out advantage without std scaling (``advantage=loo``, selected by
``conf/objective/espo.yaml``). Defaults are the public Sudoku script's: ``eps = eps_high = 0.2``,
``mu = 8`` (``num_iterations``), ``beta = 1e-2`` (its GSM8K / MATH scripts use 1e-3); its lr 3e-6 and
``G = 6`` are the optimizer's and the task's keys, which the CPU job keeps at the project's (lr 3e-4 for
the tiny model; ``task.group_size`` 8).

Source: ESPO (ML-GSAI/ESPO @ b5f2dac, ``espo/espo_trainer.py``: ``compute_loss`` (``coef_1 = exp((elbo -
old) / logits_to_keep)``, the clip, ``-min(...).sum() / batch_size``, ``compute_approx_kl(..., "k2")``
summed and divided by ``batch_size * logits_to_keep``), ``_get_elbo`` / ``_get_elbo_mc`` (the ELBO),
``_generate_and_score_completions`` (old and reference ELBOs on the same mask seeds, ``leave_one_out``).
Quirks and deviations:

- *Padding in the ELBO and the constant normaliser.* ESPO's ELBO covers every generated position, the
  EOS padding after the first EOS included, and its ratio and KL divide by the constant ``L``; the
  completion mask is unused. ``elbo_tokens=all`` (default) reproduces both; ``elbo_tokens=completion``
  fixes them together: the ELBO covers the scored completion (up to and including the first EOS; with
  ``task.loss_mask=reward`` the tokens the reward reads), the ratio divides by each sequence's count and
  the KL by the batch's. The default is the public behaviour because ESPO's ELBO is a bound on the whole
  generated sequence, the sampler's output, and ``L`` is then its exact length.
- *reduce_var* is ignored by the public trainer (the complementary pass always runs): it is
  ``likelihood.coupled`` here, default true (what the code runs); ``false`` is the one-pass ELBO.
- *KL.* ESPO's k2 on the sequence ELBO, not the project's per-unit k3: :meth:`ESPO.kl_term` overrides
  the shared template's one KL method (``rl/objectives/base.py``); the reference is the warm start, fixed
  (the public scripts set TRL's ``sync_ref_model``, every 64 steps).
- *Masks:* the estimator's batch-level draw (``likelihood/stratified.py``); per-token estimators other
  than ESPO's (``complementary``, ``one_step``) are accepted and summed the same way.
- the means run over the whole rollout batch (gathered across processes); the public code takes them
  per micro-batch and averages over accumulation steps and devices: the same value, its micro-batches
  being of equal size;
- ``behaviour_correction=tis`` is refused: its weights are per unit and ESPO's ratio is per sequence.
  ``rollout/mismatch_log_ratio`` is per position (the sampler's token log-prob minus the ELBO term).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError, check_choice
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.objectives.base import OBJECTIVES, LogpUnits, Objective, StepContext
from diffusion_rl.rl.objectives.config import LikelihoodNeed, ObjectiveConfig, check_clip
from diffusion_rl.rl.objectives.losses import clipped_surrogate, ratio_metrics


@dataclass
class ESPOConfig(ObjectiveConfig):
    name: str = "espo"
    mu: int = 8  # the public scripts' num_iterations
    beta: float = 1e-2  # the Sudoku / code scripts' (GSM8K / MATH: 1e-3); k2 on the sequence ELBO
    eps: float = 0.2  # PPO clip of the sequence ratio: rho in [1 - eps, 1 + eps_high] (TRL's epsilon)
    eps_high: float = 0.2
    # positions the ELBO covers: all (every generated position, EOS padding included, normalised by the
    # constant L: the public code) | completion (the scored completion, normalised per sequence)
    elbo_tokens: str = "all"

    def validate(self) -> None:
        super().validate()
        check_clip(self.eps, self.eps_high)
        check_choice("objective.elbo_tokens", self.elbo_tokens, ("all", "completion"))
        if self.behaviour_correction != "none":
            raise ConfigError("objective.behaviour_correction", self.behaviour_correction,
                              "espo takes none: tis weights are per unit, ESPO's ratio is per sequence")


def sequence_elbo(terms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of the ELBO terms over the positions that count. (B, L), (B, L) -> (B,)"""
    return torch.where(mask.bool(), terms, torch.zeros_like(terms)).sum(-1)


def espo_loss(
    logp: torch.Tensor,  # (B, L) per-position ELBO terms of the new policy, with grad
    old_logp: torch.Tensor,  # (B, L) the old policy's, on the same masks
    advantages: torch.Tensor,  # (B, 1)
    mask: torch.Tensor,  # (B, L) the positions the ELBO covers (all ones with elbo_tokens=all)
    cfg: ESPOConfig,
    *,
    group_size: int,
    surrogate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """ESPO's clipped sequence-ratio loss, mean over sequences; a pure function of tensors."""
    n = mask.sum(-1).clamp_min(1).to(logp.dtype)  # (B,): L with elbo_tokens=all
    elbo, old = sequence_elbo(logp, mask), sequence_elbo(old_logp.detach(), mask)  # (B,) each
    log_ratio = ((elbo - old) / n)[:, None]  # (B, 1)
    per_seq, low, high = clipped_surrogate(log_ratio, advantages, cfg.eps, cfg.eps_high)  # (B, 1) each
    metrics = ratio_metrics(log_ratio, torch.ones_like(log_ratio), low, high)
    metrics["espo/elbo_per_token"] = (elbo.detach() / n).mean()
    return per_seq.mean(), metrics


def espo_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ESPO's KL term: ``sum_b 1/2 (ELBO_b - ELBO_ref,b)^2 / sum_b n_b`` (k2 on sequence ELBOs, ``B * L``
    with every position covered). (B, L) x 3 -> scalar"""
    d = sequence_elbo(logp, mask) - sequence_elbo(ref_logp.detach(), mask)  # (B,)
    return (0.5 * d.pow(2)).sum() / mask.sum().clamp_min(1).to(d.dtype)


@OBJECTIVES.register("espo")
class ESPO(Objective):
    config_class = ESPOConfig
    cfg: ESPOConfig
    policy_loss = staticmethod(espo_loss)
    uniform_likelihoods = ("uniform_elbo",)  # with likelihood.per_token=true: its per-position terms

    needs_likelihood = LikelihoodNeed(
        "espo sums per-position terms: use stratified (its own), complementary or one_step (a uniform-noise "
        "model: uniform_elbo with likelihood.per_token=true)", per_token=True)

    def covered(self, ctx: StepContext) -> torch.Tensor:
        """(n, L) the positions the ELBO covers (``elbo_tokens``)."""
        ro = ctx.rollout
        return ro.unpinned_mask if self.cfg.elbo_tokens == "all" else ro.scored_mask

    def logp_units(self, ctx: StepContext, forward: Forward, role: str) -> LogpUnits:
        ro = ctx.rollout
        mask = self.covered(ctx)
        terms = self.likelihood(forward, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, mask,
                                self.mask_seeds(ctx, role), pinned=ro.pinned)  # (n, L)
        return LogpUnits(terms, mask)

    def kl_term(self, policy: LogpUnits, ref: LogpUnits, gather: Callable[[torch.Tensor], torch.Tensor],
                group_size: int) -> torch.Tensor:
        return espo_kl(gather(policy.logp), gather(ref.logp), gather(policy.mask))
