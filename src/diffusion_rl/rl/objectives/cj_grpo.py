"""CJ-GRPO: consistency-trajectory GRPO, PPO on every transition of the sampler's own decoding
trajectory (Yang et al. 2025, "Taming Masked Diffusion Language Models via Consistency Trajectory
Reinforcement Learning with Fewer Decoding Steps"; docs/methods.md §4.17).

The rollout records the trajectory (``TrajectoryRecorder``: the state ``x_k`` before each step ``k``
and the positions ``U_jk`` step ``k`` unmasked in sample ``j``); the loss scores each transition as
the sampler took it, ``log pi_theta(x_i | x_k)`` for ``i in U_jk``, one forward of ``x_k`` per (sample,
transition) (``likelihood/stepwise.py``, per token). Per token:

    rho_jki = exp(log pi_theta(x_i | x_jk) - log pi_old(x_i | x_jk))
    l_jki   = -min(rho_jki A_j, clip(rho_jki, 1 - eps, 1 + eps) A_j) + beta k3(pi_theta, pi_ref)_jki

and per group ``g`` (the public micro-batch: one prompt's ``G`` samples), with ``K_g`` its transitions
that unmasked a token:

    loss = mean_g (1 / |K_g|) sum_{k in K_g} [ sum_{j in g, i in U_jk} l_jki / sum_{j in g} |U_jk| ]

a token mean over the group per transition, then the mean over transitions, then over groups
(``agg=group``). ``agg=sample`` takes the same means per sample instead of per group: the reduction of
DARE's port (yjyddq/DARE, ``tests/test_cj_grpo_paper_exact.py``, its reading of the paper's Eq. 11).
``A_j = r_j - mean_G(r)`` (``advantage=group``); the k3 term is the shared KL to the reference, reduced
the same way (the public code adds it to each token's loss before the means: the same value).

Source: yjyddq/EOSER-ASS-RL @ 5affb4e, ``cj-grpo/cj_grpo_trainer_{semiar,eoser,ass,eoser_ass}.py``:
``compute_loss`` L84-151 (per transition: ratio, clip, k3, ``(loss * unmask).sum() / unmask.sum() /
steps``), ``_get_per_token_logps`` (L398-434 in ``_semiar``: one forward of ``reversed_traj[i]`` per
transition, targets ``reversed_traj[i + 1]``), ``reversed_process`` (the recorded states and
``mask_index & (x != mask_id)`` per step), ``_generate_and_score_completions`` (advantages L580-597:
``rewards - mean``, no std; old log-probs once per rollout when ``num_iterations > 1``, else the
policy's own, detached; the reference with the LoRA adapters off); ``slurm_scripts/train.yaml`` and
``run.sh`` (eps 0.5, beta 0.04, ``num_iterations`` 12, 8 for Countdown / Sudoku, G 6 with a
per-device batch of 6, LoRA r 128, lr 3e-6, weight decay 0.1, clip 0.2, L 256, block 128, 128 steps,
temperature 1.0, ``eos_min_gamma`` 0.01). The decoders (semi-AR, EOSER, ASS, EOSER + ASS) are sampler
options any objective may use: ``sampler.schedule=ass``, ``sampler.eos_gamma_min``
(``sampling/sampler.py``).

Deviations, each with its reason (the loss itself is transcribed: ``tests/unit/rl/test_cj_grpo.py``):

- The public scripts cannot run as released: ``cj_grpo_train.py`` imports ``flow_grpo_config``, which
  the repository does not hold (its config is ``cj_grpo_config.py``); ``run.sh`` (``train.yaml``: 128
  steps, L 256, block 128) and the slurm scripts (32 steps, L 128, ``block_num`` 64) break the ASS
  trainers' ``steps == log2(L)`` and ``block_num <= steps`` and the EOSER trainer's ``block_length ==
  L``. This file follows the code's math.
- A transition that unmasked no token of a group does not count in ``K_g`` (the public ``0 / 0``
  gives NaN; its lockstep sampler without pinned tokens never has one). Pinned tokens
  (``Task.pinned_completion``), positions where the sampler drew the mask token (unmasked later, as in
  the public ``mask_index & (x != mask_id)``) and positions ``sampler.stop_after_eos`` filled without
  a step are in no transition.
- Every unmasked token trains, after the first EOS too (the public loss has no completion mask);
  ``after_eos=false`` keeps only those up to and including the first EOS, and ``task.loss_mask=reward``
  only those the reward reads.
- ``old_logp=recorded`` (not the default) reads the sampler's own log-prob of each token, no old
  forward; the public code recomputes (``recompute``, once per rollout: the transitions have no random
  masks, so every inner update shares them).
- The micro-batch is one group (``per_device_train_batch_size`` = ``num_generations`` = 6 there);
  gradient accumulation and processes average micro-batch losses, so the loss is the mean over groups.
  The reference stays fixed: ``train.yaml`` sets TRL's ``sync_ref_model`` as d1's does, and in these
  LoRA runs the reference is the base with the adapters off, which TRL does not move (``grpo.py``).
- Rows are the (sample, transition) pairs that unmasked a token; all go through the model in one
  batch per inner update (the module has no micro-batching: ``N x steps`` rows on a real model, so
  long trajectories need ``sampler.schedule=ass`` or a smaller batch), the public code one transition
  of a micro-batch at a time. The forward takes an attention mask over left padding, as the sampler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from diffusion_rl.core.errors import check_choice
from diffusion_rl.likelihood.stepwise import stepwise_logps
from diffusion_rl.likelihood.trajectory import replay_logps, step_positions
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.objectives.base import OBJECTIVES, LogpUnits, Objective, StepContext
from diffusion_rl.rl.objectives.config import LikelihoodNeed, ObjectiveConfig, check_clip
from diffusion_rl.rl.objectives.losses import kl_penalty, ratio_metrics
from diffusion_rl.sampling.uniform_trajectory import Trajectory, UniformTrajectory

AGGS = ("group", "sample")
OLD_LOGPS = ("recompute", "recorded")


@dataclass
class CJGRPOConfig(ObjectiveConfig):
    name: str = "cj_grpo"
    mu: int = 12  # num_iterations (train.yaml); its Countdown / Sudoku runs: 8 (run.sh; conf/recipe/)
    eps: float = 0.5  # epsilon (train.yaml), one range both sides
    # group: each transition's token mean over a prompt's group (the public micro-batch), then the mean
    # over transitions, then over groups | sample: the same means per sample (DARE's port)
    agg: str = "group"
    # recompute: the old policy scores every transition once per rollout (the public code) | recorded:
    # the sampler's own log-prob of each token, no forward
    old_logp: str = "recompute"
    after_eos: bool = True  # train the tokens after the first EOS too (the public loss has no completion mask)

    def validate(self) -> None:
        super().validate()
        check_clip(self.eps)
        check_choice("objective.agg", self.agg, AGGS)
        check_choice("objective.old_logp", self.old_logp, OLD_LOGPS)


def transition_mean(values: torch.Tensor, mask: torch.Tensor, rows_per_set: int) -> torch.Tensor:
    """CJ-GRPO's reduction of per-token values ``(N, T, L)`` (sample, transition, position): within each
    set of ``rows_per_set`` consecutive samples, the token mean of every transition over the set's
    tokens, then the mean over the set's transitions that hold a token, then over sets. Units outside
    ``mask`` never count; a set without any token gives 0."""
    N, T, L = values.shape
    if rows_per_set < 1 or N % rows_per_set:
        raise ValueError(f"transition_mean needs rows in whole sets, got {N} rows, sets of {rows_per_set}")
    m = mask.bool()
    v = torch.where(m, values, torch.zeros_like(values)).reshape(N // rows_per_set, rows_per_set, T, L)
    count = m.reshape(N // rows_per_set, rows_per_set, T, L).sum((1, 3)).to(values.dtype)  # (S, T)
    per_transition = v.sum((1, 3)) / count.clamp_min(1)  # (S, T)
    held = (count > 0).to(values.dtype)  # (S, T)
    return ((per_transition * held).sum(-1) / held.sum(-1).clamp_min(1)).mean()


def cj_grpo_loss(
    logp: torch.Tensor,  # (N, T, L) per (sample, transition, position) log-probs of the unmasked tokens, with grad
    old_logp: torch.Tensor,  # (N, T, L) the old policy's, no grad
    advantages: torch.Tensor,  # (N, 1, 1) per sample, or broadcastable to (N, T, L)
    mask: torch.Tensor,  # (N, T, L) 1 = a token transition t unmasked
    cfg: CJGRPOConfig,
    *,
    group_size: int,
    surrogate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CJ-GRPO's clipped per-token surrogate, reduced by :func:`transition_mean`; pure function of tensors
    (``surrogate`` is not used)."""
    m = mask.bool()
    d = torch.where(m, logp - old_logp.detach(), torch.zeros_like(logp))  # (N, T, L)
    ratio = torch.exp(d)
    clipped = torch.clamp(ratio, 1 - cfg.eps, 1 + cfg.eps)
    per_token = -torch.min(ratio * advantages, clipped * advantages)  # (N, T, L)
    loss = transition_mean(per_token, m, group_size if cfg.agg == "group" else 1)
    metrics = ratio_metrics(d, m.to(logp.dtype), (ratio < 1 - cfg.eps) & (advantages < 0),
                            (ratio > 1 + cfg.eps) & (advantages > 0))
    return loss, metrics


