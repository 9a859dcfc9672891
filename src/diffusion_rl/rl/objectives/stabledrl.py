"""StableDRL: unconditional clipping plus per-group self-normalisation of ELBO ratios
(docs/methods.md §4).

Per sequence ``j`` of a prompt's group of ``G``::

    l_j  = sg(ELBO_theta(x_j) - ELBO_old(x_j))              log importance ratio
    lt_j = clamp(l_j, lo, hi)                                whatever the sign of A_j
    w_j  = exp(lt_j - logsumexp_k lt_k)                       normalize=self (softmax in the group)
         = exp(lt_j) / G                                      normalize=group_size (ablation)
    loss = mean over groups of  -sum_j w_j * A_j * ELBO_theta(x_j)

``clip=paper`` (default): ``hi = log(1 + eps)``, ``lo = log(1 - eps)`` if ``eps < 1`` else none;
``clip=cap`` (the public code): ``hi = log(eps)``, no lower bound; ``clip=none``. The weights are
detached, so the gradient ``-sum_j w_j A_j grad ELBO_theta(x_j)`` is a convex combination of the
per-sample terms.

Source: the StableDRL paper ("clip + self-normalisation", eps = 5) and its public code, which builds
on SPG's trainer (``use_snis``, ``ais_clip_iw``, SPG's masking and ELBO/EUBO code). Deviations, as
read from a public SPG-based implementation of it (not verified against every release):

- the softmax runs inside each prompt's group, never across the batch (that implementation
  normalises over the whole local batch);
- ``share_masks_with_old=true`` (default) evaluates the old and the new ELBO on identical masks
  (seeds ``mask_seeds(run_seed, rollout, j, inner_iter)``), so ``l_j = 0`` exactly at
  ``theta = theta_old``; ``false`` draws fresh masks for the new policy (seeds from the inner
  iteration plus a salt), the public code's regime of largest ratio noise. That code computes the
  old ELBO once per rollout; here it is recomputed (no grad) every inner iteration on that
  iteration's masks (``old_policy=cached``: computed for every iteration's masks right after the
  rollout, from the same weights);
- ``surrogate=spg_mix`` (SPG's ``logp_estimation=mix``): for ``A_j <= 0`` the loss uses
  ``(1 - mix_weight) * ELBO + mix_weight * EUBO`` of the same masks (``eubo_beta = 1.5``); the
  weights always come from the ELBO ratio, as there. Both bounds are per-token averages in that
  code, so spg_mix requires ``likelihood.weighting=mean``;
- KL anchor (``beta``; the SPG / StableDRL scripts run with ``beta = 0``, here 0.04 by default: on the
  embedded Sudoku model the paper's setting collapsed, 0.78 -> 0.61 cell accuracy, because the reward
  ignores the given cells and nothing else holds their copying): ``beta * k3(ref, theta)`` averaged
  over the masked tokens of each of the new policy's Monte Carlo samples, then over samples and
  sequences, the reference scored on the same masks (one extra forward without gradients). It is
  added outside the weighted sum, so the weights and their ESS are unchanged. A per-token k3 on the
  ELBO's terms, not on the sequence ELBO: the difference of two sequence ELBOs is tens of nats and
  its exponential overflows.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.elbo import ELBOEstimator, eubo_from_logps
from diffusion_rl.rl.objectives.base import (
    OBJECTIVES,
    Forward,
    Objective,
    ObjectiveConfig,
    Scores,
    StepContext,
    ratio_metrics,
)

log = logging.getLogger(__name__)
_LOG_W_MAX = 80.0  # exp(80) ~ 5.5e34: keeps the unnormalised group_size weights finite in float32


@dataclass
class StableDRLConfig(ObjectiveConfig):
    name: str = "stabledrl"
    mu: int = 2  # the paper's inner updates per rollout batch
    eps: float = 5.0  # the paper's best trade-off; 100 or 1000 bring the collapse back
    clip: str = "paper"  # paper | cap | none
    normalize: str = "self"  # self | group_size
    surrogate: str = "elbo"  # elbo | spg_mix
    eubo_beta: float = 1.5  # spg_mix only
    mix_weight: float = 0.5  # spg_mix only: weight of the EUBO for A <= 0

    def validate(self) -> None:
        super().validate()
        if not self.eps > 0:
            raise ConfigError("objective.eps", self.eps, "must be > 0")
        if self.clip not in ("paper", "cap", "none"):
            raise ConfigError("objective.clip", self.clip, "allowed: paper, cap, none")
        if self.normalize not in ("self", "group_size"):
            raise ConfigError("objective.normalize", self.normalize, "allowed: self, group_size")
        if self.surrogate not in ("elbo", "spg_mix"):
            raise ConfigError("objective.surrogate", self.surrogate, "allowed: elbo, spg_mix")
        if not self.eubo_beta > 0:
            raise ConfigError("objective.eubo_beta", self.eubo_beta, "must be > 0")
        if not 0 <= self.mix_weight <= 1:
            raise ConfigError("objective.mix_weight", self.mix_weight, "must be in [0, 1]")


def clip_bounds(eps: float, clip: str) -> tuple[float, float]:
    """``(lo, hi)`` of the clamp on log ratios; infinities mean no bound."""
    if clip == "paper":
        return (math.log(1 - eps) if eps < 1 else -math.inf), math.log(1 + eps)
    if clip == "cap":
        return -math.inf, math.log(eps)
    if clip == "none":
        return -math.inf, math.inf
    raise ValueError(f"unknown clip {clip!r}")


def group_weights(log_ratio: torch.Tensor, group_size: int, eps: float, clip: str = "paper",
                  normalize: str = "self") -> tuple[torch.Tensor, torch.Tensor]:
    """Detached weights ``w`` and their normalised form ``w / sum_group w``, both (N/G, G).

    The softmax runs over each prompt's group only (rows of the ``(N/G, G)`` view).
    """
    lr = log_ratio.detach().float().view(-1, group_size)  # (N/G, G)
    lo, hi = clip_bounds(eps, clip)
    lt = lr.clamp(lo, hi)  # infinite bounds are no-ops
    w_norm = torch.softmax(lt, -1)  # exp(lt_j) / sum_k exp(lt_k), computed stably
    if normalize == "self":
        return w_norm, w_norm
    if normalize == "group_size":
        return lt.clamp(max=_LOG_W_MAX).exp() / group_size, w_norm
    raise ValueError(f"unknown normalize {normalize!r}")


def stabledrl_loss(
    logp: torch.Tensor,  # (B, 1) ELBO_theta with grad; B = num_groups * G, prompt-major
    old_logp: torch.Tensor,  # (B, 1) ELBO_old
    advantages: torch.Tensor,  # (B, 1)
    mask: torch.Tensor,  # (B, 1) every sequence counts
    cfg: StableDRLConfig,
    *,
    group_size: int,
    surrogate: torch.Tensor | None = None,  # (B, 1) term multiplied by w*A (default: logp)
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """StableDRL loss and its metrics; a pure function of tensors, computed in float32 log space."""
    G = group_size
    x = logp.float()
    surr = x if surrogate is None else surrogate.float()
    adv = advantages.float().detach().reshape(-1, G)  # (N/G, G)
    lr = (x.detach() - old_logp.detach().float()).reshape(-1, G)  # (N/G, G) raw log ratios
    w, w_norm = group_weights(lr, G, cfg.eps, cfg.clip, cfg.normalize)  # (N/G, G) each, detached
    lo, hi = clip_bounds(cfg.eps, cfg.clip)
    loss = -(w * adv * surr.reshape(-1, G)).sum(-1).mean()
    metrics = ratio_metrics(lr, torch.ones_like(lr), lr < lo, lr > hi)
    metrics["weights/ess"] = (1.0 / w_norm.pow(2).sum(-1)).mean()
    metrics["weights/max"] = w.max()
    return loss, metrics


@OBJECTIVES.register("stabledrl")
class StableDRL(Objective):
    config_class = StableDRLConfig
    cfg: StableDRLConfig
    policy_loss = staticmethod(stabledrl_loss)

    def __init__(self, cfg: StableDRLConfig, likelihood):
        super().__init__(cfg, likelihood)
        if cfg.mu == 1 and cfg.share_masks_with_old and cfg.clip != "none":
            log.warning("objective.eps=%g cannot act: with mu=1 and masks shared with the old policy every "
                        "log-ratio is exactly 0. Clipping acts with fresh masks (objective.share_masks_with_old="
                        "false) or several inner updates (objective.mu > 1); the report shows the clipped share",
                        cfg.eps)
        if likelihood.per_token:
            raise ConfigError("likelihood.name", likelihood.cfg.name,
                              "StableDRL needs a sequence-level estimator: elbo or staircase")
        if cfg.surrogate == "spg_mix":
            if not isinstance(likelihood, ELBOEstimator):
                raise ConfigError("objective.surrogate", cfg.surrogate, "spg_mix needs likelihood=elbo")
            if likelihood.cfg.weighting != "mean":  # ELBO and EUBO must both be per-token averages
                raise ConfigError("likelihood.weighting", likelihood.cfg.weighting,
                                  "objective.surrogate=spg_mix needs likelihood.weighting=mean (the SPG code's scale)")

    def score(self, ctx: StepContext, forward: Forward, role: str) -> Scores:
        ro, c = ctx.rollout, self.cfg
        data = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.scored_mask)
        s = self.likelihood.sample(forward, *data, self.mask_seeds(ctx, role), pinned=ro.pinned)
        elbo = self.likelihood.reduce(s)  # (n,)
        surrogate = None
        if role == "policy" and c.surrogate == "spg_mix":
            eubo = eubo_from_logps(s.token_logps, s.masked, s.t, c.eubo_beta)
            mix = (1 - c.mix_weight) * elbo + c.mix_weight * eubo
            surrogate = torch.where(ro.advantages > 0, elbo, mix)[:, None]
        # the KL anchor's units: every Monte Carlo sample's masked tokens, (n, K, L)
        return Scores(elbo[:, None], torch.ones_like(elbo)[:, None], kl_logp=s.token_logps.transpose(0, 1),
                      kl_mask=s.masked.transpose(0, 1), surrogate=surrogate)
