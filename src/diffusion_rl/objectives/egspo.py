"""EGSPO and EGSPO-SA: policy gradient over a few entropy-selected denoising steps (SPEC §4).

Denoising is an MDP (state: the partially masked sequence; action: the tokens committed at a step;
reward only at the end). Per sample, ``K`` of the ``T`` recorded steps are trained (``select``:
``entropy`` = the ``K`` highest step entropies ``H_s``; ablations ``random``, ``uniform``). Per
selected step ``s``, with ``log pi(step s)`` the stepwise likelihood (``likelihood/stepwise.py``):

    rho_s  = exp(log pi_theta(step s) - log pi_old(step s))
    loss_s = -min(rho_s A_s, clip(rho_s, 1 - eps, 1 + eps_high) A_s) + beta * k3(ref, theta)

averaged over the selected steps of a sample, then over samples.

- ``egspo``: ``A_s = r(x_0) - mean_G(r)`` for every selected step (the rollout's advantages).
- ``egspo_sa`` (stepwise advantages): ``V_s = r(xhat_s)``, the reward of the greedy one-step
  completion recorded during the rollout (no extra forward; the ``N K`` completions are scored by the
  task's reward functions, timed as ``time/score_greedy_s``). Slot ``k`` (the sample's ``k``-th
  selected step): ``R_k = (1 + lam) r(x_0) - lam V_{s_k}``, divided by ``1 + lam`` when
  ``normalize_returns``; ``A_k = R_k - mean_G(R_k)`` per slot. ``lam = 0`` is EGSPO exactly.

Rollout reuse: one rollout feeds ``mu`` optimizer steps; inner update ``i`` trains the slots
``(i * K' + j) mod K, j < K'`` with ``K' = steps_per_update`` (0: ``ceil(K / mu)``), so ``K = 8,
mu = 2`` trains slots 0-3, then 4-7 (logged as ``egspo/slice_start``). ``log pi_old`` of each slot is
computed once per rollout with the old policy on the reconstructed state and cached
(``old_logp=recompute``), or read from the trajectory recorder (``old_logp=recorded``, no forward;
equal at ``theta_old`` up to float batching, but not with classifier-free guidance).

Source: the EGSPO paper (entropy-guided step selection; EGSPO-SA's greedy-completion values) and its
public code, as summarised in SPEC §4. Deviations: a sample with fewer
than ``K`` candidate steps (``stop_at_last_content``) masks its unused slots out, and EGSPO-SA gives
them ``V = r(x_0)`` so the group means stay over ``G`` samples; ``stop_at_last_content`` takes the
last step that committed a token before the first EOS (the step that placed the first EOS when the
answer is empty). Cost per optimizer step is logged as ``cost/forwards_per_sample`` (generation
``T / mu`` amortised, old/ref forwards actually run, trained ``K'``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from diffusion_rl.errors import ConfigError
from diffusion_rl.likelihood.stepwise import stepwise_logps
from diffusion_rl.models.policy import decode_completions
from diffusion_rl.objectives.base import (
    OBJECTIVES,
    Objective,
    ObjectiveConfig,
    Rollout,
    StepContext,
    group_advantages,
    k3_kl,
    masked_mean,
)
from diffusion_rl.objectives.selectors import SELECTORS, steps_up_to
from diffusion_rl.sampling.trajectory import TrajectoryRecorder
from diffusion_rl.seeding import mix_seed


@dataclass
class EGSPOConfig(ObjectiveConfig):
    name: str = "egspo"
    K: int = 8  # selected steps per sample (the paper: 8 of T = 128)
    select: str = "entropy"  # entropy | random | uniform
    eps: float = 0.2
    eps_high: float = 0.5
    reduce: str = "sum"  # stepwise log-prob over the committed tokens: sum | mean
    stop_at_last_content: bool = False  # candidates end at the last step that committed answer text
    steps_per_update: int = 0  # K' slots trained per optimizer step; 0 = ceil(K / mu)
    old_logp: str = "recompute"  # recompute (old policy, cached per rollout) | recorded (sampler's)
    seed: int = 0  # seeds the random selector with the rollout id

    def validate(self) -> None:
        super().validate()
        if self.K < 1:
            raise ConfigError("objective.K", self.K, "must be >= 1")
        if self.select not in SELECTORS:
            raise ConfigError("objective.select", self.select, f"allowed: {', '.join(SELECTORS.names())}")
        if not 0 < self.eps < 1:
            raise ConfigError("objective.eps", self.eps, "must be in (0, 1)")
        if self.eps_high <= 0:
            raise ConfigError("objective.eps_high", self.eps_high, "must be > 0")
        if self.reduce not in ("sum", "mean"):
            raise ConfigError("objective.reduce", self.reduce, "allowed: sum, mean")
        if not 0 <= self.steps_per_update <= self.K:
            raise ConfigError("objective.steps_per_update", self.steps_per_update,
                              f"must be in [0, objective.K={self.K}] (0 = ceil(K / mu))")
        if self.old_logp not in ("recompute", "recorded"):
            raise ConfigError("objective.old_logp", self.old_logp, "allowed: recompute, recorded")

    @property
    def per_update(self) -> int:
        return self.steps_per_update or math.ceil(self.K / self.mu)


@dataclass
class EGSPOSAConfig(EGSPOConfig):
    name: str = "egspo_sa"
    lam: float = 0.5  # weight of the stepwise value baseline
    normalize_returns: bool = True  # divide R_k by (1 + lam)

    def validate(self) -> None:
        super().validate()
        if self.lam < 0:
            raise ConfigError("objective.lam", self.lam, "must be >= 0")


# ---- pure functions ---------------------------------------------------------------------
def slice_slots(inner_iter: int, K: int, per_update: int) -> list[int]:
    """Slots trained at inner update ``inner_iter``: ``(inner_iter * K' + j) mod K`` for ``j < K'``."""
    start = (inner_iter * per_update) % K
    return [(start + j) % K for j in range(per_update)]


def stepwise_returns(rewards: torch.Tensor, values: torch.Tensor, lam: float, normalize: bool) -> torch.Tensor:
    """``R_k = (1 + lam) r - lam V_k`` (``/ (1 + lam)`` if ``normalize``). (N,), (N, K) -> (N, K)"""
    R = (1 + lam) * rewards[:, None] - lam * values
    return R / (1 + lam) if normalize else R


def stepwise_advantages(returns: torch.Tensor, group_size: int, scale: str = "none") -> torch.Tensor:
    """``A_k = R_k - mean_G(R_k)`` per slot ``k`` (``scale="group"``: / std + 1e-4). (N, K) -> (N, K)"""
    return torch.stack([group_advantages(returns[:, k], group_size, scale) for k in range(returns.shape[1])], 1)


def egspo_loss(
    logp: torch.Tensor,  # (N, K') stepwise log-probs under theta
    old_logp: torch.Tensor,  # (N, K') under the behaviour policy, no grad
    advantages: torch.Tensor,  # (N, K')
    eps: float,
    eps_high: float,
    ref_logp: torch.Tensor | None = None,  # (N, K')
    beta: float = 0.0,
    valid: torch.Tensor | None = None,  # (N, K') 1 = a selected step, 0 = unused slot
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate per selected step, mean over a sample's steps then over samples."""
    valid = torch.ones_like(logp) if valid is None else valid.float()
    log_ratio = logp - old_logp.detach()  # (N, K')
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps_high)
    per_step = -torch.min(ratio * advantages, clipped * advantages)  # (N, K')
    kl = None
    if ref_logp is not None and beta > 0:
        kl = k3_kl(logp, ref_logp.detach())
        per_step = per_step + beta * kl
    loss = masked_mean(per_step, valid, dim=-1).mean()
    with torch.no_grad():
        m = valid.bool()
        vals = log_ratio.detach()[m] if bool(m.any()) else log_ratio.new_zeros(1)
        metrics = {
            "ratio/log_mean": vals.mean(),
            "ratio/log_std": vals.std() if vals.numel() > 1 else vals.new_zeros(()),
            "ratio/log_min": vals.min(),
            "ratio/log_max": vals.max(),
            "ratio/clip_frac_low": masked_mean(((ratio < 1 - eps) & (advantages < 0)).float(), valid),
            "ratio/clip_frac_high": masked_mean(((ratio > 1 + eps_high) & (advantages > 0)).float(), valid),
        }
        if kl is not None:
            metrics["train/kl"] = masked_mean(kl.detach(), valid)
    return loss, metrics


