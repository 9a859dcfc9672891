"""Rollouts from an approximate sampler: how far they are from the policy the loss assumes, and the
truncated importance-sampling correction (``objective.behaviour_correction``).

Every objective treats its rollouts as samples of ``pi_theta_old`` as its likelihood estimator sees
it. A sampler with ``sampler.kv_cache=prefix|dual`` (stale keys and values) or any other approximation
draws them from a slightly different policy ``q``. The sampler records its own temperature-1
log-probability of every token it committed, from the logits it committed it with
(``Rollout.sampler_logp``, or the trajectory's per-step values for EGSPO), and each objective puts it
in the units of its ratio (:meth:`~diffusion_rl.rl.objectives.base.Objective.sampler_units`). Per unit::

    mismatch = log q(unit) - log pi_old(unit)          rollout/mismatch_log_ratio (mean, std)
    w        = min(exp(-mismatch), cap)                objective.behaviour_correction=tis

``tis`` multiplies each unit's policy-gradient term by the detached ``w`` (the truncated importance
sampling of autoregressive RL for the same sampler/trainer gap; Yao et al. 2025, "Your efficient RL
framework secretly brings you off-policy RL training"); the KL penalty is not weighted. In the
shared loss template it scales the advantages, which is the same for every loss of this project:
each is positively homogeneous in ``A`` per unit (GRPO's ``-min(rho A, clip(rho) A)``, StableDRL's
``-w_j A_j ELBO_j``, EGSPO's clipped step terms).

What is comparable, per estimator (``log pi_old`` is the estimator at ``theta = theta_old``):

- **stepwise** (EGSPO, EGSPO-SA): the same quantity twice, the log-probability of a step's committed
  tokens given the state before it, once from the sampler's logits and once from a full forward on
  the replayed state. The replay uses exactly the committed sets the sampler chose, so with the exact
  sampler the mismatch is 0 up to float batching, and a non-zero value is the sampler's
  approximation alone (stale cache). Parallel decoding (``decode=threshold``) is no mismatch here:
  the step's action is its committed set, scored as the product of the same marginals either way.
  With ``objective.old_logp=recorded`` the old log-probs *are* the sampler's: mismatch 0, ``w = 1``.
- **one_step** (d1): per completion token, the sampler's log-probability at commit time (given the
  partly decoded state) against d1's (given a fully masked completion). Different conditionals of the
  same model: the mismatch is not 0 even for the exact sampler (it holds d1's mean-field gap); a
  sampler option shows up as a change of it. ``tis`` corrects towards the estimator's mean-field
  policy, which is what d1's objective assumes it sampled from.
- **elbo / staircase** (sequence units): the sampler's per-token log-probabilities reduced the way the
  estimator reduces its masked tokens, as if every scored token were masked at ``t = 1`` (the sum for
  ``weighting=inverse_t``, the mean for ``mean``, per block for the staircase). The ELBO is a bound,
  so here too the exact sampler has a non-zero mismatch; compare options, not the value to 0.

- **complementary** (coupled-GRPO, per token): as for one_step, the sampler's token log-probability
  against an estimate that averages the fully masked conditional with a partly masked one weighted
  ``1/t``: not 0 for the exact sampler either.
- **stratified** (ESPO, per position): the sampler's token log-probability against the position's
  weighted ELBO term, equal only on average; ESPO's ratio is per sequence, so it refuses ``tis``.
- **MDPO's predictions** (per masked position of a trained step): the log of the confidence the
  sampler recorded for the token it predicted there (its temperature-``tau`` probability) against the
  rollout policy's replay on the recorded state: the same quantity twice, 0 up to float batching
  with the exact sampler. MDPO's loss has no ratio, so it refuses ``tis``.

Positions filled with EOS by ``stop_after_eos`` carry log-probability 0 (a rule, not a draw); they
lie after the first EOS, outside the completion mask, and count only where an estimator scores them
(``likelihood.score_after_eos=true``).
"""

from __future__ import annotations

import torch

BEHAVIOUR_CORRECTIONS = ("none", "tis")


def tis_weights(mismatch: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights ``min(exp(-mismatch), cap)``, detached. (B, U) -> (B, U)"""
    return torch.exp(-mismatch.detach().float()).clamp(max=cap)


def mismatch_metrics(mismatch: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None = None,
                     cap: float = float("inf")) -> dict[str, torch.Tensor]:
    """``rollout/mismatch_log_ratio`` (mean over the units that count) and ``..._std``; with TIS
    weights also ``tis/weight_mean`` and ``tis/clip_frac`` (share of units at the cap). Detached."""
    with torch.no_grad():
        m = mask.bool().expand_as(mismatch)
        vals = mismatch.detach().float()[m]
        if vals.numel() == 0:
            vals = mismatch.new_zeros(1, dtype=torch.float32)
        out = {"rollout/mismatch_log_ratio": vals.mean(),
               "rollout/mismatch_log_ratio_std": vals.std() if vals.numel() > 1 else vals.new_zeros(())}
        if weights is not None:
            w = weights.expand_as(mismatch)[m] if bool(m.any()) else weights.new_ones(1)
            out["tis/weight_mean"] = w.mean()
            out["tis/clip_frac"] = (w >= cap).float().mean()
        return out


def behaviour_correction(advantages: torch.Tensor, old_logp: torch.Tensor | None, sampler_logp: torch.Tensor | None,
                         mask: torch.Tensor, mode: str, cap: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The advantages ``(N, U)`` times the truncated importance weights with ``mode=tis`` (as they are with
    ``none``) and the mismatch metrics, from the old policy's units ``old_logp`` and the sampler's
    ``sampler_logp``, both (N, U), the units that count ``mask`` (N, U); a pure function of tensors.
    ``old_logp`` or ``sampler_logp`` None (not scored, not recorded): no mismatch to measure, and ``tis``,
    which needs both, raises."""
    if old_logp is None:
        if mode != "none":  # needs_old_logp() must say True then
            raise RuntimeError(f"objective.behaviour_correction={mode} needs the behaviour "
                               "policy's values, which this objective did not compute")
        return advantages, {}
    if sampler_logp is None:
        if mode != "none":
            raise RuntimeError(f"objective.behaviour_correction={mode} needs the sampler's "
                               "log-probabilities, which this rollout does not carry")
        return advantages, {}
    mismatch = sampler_logp.to(old_logp.dtype) - old_logp.detach()  # (N, U) log q - log pi_old
    if mode == "none":
        return advantages, mismatch_metrics(mismatch, mask)
    w = tis_weights(mismatch, cap)  # (N, U)
    return advantages * w, mismatch_metrics(mismatch, mask, w, cap)
