"""wd1: ratio-free policy optimisation as a weighted log-likelihood, softmax weights of the advantages.

For a prompt's group of ``G`` samples with ``A_i = r_i - mean_G(r)`` and ``S_i`` the sum of sample
``i``'s per-token log-probs under d1's one-step estimate (completion fully masked, each prompt token
masked with probability 0.15)::

    w+_i = softmax_G(A)_i        w-_i = softmax_G(-A)_i          (inside the group)
    loss = mean over groups of  -sum_i w+_i S_i + sum_i w-_i S_i

The first term raises the likelihood of the group's better samples, the second lowers that of its
worse ones ("negative sample unlearning"); the weights are detached, so only the current policy's
likelihood is ever approximated: no ratio, no clip, no KL in the method.

Source: Tang et al. 2025, "wd1: Weighted Policy Optimization for Reasoning in Diffusion Language
Models" (arXiv:2507.08838); xiaohangt/wd1 @ 0898985, ``wd1/trainers/rev_grpo_trainer.py``
``compute_loss`` (~L117-160; ``run/wll_NP_*.sh``: trainer_type ``wll_d1_neg``, 8 inner iterations on
Sudoku, 12 elsewhere, lr 3e-6, G = 6); ``negative_term=false`` is ``rev_grpo_trainer_psr.py``'s
positive-only variant (``wll_d1_pos_only``, ``run/wll_P_*.sh``). ``rev_grpo_ref_pol_trainer.py``
computes reference log-probs and leaves them out of its loss, the same loss as here. The paper's
wd1++ (stepwise weighting) has no public code at that commit (the latest) and is not implemented.
Deviations from the public code:

- the softmax runs inside each prompt's group; the public code normalises over the per-device
  micro-batch, which is one group only because its scripts set batch = G = 6;
- the loss is the mean over groups, as the public code's average over devices and accumulation steps
  of one group each;
- prompt masks are per sample (seeds ``mask_seeds(run_seed, rollout, sample, inner_iter)``; the
  public code seeds one mask per iteration for the batch), only real prompt tokens are masked, and
  the forward reads the attention mask (the public one passes none; its groups have no padding);
- inner updates: the dataclass keeps the public 8 uncorrected reuses of a rollout; the CPU Sudoku
  job runs 1 (``conf/objective/wd1.yaml``: 8 collapsed there);
- KL anchor: the public code computes none (its ``beta``/``epsilon`` are unused); here
  ``objective.beta`` (0.04 by default, the project's Sudoku anchor: its reward ignores the given
  cells) adds the shared per-token k3 KL to the warm start; ``beta=0`` is the public setting;
- ``ratio/*`` is a diagnostic the method does not use: the per-token log-ratio of the policy against
  the rollout (old) policy on the same prompt masks, ``ratio_diagnostic=true``, at one extra
  forward without gradients per update; ``false`` computes no old policy values at all (and
  keeps no frozen copy of it). Nothing is clipped, so ``ratio/clip_frac_*`` are 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.objectives.base import OBJECTIVES, LogpUnits, Objective, StepContext
from diffusion_rl.rl.objectives.config import LikelihoodNeed, ObjectiveConfig
from diffusion_rl.rl.objectives.losses import check_per_sample, ratio_metrics


@dataclass
class WD1Config(ObjectiveConfig):
    name: str = "wd1"
    mu: int = 8  # the public Sudoku scripts' inner iterations (12 on the other tasks), uncorrected
    negative_term: bool = True  # false: the positive-only variant (wll_d1_pos_only)
    # log the per-token log-ratio against the rollout policy (one forward without gradients per update)
    ratio_diagnostic: bool = True

    def validate(self) -> None:
        super().validate()
        if self.behaviour_correction != "none":
            raise ConfigError("objective.behaviour_correction", self.behaviour_correction,
                              "objective=wd1 takes none: its group softmax needs one advantage per sample")


def group_softmax_weights(advantages: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(A)`` and ``softmax(-A)`` inside each prompt's group: (B,) or (B, 1) -> (B/G, G) each, detached."""
    a = advantages.detach().float().reshape(-1, group_size)  # (B/G, G)
    return torch.softmax(a, -1), torch.softmax(-a, -1)


def wd1_loss(
    logp: torch.Tensor,  # (B, L) per-token log-probs with grad; B = num_groups * G, prompt-major
    old_logp: torch.Tensor | None,  # (B, L) the old policy's, or None (no diagnostic)
    advantages: torch.Tensor,  # (B, 1) one per sample
    mask: torch.Tensor,  # (B, L) completion tokens
    cfg: WD1Config,
    *,
    group_size: int,
    surrogate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """wd1's weighted log-likelihood loss and its metrics; a pure function of tensors (``surrogate`` unused)."""
    check_per_sample(advantages, "wd1")
    G = group_size
    seq = torch.where(mask.bool(), logp.float(), torch.zeros_like(logp, dtype=torch.float)).sum(-1)  # (B,) S_i
    S = seq.reshape(-1, G)  # (B/G, G)
    w_pos, w_neg = group_softmax_weights(advantages, G)  # (B/G, G) each
    per_group = -(w_pos * S).sum(-1)  # (B/G,)
    if cfg.negative_term:
        per_group = per_group + (w_neg * S).sum(-1)
    loss = per_group.mean()
    with torch.no_grad():
        metrics = {"weights/ess": (1.0 / w_pos.pow(2).sum(-1)).mean(), "weights/max": w_pos.max()}
        if old_logp is not None:
            lr = logp.float() - old_logp.float()  # (B, L) per-token log-ratio
            metrics.update(ratio_metrics(lr, mask))  # a diagnostic: nothing is clipped
    return loss, metrics


@OBJECTIVES.register("wd1")
class WD1(Objective):
    config_class = WD1Config
    cfg: WD1Config
    policy_loss = staticmethod(wd1_loss)

    needs_likelihood = LikelihoodNeed(
        "wd1 sums per-token log-probs: it needs a per-token estimator (one_step, d1's)", per_token=True)

    def needs_old_logp(self) -> bool:
        return self.cfg.ratio_diagnostic

    def logp_units(self, ctx: StepContext, forward: Forward, role: str) -> LogpUnits:
        # the weighted likelihood sums the tokens the reward reads; the KL anchor covers the completion
        # but a task's pinned tokens, which are shown to the model, so their log-probs mean nothing
        return self.token_logp(ctx, forward, role)
