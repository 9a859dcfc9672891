"""StableDRL: unconditional clipping plus per-group self-normalisation of ELBO ratios
(docs/methods.md §4).

Per sequence ``j`` of a prompt's group of ``G``::

    l_j  = sg(ELBO_theta(x_j) - ELBO_old(x_j))              log importance ratio
    lt_j = clamp(l_j, lo, hi)                                whatever the sign of A_j
    w_j  = exp(lt_j - logsumexp_k lt_k)                       normalize=self (softmax in the group)
         = exp(lt_j) / G                                      normalize=group_size (ablation)
    loss = mean over groups of  -sum_j w_j * A_j * ELBO_theta(x_j)

``clip=cap`` (default, the public code's ``ais_clip_iw``): ``hi = log(eps)``, no lower bound;
``clip=paper`` (the paper's ``clip_eps(rho)``): ``hi = log(1 + eps)``, ``lo = log(1 - eps)`` if
``eps < 1`` else none; ``clip=none``; ``clip=ppo`` (the ablation's "GRPO on ELBO ratios", with
``normalize=group_size``): PPO's *conditional* clip with cap's bounds, ``w_j = rho_j`` unless
``rho_j > eps`` with ``A_j > 0`` (then ``w_j = 0``: the sample's gradient is clipped away, as in GRPO's
``-min(rho A, clip(rho) A)``), so the gradient is GRPO's on sequence ratios with the same surrogate. The weights are detached, so the gradient
``-sum_j w_j A_j grad S_theta(x_j)`` is a convex combination of the per-sample terms, ``S`` the
surrogate below.

Source: the StableDRL paper ("clip + self-normalisation", eps = 5) and its public code,
JianyuanZhong/StableDRL @ 26ad014: ``networks/llada_svpo.py`` (``compute_loss_spg``: the clamp of
``log w`` at ``log(ais_clip_iw)`` and the softmax; ``_get_per_seq_logps_spg``: SPG's masks, ELBO and
EUBO; the old ELBO taken once at rollout time, ``generate_and_score_completions_spg``) and
``training/training_loop_spg_snis.py`` with ``configs/*_spg_snis.yaml``. The defaults are that code's
regime: ``likelihood=spg_blocks`` (SPG's block-random masks, 2 Monte Carlo samples, the ELBO a mean
over masked tokens, no 1/t), ``share_masks_with_old=false`` (the old policy's masks drawn once per
rollout, the new policy's fresh every inner iteration, so ``l_j`` is not 0 at the first update),
``mu = 2``, ``beta = 0`` (no reference model), ``advantage=group`` (``r - mean``, no std),
``surrogate=spg_mix`` (``surrogate=null``, the default, takes it wherever the likelihood gives SPG's
bound), and ``optim=stabledrl`` (lr 1e-6, weight decay 0.1, total-norm clip 0.2, linear
decay over 2000 steps). Deviations:

- the softmax runs inside each prompt's group; the public code normalises over its local batch,
  which is one group of 16 (8 generations x 2 repeats) per process in every config, so the two agree
  there. Its group of 16 is ``task.group_size=16``; the task's own group size is kept (8);
- ``surrogate=spg_mix`` (SPG's ``logp_estimation=mix``, the public code's loss): ``S_j`` is the ELBO
  for ``A_j > 0`` and ``(1 - mix_weight) * ELBO + mix_weight * EUBO`` of the same masks otherwise
  (``eubo_beta = 1.5``, ``mix_weight = 0.5``); the weights always come from the ELBO ratio, as there.
  Both bounds are per-token averages, so spg_mix needs ``likelihood=spg_blocks`` or ``likelihood=elbo``
  with ``weighting=mean``; ``surrogate=elbo`` uses the ELBO for every sample (the paper's equation,
  and what ``surrogate=null`` takes with any other likelihood: ``likelihood=staircase`` on a block model,
  the paper's SDAR regime, runs from ``model=tiny_block likelihood=staircase`` alone);
- ``share_masks_with_old=true`` evaluates the old and the new ELBO on identical masks (seeds
  ``mask_seeds(run_seed, rollout, j, inner_iter)``), so ``l_j = 0`` exactly at ``theta = theta_old``:
  the regime of every other public implementation (d1, ESPO), where the clip cannot act at ``mu = 1``;
- KL anchor (``beta > 0``, not in the public code): ``beta * k3(ref, theta)`` averaged over the masked
  tokens of each of the new policy's Monte Carlo samples, then over samples and sequences, the
  reference scored on the same masks (one extra forward without gradients). It is added outside the
  weighted sum, so the weights and their ESS are unchanged. A per-token k3 on the ELBO's terms, not
  on the sequence ELBO: the difference of two sequence ELBOs is tens of nats and its exponential
  overflows.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError, check_choice
from diffusion_rl.likelihood.elbo import ELBOEstimator, eubo_from_logps
from diffusion_rl.likelihood.spg_blocks import SPGBlocksEstimator
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.objectives.base import OBJECTIVES, LogpUnits, Objective, StepContext
from diffusion_rl.rl.objectives.config import ObjectiveConfig
from diffusion_rl.rl.objectives.losses import ratio_metrics

log = logging.getLogger(__name__)
CLIPS = ("cap", "paper", "none", "ppo")
_LOG_W_MAX = 80.0  # exp(80) ~ 5.5e34: keeps the unnormalised group_size weights finite in float32


@dataclass
class StableDRLConfig(ObjectiveConfig):
    name: str = "stabledrl"
    mu: int = 2  # num_iterations: 2 in every public config (the paper's inner updates per rollout)
    beta: float = 0.0  # no reference model in the public code
    share_masks_with_old: bool = False  # the public code draws the old and the new ELBO's masks apart
    eps: float = 5.0  # ais_clip_iw, the paper's best trade-off; 100 or 1000 bring the collapse back
    clip: str = "cap"  # cap (the public code: w <= eps) | paper (w in [1 - eps, 1 + eps]) | none | ppo (GRPO's)
    normalize: str = "self"  # self | group_size
    # spg_mix (the public code's SPG bound) | elbo | null: spg_mix where the likelihood gives SPG's bound
    # (likelihood=spg_blocks, the default; elbo with weighting=mean), elbo otherwise (staircase, the SDAR
    # regime of the paper, has no EUBO), as the run's log says
    surrogate: str | None = None
    eubo_beta: float = 1.5  # spg_mix only
    mix_weight: float = 0.5  # spg_mix only: weight of the EUBO for A <= 0

    def validate(self) -> None:
        super().validate()
        if not self.eps > 0:
            raise ConfigError("objective.eps", self.eps, "must be > 0")
        check_choice("objective.clip", self.clip, CLIPS)
        check_choice("objective.normalize", self.normalize, ("self", "group_size"))
        if self.surrogate is not None:  # null: the likelihood's
            check_choice("objective.surrogate", self.surrogate, ("elbo", "spg_mix"))
        if not self.eubo_beta > 0:
            raise ConfigError("objective.eubo_beta", self.eubo_beta, "must be > 0")
        if not 0 <= self.mix_weight <= 1:
            raise ConfigError("objective.mix_weight", self.mix_weight, "must be in [0, 1]")


def clip_bounds(eps: float, clip: str) -> tuple[float, float]:
    """``(lo, hi)`` of the clamp on log ratios; infinities mean no bound."""
    if clip == "paper":
        return (math.log(1 - eps) if eps < 1 else -math.inf), math.log(1 + eps)
    if clip in ("cap", "ppo"):
        return -math.inf, math.log(eps)
    if clip == "none":
        return -math.inf, math.inf
    raise ValueError(f"unknown clip {clip!r}")


def group_weights(log_ratio: torch.Tensor, group_size: int, eps: float, clip: str = "paper",
                  normalize: str = "self", advantages: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Detached weights ``w`` and their normalised form ``w / sum_group w``, both (N/G, G).

    The softmax runs over each prompt's group only (rows of the ``(N/G, G)`` view). ``clip=ppo`` reads
    the ``advantages`` (N,): a ratio above the bound with ``A > 0`` weighs 0 (its bound is an upper one
    only, :func:`clip_bounds`; a group with every weight at 0 weighs 0, not NaN).
    """
    lr = log_ratio.detach().float().view(-1, group_size)  # (N/G, G)
    lo, hi = clip_bounds(eps, clip)
    if clip == "ppo":
        if advantages is None:
            raise ValueError("clip=ppo needs the advantages")
        adv = advantages.detach().float().view(-1, group_size)  # (N/G, G)
        out = (lr > hi) & (adv > 0)  # clipped away: no gradient
        lt = torch.where(out, torch.full_like(lr, -math.inf), lr)
    else:
        lt = lr.clamp(lo, hi)  # infinite bounds are no-ops
    w_norm = torch.softmax(lt, -1).nan_to_num(0.0)  # exp(lt_j) / sum_k exp(lt_k), computed stably
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
    w, w_norm = group_weights(lr, G, cfg.eps, cfg.clip, cfg.normalize, adv)  # (N/G, G) each, detached
    lo, hi = clip_bounds(cfg.eps, cfg.clip)
    loss = -(w * adv * surr.reshape(-1, G)).sum(-1).mean()
    low, high = lr < lo, lr > hi
    if cfg.clip == "ppo":  # only the conditional clip's case counts as clipped (its bound is an upper one only)
        high = high & (adv > 0)
    metrics = ratio_metrics(lr, torch.ones_like(lr), low, high)
    metrics["weights/ess"] = (1.0 / w_norm.pow(2).sum(-1)).mean()
    metrics["weights/max"] = w.max()
    return loss, metrics


