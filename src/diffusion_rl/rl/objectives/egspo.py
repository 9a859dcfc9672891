"""EGSPO: policy gradient over a few entropy-selected denoising steps (docs/methods.md §4).

Denoising is an MDP (state: the partially masked sequence; action: the tokens committed at a step;
reward only at the end). Per sample, ``K`` of the ``T`` recorded steps are trained (``select``:
``entropy`` = the ``K`` highest step entropies ``H_s``; ablations ``random``, ``uniform``). Per
selected step ``s``, with ``log pi(step s)`` the stepwise likelihood (``likelihood/stepwise.py``):

    rho_s  = exp(log pi_theta(step s) - log pi_old(step s))
    loss_s = -min(rho_s A_s, clip(rho_s, 1 - eps, 1 + eps_high) A_s)      (GRPO's clipped surrogate)

averaged over the selected steps of a sample, then over samples, plus the shared k3 KL penalty on the
same steps. ``A_s`` is the rollout's advantage: the sequence's for every selected step
(``advantage=group|group_std|loo``), or one per step from ``advantage=stepwise`` (EGSPO-SA,
``rl/objectives/egspo_sa.py``), whose greedy one-step completions the rollout scores.

Rollout reuse: one rollout feeds ``mu`` optimizer steps; inner update ``i`` trains the slots
``(i * K' + j) mod K, j < K'`` with ``K' = steps_per_update`` (0: ``ceil(K / mu)``), so ``K = 8,
mu = 2`` trains slots 0-3, then 4-7 (logged as ``egspo/slice_start``). ``log pi_old`` of each slot is
computed once per rollout with the old policy on the reconstructed state and cached
(``old_logp=recompute``), or read from the trajectory recorder (``old_logp=recorded``, no forward;
equal at ``theta_old`` up to float batching, but not with classifier-free guidance nor with a
``sampler.kv_cache``, whose logits are approximate: then the ratio carries that mismatch, which
``recompute`` shows as ``rollout/mismatch_log_ratio`` and ``behaviour_correction=tis`` can correct).

Any sampler option: the replay uses exactly the committed sets the sampler chose (the recorder's),
so at ``theta = theta_old`` the step ratio is exactly 1 with ``old_logp=recompute`` whatever the
decoding rule, cache or early stop. Candidate steps are those that committed a token of the sample
(with ``sampler.decode=threshold|factor`` a row can finish a block before the batch does); when a
rollout took fewer than ``K`` of them the rest of the slots are unused.

Source: the EGSPO paper (entropy-guided step selection; EGSPO-SA's greedy-completion values) and its
public code, vishnutez/egspo-dllm-rl @ a7d618b, ``egspo/egspo_trainer.py`` (``compute_loss``: one
selected step per micro-batch, its PPO loss plus beta k3, the batch mean divided by the tokens per
denoising step; ``_generate_and_score_completions``: the steps' rollout-time log-probs as the old
ones, returns minus the group mean) with ``egspo/train.sh`` and ``slurm_scripts/train.yaml``. The
defaults are that code's regime: K = 8 selected steps, 2 per optimizer step (``mu = 4``), eps 0.2 /
0.5, beta 0.04, ``old_logp=recorded``, ``reduce=sum`` with ``step_token_norm``, ``advantage=group``
and ``optim=egspo`` (lr 3e-5, weight decay 0.1, total-norm clip 0.2; the public runs train LoRA
adapters of rank 128). Deviations: a sample with fewer
than ``K`` candidate steps (``stop_at_last_content``) masks its unused slots out (EGSPO-SA gives them
``V = r(x_0)`` so the group means stay over ``G`` samples); ``stop_at_last_content`` takes the
last step that committed a token before the first EOS (the step that placed the first EOS when the
answer is empty). Cost per optimizer step is logged as ``cost/forwards_per_sample`` (generation
``T / mu`` amortised, old/ref forwards actually run, trained ``K'``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from diffusion_rl.core.errors import ConfigError, check_choice
from diffusion_rl.core.seeding import mix_seed
from diffusion_rl.likelihood.stepwise import stepwise_logps
from diffusion_rl.likelihood.trajectory import replay_logps, step_positions
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.objectives.base import OBJECTIVES, LogpUnits, Objective, StepContext
from diffusion_rl.rl.objectives.grpo import GRPOConfig, grpo_loss
from diffusion_rl.rl.objectives.losses import masked_mean
from diffusion_rl.rl.objectives.selectors import SELECTORS, steps_up_to
from diffusion_rl.sampling.trajectory import TrajectoryRecorder
from diffusion_rl.sampling.uniform_trajectory import Trajectory, UniformTrajectory


@dataclass
class EGSPOConfig(GRPOConfig):
    name: str = "egspo"
    # the public code trains one selected step per micro-batch, 2 micro-batches per optimizer step: the
    # K = 8 steps of a rollout make 4 optimizer steps of K' = ceil(K / mu) = 2 steps each
    mu: int = 4
    K: int = 8  # selected steps per sample (logps_eval_num_steps; of T = 128 there); K <= sampler.steps
    select: str = "entropy"  # entropy | random | uniform
    eps: float = 0.2  # the paper's clip range
    eps_high: float = 0.5
    agg: str = "token-mean"  # the mean over every (sample, selected step) of the update, as the public loss
    reduce: str = "sum"  # stepwise log-prob over the committed tokens: sum | mean
    # with reduce=sum, divide the loss by the completion's tokens per denoising step (L / T): the public
    # code's per-token scale (max_completion_length // diffusion_steps)
    step_token_norm: bool = True
    stop_at_last_content: bool = False  # candidates end at the last step that committed answer text
    steps_per_update: int = 0  # K' slots trained per optimizer step; 0 = ceil(K / mu)
    # recorded (the sampler's own log-prob of the step, no forward: the public code) | recompute (the
    # old policy replays the step; equal at theta_old up to float batching)
    old_logp: str = "recorded"

    def validate(self) -> None:
        super().validate()
        if self.K < 1:
            raise ConfigError("objective.K", self.K, "must be >= 1")
        check_choice("objective.select", self.select, SELECTORS.names())
        check_choice("objective.reduce", self.reduce, ("sum", "mean"))
        if not 0 <= self.steps_per_update <= self.K:
            raise ConfigError("objective.steps_per_update", self.steps_per_update,
                              f"must be in [0, objective.K={self.K}] (0 = ceil(K / mu))")
        check_choice("objective.old_logp", self.old_logp, ("recompute", "recorded"))

    @property
    def per_update(self) -> int:
        return self.steps_per_update or math.ceil(self.K / self.mu)


def slice_slots(inner_iter: int, K: int, per_update: int) -> list[int]:
    """Slots trained at inner update ``inner_iter``: ``(inner_iter * K' + j) mod K`` for ``j < K'``."""
    start = (inner_iter * per_update) % K
    return [(start + j) % K for j in range(per_update)]


@dataclass
class StepBatch:
    """One inner update's slots of the selected steps and the model inputs of their (sample, step) rows."""

    inner_iter: int
    slots: list[int]  # the slots of ``Rollout.selected_steps`` this update trains
    steps: torch.Tensor  # (N, K') their denoising steps, -1 = an unused slot
    valid: torch.Tensor  # (N, K') the slots that hold a step
    rows: torch.Tensor  # (n,) the flattened (sample, slot) rows that go through the model
    run: Callable[[Forward], torch.Tensor]  # a policy forward -> (N, K') step log-probs (0 where not valid)


@dataclass
class EGSPOPlan:
    """What EGSPO's inner updates of one rollout share."""

    batch: StepBatch | None = None  # the latest inner update's slots
    # the frozen policies' step log-probs, computed once per rollout: role ("old", "ref") -> slot -> (N,)
    frozen: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)
    # rows run by the frozen policies: (role, inner iteration) -> rows (cost/old_forwards_per_sample)
    forwards: dict[tuple[str, int], float] = field(default_factory=dict)