@dataclass
class CJGRPOPlan:
    """What CJ-GRPO's inner updates of one rollout share: the transitions and their rows."""

    mask: torch.Tensor  # (n, T, L) 1 = the token unmasked at that transition and trained
    run: Callable[[Forward], torch.Tensor]  # a policy forward -> (n, T, L) the log-prob of every transition's tokens
    rows: int  # the (sample, transition) rows the model runs (0: one empty row keeps the graph)
    T: int  # transitions per sample, the most of any process
    ref_logp: torch.Tensor | None = None  # (n, T, L) the reference's, computed once per rollout


@OBJECTIVES.register("cj_grpo")
class CJGRPO(Objective):
    config_class = CJGRPOConfig
    cfg: CJGRPOConfig
    policy_loss = staticmethod(cj_grpo_loss)
    advantage_estimators: ClassVar[tuple[str, ...]] = ("group", "group_std", "loo", "zscore")
    token_credit = True
    needs_trajectory = True
    needs_likelihood = LikelihoodNeed("objective=cj_grpo scores the rollout's own transitions "
                                      "(likelihood/stepwise.py); leave likelihood at one_step", one_step=True)
    uniform_likelihoods = ("*",)  # a uniform-noise sampler's steps replay as they were (likelihood/trajectory.py)

    # ---- rollout time -------------------------------------------------------------------
    def select_steps(self, trajectory: Trajectory, completion_ids: torch.Tensor,
                     completion_mask: torch.Tensor, eos_id: int, rollout_id: int,
                     run_seed: int) -> tuple[torch.Tensor, dict[str, float]]:
        """Every transition is trained: nothing to select (the rows are built at update time)."""
        per_sample = (trajectory.counts > 0).sum(-1).float()  # (n,) transitions that unmasked a token
        return completion_ids.new_zeros(completion_ids.shape[0], 0), {
            "cj_grpo/transitions_per_sample": per_sample.mean().item() if per_sample.numel() else 0.0}

    # ---- per rollout: the transitions and their rows ------------------------------------
    def make_plan(self, ctx: StepContext) -> CJGRPOPlan:
        """The (sample, transition, position) mask of the trained tokens, the model inputs of every
        (sample, transition) row and a function scoring them, once per rollout."""
        ro = ctx.rollout
        traj = ro.trajectory
        if isinstance(traj, UniformTrajectory):
            return self._uniform_plan(ctx, traj)
        assert traj is not None and traj.commit_step is not None and traj.final is not None, \
            "objective=cj_grpo needs the rollout's recorded trajectory"
        n, L = ro.completion_ids.shape
        T = self._global_steps(ctx, traj.num_steps)  # the same on every process (gathered below)
        cs = traj.commit_step[:, -L:].long().to(ro.completion_ids.device)  # (n, L)
        trained = (cs >= 0) & (cs < traj.num_steps)  # unmasked at a step (not pinned, never, or filled)
        if not self.cfg.after_eos:
            trained &= ro.completion_mask.bool()
        if ro.loss_mask is not None:
            trained &= ro.loss_mask.bool()
        steps = torch.arange(T, device=cs.device)
        mask = (cs[:, None, :] == steps[None, :, None]) & trained[:, None, :]  # (n, T, L)
        sample, step = mask.any(-1).nonzero(as_tuple=True)  # (M,) each, sample-major
        real = sample.numel()
        if real == 0:  # one empty row keeps the loss on the graph (zero gradient)
            sample, step = sample.new_zeros(1), step.new_zeros(1)
        states, _ = traj.transitions(sample.to(traj.final.device), step.to(traj.final.device))  # (M, P+L)
        select = torch.zeros_like(states, dtype=torch.bool)
        select[:, -L:] = mask[sample, step]  # (M, P+L) the tokens the row scores
        if real == 0:
            select[0, -L] = True  # scored but outside the mask: the graph reaches the model
        attn = None
        if not bool(ro.prompt_mask.all()):  # as the sampler: an attention mask only with padding
            attn = torch.cat([ro.prompt_mask.long(), torch.ones_like(ro.completion_ids)], 1)[sample]
        args = (states, attn, select, traj.final[sample])
        index = sample * T + step  # (M,) row of the flattened (n * T, L) units

        def run(forward: Forward) -> torch.Tensor:
            vals = stepwise_logps(forward, *args, reduce="token")[:, -L:]  # (M, L), 0 where not scored
            return vals.new_zeros(n * T, L).index_copy(0, index, vals).view(n, T, L)

        return CJGRPOPlan(mask.float(), run, real, T)

    def _uniform_plan(self, ctx: StepContext, traj: UniformTrajectory) -> CJGRPOPlan:
        """:meth:`make_plan` on a uniform-noise trajectory: a transition is a recorded step, its tokens the
        accepted ones, replayed from the recorded canvas and self-conditioning (likelihood/trajectory.py)."""
        ro = ctx.rollout
        n, L = ro.completion_ids.shape
        T = self._global_steps(ctx, traj.num_steps)
        trained = torch.ones_like(ro.completion_mask, dtype=torch.bool)
        if not self.cfg.after_eos:
            trained &= ro.completion_mask.bool()
        if ro.loss_mask is not None:
            trained &= ro.loss_mask.bool()
        pos = step_positions(traj, L).to(trained.device)  # (n, T_local, L)
        pos = torch.cat([pos, pos.new_zeros(n, T - pos.shape[1], L)], 1)  # (n, T, L)
        mask = pos & trained[:, None, :]
        sample, step = mask.any(-1).nonzero(as_tuple=True)  # (M,) each
        real, select = sample.numel(), trained
        if real == 0:  # one row outside the mask keeps the loss on the graph (zero gradient)
            b, t = traj.any_action()
            sample, step = torch.tensor([b], device=trained.device), torch.tensor([t], device=trained.device)
            select = torch.ones_like(trained)
        index = sample * T + step

        def run(forward: Forward) -> torch.Tensor:
            vals = replay_logps(forward, traj, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, sample, step,
                                select[sample])  # (M, L)
            return vals.new_zeros(n * T, L).index_copy(0, index, vals).view(n, T, L)

        return CJGRPOPlan(mask.float(), run, real, T)

    @staticmethod
    def _global_steps(ctx: StepContext, T: int) -> int:
        """The most steps any process's sampler took (``decode=threshold|factor`` can differ), so the
        (n, T, L) units gather; the sum of one-hot counts, so no collective beyond all_reduce_sum."""
        shard = ctx.rollout.shard
        if shard.world_size == 1:
            return T
        counts = torch.zeros(shard.world_size, dtype=torch.float64, device=ctx.rollout.completion_ids.device)
        counts[shard.rank] = T
        return int(shard.all_reduce_sum(counts).max())

    # ---- per inner update ---------------------------------------------------------------
    def old_logp_iter(self, inner_iter: int) -> int:
        """One set of old log-probs per rollout: a transition is scored without random masks, so every
        inner update shares them (the public code takes them once, at rollout time)."""
        return 0

    def old_logp_like_policy(self) -> bool:
        return super().old_logp_like_policy() and self.cfg.old_logp == "recompute"

    def logp_units(self, ctx: StepContext, forward: Forward, role: str) -> LogpUnits:
        plan = self.plan(ctx)
        mask = plan.mask
        if role == "old" and self.cfg.old_logp == "recorded":
            recorded = self.sampler_units(ctx)
            assert recorded is not None, "objective.old_logp=recorded needs the sampler's log-probs"
            return LogpUnits(recorded, mask)
        if role == "ref":  # a frozen policy: its values serve every inner update of the rollout
            if plan.ref_logp is None:
                plan.ref_logp = plan.run(forward)
            return LogpUnits(plan.ref_logp, mask)
        return LogpUnits(plan.run(forward), mask)

    def unit_advantages(self, ctx: StepContext) -> torch.Tensor:
        """(n, 1, 1) per sample, or (n, 1, L) per token: the same for every transition."""
        adv = ctx.rollout.advantages
        return adv[:, None, None] if adv.dim() == 1 else adv[:, None, :]

    def sampler_units(self, ctx: StepContext) -> torch.Tensor | None:
        """The sampler's log-prob of each trained token at the transition that unmasked it: the old
        log-prob of that transition's state, from the logits the sampler committed it with."""
        ro = ctx.rollout
        mask = self.plan(ctx).mask
        if isinstance(ro.trajectory, UniformTrajectory):  # each accepted token's log-prob at its step's temperature
            rec = ro.trajectory.position_logps(mask.shape[-1]).to(mask)
            return torch.cat([rec, rec.new_zeros(rec.shape[0], mask.shape[1] - rec.shape[1], rec.shape[2])], 1) * mask
        if ro.sampler_logp is None:
            return None
        return ro.sampler_logp.to(mask)[:, None, :] * mask  # (n, T, L)

    def kl_term(self, policy: LogpUnits, ref: LogpUnits, gather: Callable[[torch.Tensor], torch.Tensor],
                group_size: int) -> torch.Tensor:
        """The k3 KL to the reference, reduced as the policy loss (:func:`transition_mean`)."""
        kl = gather(kl_penalty(policy.logp, ref.logp))  # (N, T, L)
        return transition_mean(kl, gather(policy.mask), group_size if self.cfg.agg == "group" else 1)

    def extra_metrics(self, ctx: StepContext) -> dict[str, torch.Tensor]:
        plan = self.plan(ctx)
        n = max(ctx.rollout.completion_ids.shape[0], 1)
        return {
            "cj_grpo/tokens_per_transition": plan.mask.sum() / max(plan.rows, 1),
            "cost/train_forwards_per_sample": torch.tensor(plan.rows / n),
        }