# ---- the objectives ---------------------------------------------------------------------
@OBJECTIVES.register("egspo")
class EGSPO(Objective):
    config_class = EGSPOConfig
    cfg: EGSPOConfig
    needs_trajectory = True
    record_greedy = False  # EGSPO-SA needs the greedy completions

    def make_recorder(self) -> TrajectoryRecorder:
        return TrajectoryRecorder(self.likelihood.mask_id, record_greedy=self.record_greedy)

    def on_rollout(self, rollout: Rollout, recorder, task) -> dict[str, float]:
        if not isinstance(recorder, TrajectoryRecorder) or recorder.num_steps == 0:
            raise RuntimeError(f"objective {self.cfg.name} needs the TrajectoryRecorder of make_recorder() "
                               "passed to the sampler")
        c, T = self.cfg, recorder.num_steps
        if c.K > T:
            raise ConfigError("objective.K", c.K, f"must be <= the sampler's steps (sampler.steps={T})")
        cand = steps_up_to(self._last_content_step(rollout, recorder), T) if c.stop_at_last_content else None
        gen = torch.Generator().manual_seed(mix_seed(c.seed, rollout.rollout_id, 0xE65))
        entropies = recorder.entropies  # (N, T)
        steps = SELECTORS.get(c.select)(entropies, c.K, cand, gen).to(entropies.device)  # (N, K), -1 = unused
        valid = steps >= 0
        metrics: dict[str, float] = {}
        adv = self.step_advantages(rollout, recorder, steps, valid, task, metrics)  # (N, K)
        rollout.extras["egspo"] = {"trajectory": recorder, "steps": steps, "valid": valid, "advantages": adv}
        sel_ent = entropies.gather(1, steps.clamp_min(0))
        metrics.update({
            "egspo/selected_entropy": masked_mean(sel_ent, valid.float()).item(),
            "egspo/step_entropy": entropies.mean().item(),
            "egspo/selected_step_mean": masked_mean(steps.float(), valid.float()).item(),
            "egspo/valid_frac": valid.float().mean().item(),
            "egspo/trajectory_bytes_per_sample": recorder.nbytes() / max(steps.shape[0], 1),
        })
        return metrics

    def step_advantages(self, rollout: Rollout, traj: TrajectoryRecorder, steps: torch.Tensor,
                        valid: torch.Tensor, task, metrics: dict[str, float]) -> torch.Tensor:
        """EGSPO: the sequence advantage for every selected step. -> (N, K)"""
        return rollout.advantages[:, None].expand(steps.shape).clone()

    @staticmethod
    def _last_content_step(rollout: Rollout, traj: TrajectoryRecorder) -> torch.Tensor:
        """(N,) last step that committed a completion token before the first EOS (-1: none)."""
        eos = _extra(rollout, "eos_token_id")
        ids, keep = rollout.completion_ids, rollout.completion_mask.bool()  # (N, L)
        P = traj.final.shape[1] - ids.shape[1]  # type: ignore[union-attr]
        pad = torch.zeros(ids.shape[0], P, dtype=torch.bool, device=ids.device)
        last = traj.last_step_where(torch.cat([pad, keep & (ids != eos)], 1))
        first_eos = traj.last_step_where(torch.cat([pad, keep & (ids == eos)], 1))
        return torch.where(last >= 0, last, first_eos)  # an empty answer: the step that ended it

    def _batch(self, ctx: StepContext) -> dict[str, Any]:
        """This inner update's slots and the model inputs of their (sample, step) rows, memoised."""
        memo = ctx.cache.get("egspo/batch")
        if memo is not None and memo["inner_iter"] == ctx.inner_iter:
            return memo
        c, ro = self.cfg, ctx.rollout
        e = ro.extras["egspo"]
        traj: TrajectoryRecorder = e["trajectory"]
        slots = slice_slots(ctx.inner_iter, c.K, c.per_update)
        steps, valid, adv = e["steps"][:, slots], e["valid"][:, slots], e["advantages"][:, slots]  # (N, K')
        N, Kp = steps.shape
        rows = valid.reshape(-1).nonzero()[:, 0]  # only real (sample, step) pairs go through the model
        states, committed = traj.states_at(steps.clamp_min(0))  # (N*K', P+L)
        tokens = traj.final.repeat_interleave(Kp, 0)  # type: ignore[union-attr]
        attn = None
        if not bool(ro.prompt_mask.all()):  # as the sampler: an attention mask only with padding
            full = torch.cat([ro.prompt_mask.long(), torch.ones_like(ro.completion_ids)], 1)
            attn = full.repeat_interleave(Kp, 0)[rows]
        args = (states[rows], attn, committed[rows], tokens[rows])

        def run(forward) -> torch.Tensor:
            vals = stepwise_logps(forward, *args, reduce=c.reduce)  # (n,)
            return vals.new_zeros(N * Kp).index_copy(0, rows, vals).view(N, Kp)

        memo = {"inner_iter": ctx.inner_iter, "slots": slots, "steps": steps, "valid": valid, "adv": adv,
                "rows": rows, "run": run}
        ctx.cache["egspo/batch"] = memo
        return memo

    def old_values(self, ctx: StepContext) -> tuple[torch.Tensor, float]:
        """Behaviour log-probs of this update's slots (N, K') and the forward rows that cost."""
        c, e = self.cfg, ctx.rollout.extras["egspo"]
        slots = slice_slots(ctx.inner_iter, c.K, c.per_update)
        if c.old_logp == "recorded":
            traj: TrajectoryRecorder = e["trajectory"]
            old_all = traj.logps.gather(1, e["steps"].clamp_min(0))
            if c.reduce == "mean":
                old_all = old_all / traj.counts.gather(1, e["steps"].clamp_min(0)).clamp_min(1).float()
            return old_all[:, slots].to(e["advantages"].device), 0.0
        b = self._batch(ctx)
        forwards = {"old": 0.0}
        old = self._cached(ctx, "egspo/old", ctx.old_policy, slots, b["run"], forwards, "old", b["rows"])
        return old, forwards["old"]

    def loss(self, ctx: StepContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c, ro = self.cfg, ctx.rollout
        traj: TrajectoryRecorder = ro.extras["egspo"]["trajectory"]
        b = self._batch(ctx)
        slots, steps, valid, adv, rows, run = b["slots"], b["steps"], b["valid"], b["adv"], b["rows"], b["run"]
        N, Kp = steps.shape
        old, old_forwards = self.behaviour(ctx)
        forwards = {"old": old_forwards, "ref": 0.0}
        with torch.no_grad():
            ref = None
            if ctx.ref_policy is not None and c.beta > 0:
                ref = self._cached(ctx, "egspo/ref", ctx.ref_policy, slots, run, forwards, "ref", rows)
        logp = run(ctx.policy)
        g = ro.shard.gather  # every process's rows (identity on one process)
        loss, metrics = egspo_loss(g(logp), g(old), g(adv), c.eps, c.eps_high, None if ref is None else g(ref), c.beta,
                                   g(valid))
        gen = traj.num_steps / c.mu  # the rollout's T forwards, spread over its mu updates
        per_sample = {k: v / max(N, 1) for k, v in forwards.items()}
        trained = rows.numel() / max(N, 1)
        metrics.update({
            "egspo/slice_start": torch.tensor(float(slots[0])),
            "egspo/slice_size": torch.tensor(float(Kp)),
            "egspo/step_mean": masked_mean(steps.float(), valid.float()).detach(),
            "egspo/adv_abs_mean": masked_mean(adv.abs(), valid.float()).detach(),
            "cost/gen_forwards_per_sample": torch.tensor(gen),
            "cost/old_forwards_per_sample": torch.tensor(per_sample["old"] + per_sample["ref"]),
            "cost/train_forwards_per_sample": torch.tensor(trained),
            "cost/forwards_per_sample": torch.tensor(gen + per_sample["old"] + per_sample["ref"] + trained),
        })
        return loss, metrics

    @staticmethod
    def _cached(ctx: StepContext, key: str, forward, slots: list[int], run, forwards: dict[str, float],
                kind: str, rows: torch.Tensor) -> torch.Tensor:
        """Frozen-policy step log-probs, computed once per (rollout, slot) and kept in ``ctx.cache``."""
        done: dict[int, torch.Tensor] = ctx.cache.setdefault(key, {})
        if any(k not in done for k in slots):
            vals = run(forward)  # (N, K'); recomputing a cached slot is harmless (frozen policy)
            forwards[kind] += float(rows.numel())
            for j, k in enumerate(slots):
                done.setdefault(k, vals[:, j])
        return torch.stack([done[k] for k in slots], 1)


@OBJECTIVES.register("egspo_sa")
class EGSPOSA(EGSPO):
    config_class = EGSPOSAConfig
    cfg: EGSPOSAConfig
    record_greedy = True

    def step_advantages(self, rollout: Rollout, traj: TrajectoryRecorder, steps: torch.Tensor,
                        valid: torch.Tensor, task, metrics: dict[str, float]) -> torch.Tensor:
        """Score the greedy completions of the selected steps; per-slot advantages of the returns."""
        t0 = time.perf_counter()
        values = self.greedy_values(rollout, traj, steps, valid, task)  # (N, K)
        metrics["time/score_greedy_s"] = time.perf_counter() - t0
        r = rollout.rewards.float()
        g = rollout.shard.gather  # groups may span processes: per-slot group means over all rows
        returns = stepwise_returns(g(r), g(values), self.cfg.lam, self.cfg.normalize_returns)
        adv = stepwise_advantages(returns, rollout.group_size, self.cfg.scale_rewards)
        adv = adv[rollout.shard.rows(adv.shape[0])]  # this process's rows
        v = valid.float()
        metrics["egspo_sa/value_mean"] = masked_mean(values, v).item()
        metrics["egspo_sa/reward_minus_value"] = masked_mean(r[:, None] - values, v).item()
        metrics["egspo_sa/adv_std"] = adv[valid].std().item() if int(valid.sum()) > 1 else 0.0
        return adv

    @staticmethod
    def greedy_values(rollout: Rollout, traj: TrajectoryRecorder, steps: torch.Tensor, valid: torch.Tensor,
                      task) -> torch.Tensor:
        """``V = r(xhat_s)`` at every selected step; unused slots get ``r(x_0)``. -> (N, K)"""
        tokenizer, eos = _extra(rollout, "tokenizer"), _extra(rollout, "eos_token_id")
        L = rollout.completion_ids.shape[1]
        bi, ki = valid.nonzero(as_tuple=True)  # (n,) each
        sel = steps[bi, ki]  # (n,)
        comps = torch.empty(sel.numel(), L, dtype=rollout.completion_ids.dtype, device=sel.device)
        for s in sel.unique().tolist():  # one reconstruction per distinct step
            hit = sel == s
            comps[hit] = traj.greedy_completion(s)[bi[hit], -L:].to(comps.dtype)
        values = rollout.rewards.float()[:, None].expand(steps.shape).clone()
        if sel.numel():
            items = rollout.extras["items"]
            texts = decode_completions(tokenizer, comps, eos)
            values[bi, ki] = task.rewards(texts, [items[b] for b in bi.tolist()]).to(values)
        return values


def _extra(rollout: Rollout, key: str) -> Any:
    if key not in rollout.extras:
        raise KeyError(f"EGSPO needs rollout.extras[{key!r}] (set by DiffusionRLModule.rollout)")
    return rollout.extras[key]