@OBJECTIVES.register("egspo")
class EGSPO(Objective):
    config_class = EGSPOConfig
    cfg: EGSPOConfig
    policy_loss = staticmethod(grpo_loss)  # the clipped surrogate, per selected step
    advantage_estimators: ClassVar[tuple[str, ...]] = ("group", "group_std", "loo", "stepwise")
    needs_trajectory = True
    uniform_likelihoods = ("*",)  # a uniform-noise sampler's steps replay as they were (likelihood/trajectory.py)

    def __init__(self, cfg: EGSPOConfig, likelihood):
        super().__init__(cfg, likelihood)
        self.kl_agg = cfg.agg  # the public code adds its k3 term to each step's loss before the mean

    # ---- rollout time -------------------------------------------------------------------
    def select_steps(self, trajectory: Trajectory, completion_ids: torch.Tensor,
                     completion_mask: torch.Tensor, eos_id: int, rollout_id: int,
                     run_seed: int) -> tuple[torch.Tensor, dict[str, float]]:
        c, T = self.cfg, trajectory.num_steps
        if c.K > T and not trajectory.variable_steps:  # decode=threshold|factor: a short rollout leaves slots unused
            raise ConfigError("objective.K", c.K, f"must be <= the sampler's steps (sampler.steps={T})")
        cand = trajectory.counts > 0  # (n, T) a step that committed nothing of a row is no action of it
        if c.stop_at_last_content:
            if isinstance(trajectory, UniformTrajectory):
                raise ConfigError("objective.stop_at_last_content", True,
                                  "reads when the answer's last token was committed: a uniform-noise sampler "
                                  "commits none for good (leave it false)")
            cand &= steps_up_to(last_content_step(trajectory, completion_ids, completion_mask, eos_id), T)
        gen = torch.Generator().manual_seed(mix_seed(run_seed, rollout_id, 0xE65))
        entropies = trajectory.entropies  # (n, T)
        steps = SELECTORS.get(c.select)(entropies, c.K, cand, gen).to(entropies.device)  # (n, K), -1 = unused
        valid = (steps >= 0).float()
        sel_ent = entropies.gather(1, steps.clamp_min(0))
        return steps, {
            "egspo/selected_entropy": masked_mean(sel_ent, valid).item(),
            "egspo/step_entropy": entropies.mean().item(),
            "egspo/selected_step_mean": masked_mean(steps.float(), valid).item(),
            "egspo/valid_frac": valid.mean().item(),
            "egspo/trajectory_bytes_per_sample": trajectory.nbytes() / max(steps.shape[0], 1),
        }

    # ---- per inner update ---------------------------------------------------------------
    def make_plan(self, ctx: StepContext) -> EGSPOPlan:
        return EGSPOPlan()

    def _batch(self, ctx: StepContext) -> StepBatch:
        """This inner update's slots and the model inputs of their (sample, step) rows, kept in the plan."""
        plan: EGSPOPlan = self.plan(ctx)
        if plan.batch is not None and plan.batch.inner_iter == ctx.inner_iter:
            return plan.batch
        c, ro = self.cfg, ctx.rollout
        traj, all_steps = ro.trajectory, ro.selected_steps
        assert traj is not None and all_steps is not None, "EGSPO needs the rollout's trajectory and selected steps"
        slots = slice_slots(ctx.inner_iter, c.K, c.per_update)
        steps = all_steps[:, slots]  # (N, K')
        valid = steps >= 0
        N, Kp = steps.shape
        rows = valid.reshape(-1).nonzero()[:, 0]  # only real (sample, step) pairs go through the model
        if isinstance(traj, UniformTrajectory):  # every step recorded whole (no mask token to rebuild it with)
            plan.batch = StepBatch(ctx.inner_iter, slots, steps, valid, rows, self._uniform_run(ctx, steps, rows))
            return plan.batch
        states, committed = traj.states_at(steps.clamp_min(0))  # (N*K', P+L)
        if ro.loss_mask is not None:  # only the tokens the reward reads count in a step's log-prob
            keep = torch.cat([torch.ones_like(ro.prompt_mask), ro.loss_mask.to(ro.prompt_mask.dtype)], 1).bool()
            committed = committed & keep.repeat_interleave(Kp, 0)
        tokens = traj.final.repeat_interleave(Kp, 0)  # type: ignore[union-attr]
        attn = None
        if not bool(ro.prompt_mask.all()):  # as the sampler: an attention mask only with padding
            full = torch.cat([ro.prompt_mask.long(), torch.ones_like(ro.completion_ids)], 1)
            attn = full.repeat_interleave(Kp, 0)[rows]
        args = (states[rows], attn, committed[rows], tokens[rows])

        def run(forward: Forward) -> torch.Tensor:
            vals = stepwise_logps(forward, *args, reduce=c.reduce)  # (n,)
            return vals.new_zeros(N * Kp).index_copy(0, rows, vals).view(N, Kp)

        plan.batch = StepBatch(ctx.inner_iter, slots, steps, valid, rows, run)
        return plan.batch

    def _uniform_run(self, ctx: StepContext, steps: torch.Tensor, rows: torch.Tensor) -> Callable[[Forward], torch.Tensor]:
        """The rows' step log-probabilities replayed from a uniform-noise trajectory (sum or mean over the
        accepted tokens the loss counts). -> (N, K')"""
        ro, reduce = ctx.rollout, self.cfg.reduce
        N, Kp = steps.shape
        sample, step = rows // Kp, steps.reshape(-1)[rows]  # (n,) each
        keep = None if ro.loss_mask is None else ro.loss_mask.bool()[sample]

        def run(forward: Forward) -> torch.Tensor:
            assert ro.trajectory is not None
            tok = replay_logps(forward, ro.trajectory, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, sample, step,
                               keep)  # (n, L)
            vals = tok.sum(-1)
            if reduce == "mean":
                hit = step_positions(ro.trajectory, tok.shape[1]).to(tok.device)[sample, step]
                vals = vals / (hit if keep is None else hit & keep).sum(-1).clamp_min(1)
            return vals.new_zeros(N * Kp).index_copy(0, rows, vals).view(N, Kp)

        return run

    def old_logp_like_policy(self) -> bool:
        return super().old_logp_like_policy() and self.cfg.old_logp == "recompute"

    def logp_units(self, ctx: StepContext, forward: Forward, role: str) -> LogpUnits:
        b = self._batch(ctx)
        mask = b.valid.float()
        if role == "policy":
            return LogpUnits(b.run(forward), mask)
        if role == "old" and self.cfg.old_logp == "recorded":
            return LogpUnits(self._recorded(ctx), mask)
        # frozen policies: each slot's values are computed once per rollout and kept
        plan: EGSPOPlan = self.plan(ctx)
        done = plan.frozen.setdefault(role, {})
        if any(k not in done for k in b.slots):
            vals = b.run(forward)  # (N, K'); recomputing a kept slot is harmless (frozen policy)
            plan.forwards[role, ctx.inner_iter] = plan.forwards.get((role, ctx.inner_iter), 0.0) + float(b.rows.numel())
            for j, k in enumerate(b.slots):
                done.setdefault(k, vals[:, j])
        return LogpUnits(torch.stack([done[k] for k in b.slots], 1), mask)

    def _recorded(self, ctx: StepContext) -> torch.Tensor:
        """The sampler's own log pi(step s) of this update's slots, as it recorded them. (N, K')"""
        traj, steps, slots = ctx.rollout.trajectory, ctx.rollout.selected_steps, self._batch(ctx).slots
        assert traj is not None and steps is not None
        rec = traj.logps.gather(1, steps.clamp_min(0))
        if self.cfg.reduce == "mean":
            rec = rec / traj.counts.gather(1, steps.clamp_min(0)).clamp_min(1).float()
        return rec[:, slots].to(steps.device)

    def sampler_units(self, ctx: StepContext) -> torch.Tensor:
        """The same steps' log-probabilities from the sampler's logits (exactly comparable with the
        stepwise replay: ``rl/objectives/behaviour.py``)."""
        return self._recorded(ctx)

    def loss(self, ctx: StepContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The template's loss, divided by the completion's tokens per denoising step when the step
        log-probs are sums (``step_token_norm``): the public code's per-token scale."""
        loss, metrics = super().loss(ctx)
        traj = ctx.rollout.trajectory
        if self.cfg.step_token_norm and self.cfg.reduce == "sum" and traj is not None:
            loss = loss / max(ctx.rollout.completion_ids.shape[1] // max(traj.num_steps, 1), 1)
        return loss, metrics

    def unit_advantages(self, ctx: StepContext) -> torch.Tensor:
        """The selected slots' advantages (N, K'): per step (stepwise) or the sequence's for each."""
        adv, slots = ctx.rollout.advantages, self._batch(ctx).slots
        return adv[:, slots] if adv.dim() == 2 else adv[:, None].expand(-1, len(slots))

    def extra_metrics(self, ctx: StepContext) -> dict[str, torch.Tensor]:
        c, b, traj = self.cfg, self._batch(ctx), ctx.rollout.trajectory
        assert traj is not None
        N, Kp = b.steps.shape
        valid = b.valid.float()
        cost = self.plan(ctx).forwards
        frozen = sum(cost.get((role, ctx.inner_iter), 0.0) for role in ("old", "ref")) / max(N, 1)
        gen = traj.num_steps / c.mu  # the rollout's T forwards, spread over its mu updates
        trained = b.rows.numel() / max(N, 1)
        return {
            "egspo/slice_start": torch.tensor(float(b.slots[0])),
            "egspo/slice_size": torch.tensor(float(Kp)),
            "egspo/step_mean": masked_mean(b.steps.float(), valid),
            "egspo/adv_abs_mean": masked_mean(self.unit_advantages(ctx).abs(), valid),
            "cost/gen_forwards_per_sample": torch.tensor(gen),
            "cost/old_forwards_per_sample": torch.tensor(frozen),
            "cost/train_forwards_per_sample": torch.tensor(trained),
            "cost/forwards_per_sample": torch.tensor(gen + frozen + trained),
        }


def last_content_step(traj: TrajectoryRecorder, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                      eos_id: int) -> torch.Tensor:
    """(N,) last step that committed a completion token before the first EOS (-1: none)."""
    keep = completion_mask.bool()  # (N, L)
    P = traj.final.shape[1] - completion_ids.shape[1]  # type: ignore[union-attr]
    pad = torch.zeros(completion_ids.shape[0], P, dtype=torch.bool, device=completion_ids.device)
    last = traj.last_step_where(torch.cat([pad, keep & (completion_ids != eos_id)], 1))
    first_eos = traj.last_step_where(torch.cat([pad, keep & (completion_ids == eos_id)], 1))
    return torch.where(last >= 0, last, first_eos)  # an empty answer: the step that ended it
