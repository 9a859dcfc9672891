"""BGPO: a clipped sequence ratio per masked copy, linear in the copy's ELBO where ``A > 0``, so the
copies separate and each is one forward and one backward.

With ``E_bj`` copy ``j``'s estimate of sequence ``b``'s log-likelihood (``likelihood=even_counts``:
``K = 16`` copies whose mask counts ``x_bj`` spread evenly over ``1..n_b``, ``E_bj = (n_b / x_bj) *
sum of the masked tokens' log-probs``), ``E^old_bj`` the old policy's on the same masks, ``L`` the
padded completion length and ``A_b`` the advantage::

    z_bj = (E_bj - E^old_bj) / L
    r_bj = 1 + z_bj            if A_b > 0
         = exp(z_bj)           otherwise
    l_bj = max(-A_b r_bj, -A_b clip(r_bj, 1 - eps, 1 + eps_high))             PPO's clip, eps = 0.2
         = min(l_bj, -A_b c)                                  if A_b < 0       dual clip, c = 3
    loss = (1/K) sum_j  sum_b n_b l_bj / sum_b n_b

The last line is the token mean of each copy (a row's ``l_bj`` counts once per covered position), then
the mean over copies. Why the two ratios: the ratio of the K-copy ELBOs, ``exp(mean_j z_bj)``, ties
every copy into one graph, and the objective ``A exp(mean_j z)`` is bounded below by a mean of
per-copy terms, through ``exp(m) >= 1 + m`` where ``A > 0`` and Jensen's ``exp(mean z) <= mean exp(z)``
where ``A < 0``. The loss is then a sum over copies, so the module backpropagates each copy as soon as
it is scored (:meth:`BGPO.loss_parts`): one forward and one backward per copy, memory flat in ``K``.
No KL by default. ``A = (r - mean) / (std + 1e-6)`` with the unbiased std (``advantage=group_std_verl``,
verl's GRPO advantage); ``optim=bgpo`` is the recipes' AdamW (lr 5e-7, weight decay 0.01, betas (0.9,
0.999), total-norm clip 1, constant) for full fine-tuning (``model.lora_r=0`` on the real-model presets,
which default to LoRA); 16 prompts x 8 samples per batch, the task's default.

Source: BGPO (the original THU-KEG/BGPO is not reachable) as DARE implements it, yjyddq/DARE @ 83ae8a3:
``verl/trainer/ppo/dllm_core_algos.py`` ``compute_policy_loss_bgpo`` (L77-150: the two ratios, written
``exp(log(1 + z))``, the clip, the dual clip, ``agg_loss``) and ``_forward_process_bgpo`` (L593-631, the
masks: ``likelihood/even_counts.py``); ``verl/workers/actor/llada_dp_actor_bgpo.py``
(``_forward_micro_batch`` L93-124: ``E / response_length``; ``update_policy`` L290-377: the old
estimates of ``compute_log_prob`` on the stored masks, one forward and ``backward`` per copy, the loss
divided by ``mc_num``); ``recipe/llada/run_bgpo_llada_8b_instruct.sh`` (``mc_num = n_l = 16``, lr 5e-7,
batch 16 x 8, one update per batch, ``use_kl_loss=False``, token-mean); ``verl/trainer/config/
ppo_trainer.yaml`` (clip 0.2 / 0.2, ``clip_ratio_c`` 3, weight decay 0.01, grad clip 1). The repository
holds no test of BGPO's loss. Deviations:

- *1 + z <= 0 with A > 0.* DARE's ``log(1 + z)`` is NaN there and verl then skips the whole update (a
  non-finite gradient norm); here the ratio is ``1 + z`` itself, finite, its loss ``-A (1 + z)``
  unclipped, and the share of such units is logged as ``bgpo/nonpositive_ratio_frac``.
- *Aggregation.* The token mean runs over the whole rollout batch (gathered across processes); DARE's
  over each dynamically packed micro-batch, scaled by its share of rows: the same value whenever every
  row covers the same number of positions, as in DARE's LLaDA runs (every generated position).
- *Covered positions.* ``elbo_tokens=all`` (default) covers every generated position but the task's
  pinned ones (DARE's LLaDA rollout marks the whole response valid, so there ``n_b = L``);
  ``completion`` covers the scored completion up to the first EOS: ``n_b`` is then each row's count,
  weighting its share of the token mean, while ``L`` stays the padded length, as DARE's formula reads
  with an attention mask that ended at EOS.
- *Masks.* Drawn per row from local generators (``mask_seeds``) for the rollout, as DARE draws them once
  per batch: every inner update reads the same masks and the old estimates are computed once per
  rollout (``share_masks_with_old=false`` gives the new policy fresh masks at each update instead).
- ``backward_per_copy=false`` computes the same loss with every copy in one graph (memory grows with
  ``K``; the values and gradients are equal: ``tests/unit/rl/test_bgpo.py``).
- ``beta > 0`` adds the shared k3 KL to the reference on each copy's masked tokens (DARE: none);
  ``behaviour_correction=tis`` is refused (its weights are per token, BGPO's ratio per copy).
- Block models: DARE's SDAR and LLaDA2 actors score each block against its clean prefix; that variant
  is not implemented, and on a block model the copies are scored as on a masked one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError, check_choice
from diffusion_rl.likelihood.base import mask_seeds
from diffusion_rl.likelihood.even_counts import EvenCountsEstimator, copy_estimates
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.objectives.base import OBJECTIVES, LogpUnits, Objective, StepContext
from diffusion_rl.rl.objectives.behaviour import behaviour_correction
from diffusion_rl.rl.objectives.config import LikelihoodNeed, ObjectiveConfig, check_clip
from diffusion_rl.rl.objectives.losses import agg_loss, masked_mean, ratio_metrics


@dataclass
class BGPOConfig(ObjectiveConfig):
    name: str = "bgpo"
    mu: int = 1  # ppo_epochs 1 on one mini-batch per rollout batch: one update per rollout
    beta: float = 0.0  # use_kl_loss=False in every BGPO recipe
    eps: float = 0.2  # clip_ratio_low: r in [1 - eps, 1 + eps_high]
    eps_high: float = 0.2  # clip_ratio_high
    dual_clip: float = 3.0  # clip_ratio_c: where A < 0 the loss is at most -A * dual_clip
    # positions a copy masks from and the token mean counts: all (every generated position but the pinned
    # ones: DARE's) | completion (the scored completion, up to the first EOS)
    elbo_tokens: str = "all"
    # one forward and backward per copy (memory flat in the copies); false: every copy in one graph
    backward_per_copy: bool = True

    def validate(self) -> None:
        super().validate()
        check_clip(self.eps, self.eps_high)
        if not self.dual_clip > 1:
            raise ConfigError("objective.dual_clip", self.dual_clip, "must be > 1 (DARE asserts it)")
        check_choice("objective.elbo_tokens", self.elbo_tokens, ("all", "completion"))
        if self.behaviour_correction != "none":
            raise ConfigError("objective.behaviour_correction", self.behaviour_correction,
                              "bgpo takes none: tis weights are per token, BGPO's ratio is per copy")


def bgpo_loss(
    logp: torch.Tensor,  # (B, K, L) each copy's estimate E_bj, repeated over the positions, with grad
    old_logp: torch.Tensor,  # (B, K, L) the old policy's on the same masks
    advantages: torch.Tensor,  # (B, 1, 1)
    mask: torch.Tensor,  # (B, K, L) the covered positions of each row, the same for every copy
    cfg: BGPOConfig,
    *,
    group_size: int,
    surrogate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """BGPO's loss: per copy the dual-clipped PPO term on the linear (``A > 0``) or exponential ratio
    of ``z = (E - E_old) / L``, token mean, then mean over copies; a pure function of tensors."""
    L = logp.shape[-1]  # the padded completion length, DARE's response_length
    z = (logp.float() - old_logp.detach().float()) / L  # (B, K, L)
    adv = advantages.detach().float()
    pos = (adv > 0).expand_as(z)  # (B, K, L)
    ratio = torch.where(pos, 1 + z, torch.exp(torch.where(pos, torch.zeros_like(z), z)))  # no inf in the unused exp
    loss_pg = -adv * ratio
    loss_clip = -adv * ratio.clamp(1 - cfg.eps, 1 + cfg.eps_high)
    clipped = torch.maximum(loss_pg, loss_clip)  # PPO: the pessimistic of the two
    per_unit = torch.where(adv < 0, torch.minimum(clipped, -adv * cfg.dual_clip), clipped)  # (B, K, L)
    loss = agg_loss(per_unit, mask, "token-mean")  # = mean over copies of each copy's token mean
    with torch.no_grad():
        m = mask.float()
        log_ratio = torch.where(pos, torch.log(ratio.clamp_min(1e-6)), z)  # (B, K, L); 1 + z <= 0 logs as 1e-6
        low, high = (ratio < 1 - cfg.eps) & (adv < 0), (ratio > 1 + cfg.eps_high) & (adv > 0)
        metrics = ratio_metrics(log_ratio, m, low, high)
        metrics["bgpo/dual_clip_frac"] = masked_mean(((ratio > cfg.dual_clip) & (adv < 0)).float(), m)
        metrics["bgpo/nonpositive_ratio_frac"] = masked_mean((pos & (ratio <= 0)).float(), m)
        n = mask[..., 0, :].sum(-1).float()  # (B,) covered positions of each row
        per_token = logp[..., 0].detach().float() / n.clamp_min(1)[:, None]  # (B, K) E_bj / n_b
        rows = (n > 0).float()
        metrics["bgpo/elbo_per_token"] = masked_mean(per_token.mean(-1), rows)
        if per_token.shape[1] > 1:  # the copies' spread: the Monte Carlo noise of one copy
            metrics["bgpo/copy_std_per_token"] = masked_mean(per_token.std(-1), rows)
    return loss, metrics


@OBJECTIVES.register("bgpo")
class BGPO(Objective):
    config_class = BGPOConfig
    cfg: BGPOConfig
    policy_loss = staticmethod(bgpo_loss)
    likelihood: EvenCountsEstimator

    needs_likelihood = LikelihoodNeed("bgpo scores its masked copies one at a time: use likelihood=even_counts",
                                      kinds=(EvenCountsEstimator,))

    def covered(self, ctx: StepContext) -> torch.Tensor:
        """(n, L) the positions the copies mask from and the token mean counts (``elbo_tokens``)."""
        ro = ctx.rollout
        return ro.unpinned_mask if self.cfg.elbo_tokens == "all" else ro.scored_mask

    def mask_seeds(self, ctx: StepContext, role: str) -> list[int]:
        """The rollout's masks for every inner update (DARE draws them once per batch); fresh ones for
        the new policy at each update with ``share_masks_with_old=false``."""
        if not self.cfg.share_masks_with_old:
            return super().mask_seeds(ctx, role)
        ro = ctx.rollout
        return mask_seeds(ctx.run_seed, ro.rollout_id, ro.completion_ids.shape[0], 0, ro.shard.offset)

    def old_logp_iter(self, inner_iter: int) -> int:
        return 0  # the old estimates sit on the rollout's masks: one set per rollout

    def logp_units(self, ctx: StepContext, forward: Forward, role: str, copies: list[int] | None = None) -> LogpUnits:
        """Every copy's estimate (or those of ``copies``) repeated over the covered positions: (n, C, L)."""
        ro = ctx.rollout
        covered = self.covered(ctx)  # (n, L)
        s = self.likelihood.sample(forward, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, covered,
                                   self.mask_seeds(ctx, role), pinned=ro.pinned, copies=copies)
        est = copy_estimates(s).t()  # (n, C)
        L = covered.shape[1]
        mask = covered[:, None, :].expand(-1, est.shape[1], L)  # (n, C, L)
        # the KL anchor's units: each copy's masked tokens
        return LogpUnits(est[..., None].expand(-1, -1, L), mask, kl_logp=s.token_logps.transpose(0, 1),
                      kl_mask=s.masked.transpose(0, 1))

    def unit_advantages(self, ctx: StepContext) -> torch.Tensor:
        return super().unit_advantages(ctx)[..., None]  # (n, 1, 1): over copies and positions

    def sampler_units(self, ctx: StepContext) -> torch.Tensor | None:
        """The sampler's log-probability of the covered tokens, against each copy's estimate. (n, 1, 1)"""
        ro = ctx.rollout
        if ro.sampler_logp is None:
            return None
        return self.likelihood.sampler_units(ro.sampler_logp, self.covered(ctx))[:, None, None]

    def loss_parts(self, ctx: StepContext) -> Iterator[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        """One part per copy, ``1/K`` of the template's loss on that copy alone (its KL term too); the
        update's metrics, over every copy, come with the last part."""
        if not self.cfg.backward_per_copy:
            yield self.loss(ctx)
            return
        ro, c, g = ctx.rollout, self.cfg, ctx.rollout.shard.gather
        K = self.likelihood.cfg.num_samples
        alike = ctx.policy_is_old and self.old_logp_like_policy()
        old_all = None if alike else g(self.old_logp(ctx))  # (N, K, L) without gradients
        adv = g(self.unit_advantages(ctx))  # (N, 1, 1)
        news, olds, masks = [], [], []
        kl = torch.zeros(())
        for j in range(K):
            s = self.logp_units(ctx, ctx.policy, "policy", copies=[j])  # (n, 1, L) with gradients
            new, mask = g(s.logp), g(s.mask)
            old = new.detach() if old_all is None else old_all[:, j:j + 1]
            loss, _ = self.policy_loss(new, old, adv, mask, c, group_size=ro.group_size)
            if c.beta > 0 and ctx.ref_policy is not None:
                with torch.no_grad():
                    ref = self.logp_units(ctx, ctx.ref_policy, "ref", copies=[j])
                kl_j = self.kl_term(s, ref, g, ro.group_size)
                loss = loss + c.beta * kl_j
                kl = kl.to(kl_j.device) + kl_j.detach() / K
            news.append(new.detach())
            olds.append(old)
            masks.append(mask)
            metrics: dict[str, torch.Tensor] = {}
            if j == K - 1:  # the update's metrics, as loss() gives them
                with torch.no_grad():
                    new_all, old_cat, mask_all = torch.cat(news, 1), torch.cat(olds, 1), torch.cat(masks, 1)
                    _, metrics = self.policy_loss(new_all, old_cat, adv, mask_all, c, group_size=ro.group_size)
                    q = self.sampler_units(ctx)  # (n, 1, 1) or None
                    metrics.update(behaviour_correction(adv, old_cat, None if q is None else g(q), mask_all,
                                                        c.behaviour_correction, c.tis_cap)[1])
                if c.beta > 0 and ctx.ref_policy is not None:
                    metrics["train/kl"] = kl
                metrics.update(self.extra_metrics(ctx))
            yield loss / K, metrics