def gives_spg_bound(likelihood) -> bool:
    """Whether ``likelihood`` draws the masks SPG's bound (ELBO and EUBO as per-token means) is computed on."""
    if isinstance(likelihood, ELBOEstimator):
        return likelihood.cfg.weighting == "mean"
    return isinstance(likelihood, SPGBlocksEstimator)


@OBJECTIVES.register("stabledrl")
class StableDRL(Objective):
    config_class = StableDRLConfig
    cfg: StableDRLConfig
    policy_loss = staticmethod(stabledrl_loss)
    uniform_likelihoods = ("uniform_elbo",)  # a uniform-noise model's ELBO (the surrogate: the ELBO, no EUBO)

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
        self.surrogate = cfg.surrogate or ("spg_mix" if gives_spg_bound(likelihood) else "elbo")
        if cfg.surrogate is None:
            log.info("objective.surrogate=null: %s (likelihood=%s %s SPG's bound)", self.surrogate, likelihood.cfg.name,
                     "gives" if self.surrogate == "spg_mix" else "does not give")
        elif cfg.surrogate == "spg_mix":
            if not isinstance(likelihood, (SPGBlocksEstimator, ELBOEstimator)):
                raise ConfigError("objective.surrogate", cfg.surrogate, "spg_mix needs likelihood=spg_blocks or elbo; "
                                  f"with likelihood={likelihood.cfg.name} set objective.surrogate=elbo or null")
            if isinstance(likelihood, ELBOEstimator) and likelihood.cfg.weighting != "mean":  # ELBO and EUBO must both be per-token averages
                raise ConfigError("likelihood.weighting", likelihood.cfg.weighting,
                                  "objective.surrogate=spg_mix needs likelihood.weighting=mean (the SPG code's scale)")

    def logp_units(self, ctx: StepContext, forward: Forward, role: str) -> LogpUnits:
        ro, c = ctx.rollout, self.cfg
        data = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.scored_mask)
        s = self.likelihood.sample(forward, *data, self.mask_seeds(ctx, role), pinned=ro.pinned)
        elbo = self.likelihood.reduce(s)  # (n,)
        surrogate = None
        if role == "policy" and self.surrogate == "spg_mix":
            eubo = eubo_from_logps(s.token_logps, s.masked, s.t, c.eubo_beta)
            mix = (1 - c.mix_weight) * elbo + c.mix_weight * eubo
            surrogate = torch.where(ro.advantages > 0, elbo, mix)[:, None]
        # the KL anchor's units: every Monte Carlo sample's masked tokens, (n, K, L)
        return LogpUnits(elbo[:, None], torch.ones_like(elbo)[:, None], kl_logp=s.token_logps.transpose(0, 1),
                      kl_mask=s.masked.transpose(0, 1), surrogate=surrogate)
