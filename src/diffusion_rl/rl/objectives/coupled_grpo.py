"""Coupled-GRPO (DiffuCoder): per-token PPO on complementary-mask log-probs, token-mean over the batch.

With ``log p_i`` the complementary-mask estimate of each completion token (``likelihood/complementary.py``:
one fully masked copy plus a pair of complementary masks, ``t ~ U(0.2, 0.8)``), on the same masks for
the new, the old and the reference policy::

    rho_i  = exp(log p_theta,i - log p_old,i)
    loss   = sum_{b,i in completion} [ -min(rho_i A_b, clip(rho_i, 1 - eps, 1 + eps_high) A_b)
                                       + beta * k3(log p_ref,i, log p_theta,i) ] / (number of completion tokens)

every completion token of the batch weighing the same (``token-mean``; d1's GRPO averages per sequence
first). ``A`` is the leave-one-out advantage without std scaling (``advantage=loo``, selected by
``conf/objective/coupled_grpo.yaml``). Defaults are the public recipe's: ``eps = eps_high = 0.5``,
``beta = 0.01``, ``mu = 2`` (``num_iterations``); its lr 1e-6 and ``G = 10`` (``num_generations``) are
the optimizer's and the task's keys, which the CPU job keeps at the project's (lr 3e-4 for the tiny
model; ``task.group_size`` 8).

Source: DiffuCoder (Gong et al. 2025), apple/ml-diffucoder @ f735e01, ``src/open_r1/coupled_grpo.py``
(``compute_loss``: the ratio, the clip with ``epsilon_low = epsilon_high``, the per-token k3 KL added
before the masked mean over ``completion_mask``; ``_generate_and_score_completions``: old and reference
log-probs on each iteration's mask seed, ``leave_one_out = True``). Deviations:

- masks: the estimator's (one ``t`` per batch from the run seed, rollout id and iteration; exact
  complement; see ``likelihood/complementary.py``), where the public code reseeds the global generator
  with ``mask_seeds`` drawn per rollout (``random_masking``) and reuses each uniform row across
  micro-batches;
- the token mean runs over the whole rollout batch (gathered across processes); the public loss is the
  token mean of each per-device micro-batch, averaged over gradient-accumulation steps and devices,
  which weighs tokens equally only when the micro-batches hold equally many;
- the reference policy is the warm start, fixed; the public recipe syncs TRL's reference model to the
  policy every 64 steps (``sync_ref_model``);
- the KL is computed only when ``beta > 0`` (as there) and aggregated on its own: the same value as the
  public per-token sum, since both are token means over the completion mask (``kl_tokens=ignored``, a
  GRPO option, restricts it to the tokens the reward ignores);
- clip metrics are ours (``ratio/clip_frac_low|high`` over completion tokens); the public trainer's
  ``clip_ratio`` broadcasts a ``(B, 1)`` advantage against ``(B, 1, L)`` ratios into a ``(B, B, L)`` mask;
- ``share_masks_with_old=false`` (fresh masks for the new policy) and the other GRPO options stay
  available; the public code shares masks.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffusion_rl.rl.objectives.base import OBJECTIVES
from diffusion_rl.rl.objectives.config import LikelihoodNeed
from diffusion_rl.rl.objectives.grpo import GRPO, GRPOConfig, grpo_loss


@dataclass
class CoupledGRPOConfig(GRPOConfig):
    name: str = "coupled_grpo"
    mu: int = 2  # the recipe's num_iterations
    beta: float = 0.01  # the recipe's k3 KL weight
    agg: str = "token-mean"  # the public loss and KL: the mean over every completion token of the batch
    # eps = eps_high = 0.5 (GRPO's defaults) are the recipe's epsilon


# GRPO's clipped per-token surrogate (rl/objectives/grpo.py), here averaged over every completion token of
# the batch (agg=token-mean): coupled-GRPO differs from GRPO in its masks and defaults, not in its loss
coupled_grpo_loss = grpo_loss


@OBJECTIVES.register("coupled_grpo")
class CoupledGRPO(GRPO):
    """GRPO (its loss, ``coupled_grpo_loss``, its scoring and its KL) with coupled-GRPO's config and estimator."""
    uniform_likelihoods = ()  # its coupled masks need a mask token (GRPO's uniform-noise likelihoods do not apply)

    config_class = CoupledGRPOConfig
    needs_likelihood = LikelihoodNeed(
        "coupled_grpo scores per token: use complementary (its own), one_step or stratified", per_token=True)
