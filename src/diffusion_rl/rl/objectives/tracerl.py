"""TraceRL: trajectory-aware PPO over the sampler's own decoding order (Wang et al. 2025).

The rollout records when each completion token was committed (``TrajectoryRecorder``). Neighbouring
steps are merged ``shrink`` at a time into rounds (over the whole completion of a masked model, per
block of a block model); a training row ``(j, r)`` masks every token of sample ``j`` decoded in round
``r`` or later and trains on the tokens of round ``r`` (``likelihood/trace.py``). Per trained token
``i`` of row ``k`` (``M`` rows; rows with no trained token do not exist):

    rho_i  = exp(lr_i),  lr_i = log pi_theta(x_i | row k) - log pi_old(x_i | row k)
    loss   = -(1/M) sum_k n_k^-1 sum_{i in k} min(rho_i A_j, clip(rho_i, 1 - eps, 1 + eps) A_j)
           + beta_old (1/M) sum_k m_k^-1 sum_{i in k} [exp(-lr_i) - 1 + lr_i]        (k3 KL to pi_old)

``pi_old`` is the rollout policy (the KL is to it, not to a reference model). Normalisation
(``objective.norm``): ``block`` (``rl_sdar.py`` / ``rl_trado.py``): ``n_k = m_k = L``, the padded
completion length, and ``lr`` clamped to [-10, 10] (in the KL, the exponent only); ``masked``
(``rl_llada.py``, ``rl_dream.py``): ``n_k`` = the row's trained tokens, ``m_k = 1`` (the KL summed),
no clamp. ``auto`` (default): ``block`` for a block model, ``masked`` otherwise. ``A_j`` is the
rollout's advantage: ``advantage=zscore`` (``conf/objective/tracerl.yaml``), the group z-score with
the population std of ``reward/rl_reward.py``. Groups that file drops train nothing here (their
samples make no rows): with ``objective.pass_threshold`` set (a sample passes when its reward is
``>= pass_threshold``), every group whose pass rate lies outside ``[pass_min, pass_max]`` = [0.2,
0.8]; with ``pass_threshold=null`` (default), every group whose rewards all agree.

Source: paper arXiv:2509.06949; Gen-Verse/dLLM-RL @ 10b4fd1: ``train/rl_sdar.py`` L366-547 (rows,
``one_round_vectorized``, staircase input), L711-760 (``forward_process``; ``rl_trado.py`` is the
same file), ``train/rl_llada.py`` L248-292 (rows), L573-607 (``forward_process``),
``reward/rl_reward.py`` L74-124 (z-score, pass-rate filter, truncation). Public settings: eps 0.2,
beta 0.01 with k3, shrink 1 (SDAR/TraDo) / 8 (LLaDA), lr 1e-6.

Deviations, each with its reason (the loss itself is transcribed: ``tests/unit/rl/test_tracerl.py``):

- Rows are not chunked into optimizer steps by a data loader: one rollout feeds ``objective.mu``
  optimizer steps, each on a contiguous ``1/mu`` share of the rows in the public order (sample-major,
  then rounds; the same shares on any number of processes); the public code runs one epoch over the
  rows in steps of ``batch_size_lm x processes x accumulation`` rows. ``pi_old`` is the rollout
  policy for every share, as there. Default ``mu = 1`` (the CPU Sudoku job). One update's rows go
  through the model in one batch (the module has no micro-batching), so ``mu`` also bounds that batch
  on a real model (LLaDA at shrink 8 makes ~64 rows per 512-token sample). The public accumulation loop's quirks
  (the first step after ``accum - 1`` micro-batches, the last partial one never stepped) are not
  reproduced. A share with no row runs one empty row through the model (zero loss and gradient).
- ``L`` (block normalisation) is the completion width of the rollout (``sampler.gen_length``); the
  public code pads responses to the longest in the rollout file.
- Trained tokens are the rollout's ``scored_mask`` (up to and including the first EOS; with
  ``task.loss_mask=reward`` only what the reward reads). The public ``post_num = 0`` leaves out
  every pad token, the first EOS/pad included; here the first EOS is trained (the embedded tokenizer
  has no separate end-of-turn token, so the model would never learn to stop). Positions after it
  are masked in the rows per their recorded steps, as the public code masks its pads.
- A position the sampler left masked (it drew the mask token at the position's last step, which a
  random or small model can do) is masked in every row and trained in none; the public step map
  (``denoise_step_map``, zeros where nothing changed) would give it step 0 and train it towards the
  mask token. Positions ``sampler.stop_after_eos`` filled without a step are treated the same.
- A position where ``lr`` is not finite-safe is never read: untrained positions hold 0 in both
  ``logp`` and ``old_logp`` (``torch.where`` before ``exp``); the public ``rl_llada.py`` multiplies
  ``exp`` of every position by the mask, the same value whenever it is finite.
- The pass-rate band needs a pass/fail reward (the public code's 0/1 correctness); this project's
  rewards are often partial (Sudoku's cell fraction, countdown's 0.1 for a wrong answer), where no
  pass rate exists. So the band is on only with ``objective.pass_threshold`` (e.g. 1.0 for 0/1
  rewards, 2.0 for MATH500's correctness term); without it only the groups the band drops whatever
  the threshold, those whose rewards all agree (pass rate 0 or 1), are dropped.
- ``truncated responses count as wrong``: ``rollout.truncated_reward=0`` (a rollout option, any
  objective) gives a completion without EOS reward 0; off by default, since a Sudoku answer fills
  the whole completion. The public rule is response length ``>= max - 5``.
- ``objective.beta`` (KL to a reference policy, the project's shared term) defaults to 0 as in the
  public code; a positive value adds it on the trained tokens (``token-mean``), a deviation.
- The value-model variant (per-token GAE with a second, separately trained network:
  ``train/train_sdar_value.py``) is not implemented: it needs a second model class and optimizer,
  which the one-policy module has no seam for.
- ``behaviour_correction=tis`` and ``rollout/mismatch_log_ratio`` use the sampler's recorded
  log-prob of each token, which is the row's old log-prob only when rounds are single steps
  (``shrink = 1``); with ``shrink > 1`` TIS is refused and no mismatch is logged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from diffusion_rl.core.errors import ConfigError, check_choice
from diffusion_rl.likelihood.trace import (
    block_logps,
    masked_logps,
    round_rows,
    row_masks,
    trace_rounds,
)
from diffusion_rl.likelihood.trajectory import replay_logps, step_positions
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.objectives.base import OBJECTIVES, LogpUnits, Objective, StepContext
from diffusion_rl.rl.objectives.config import LikelihoodNeed, ObjectiveConfig, check_clip
from diffusion_rl.rl.objectives.losses import ratio_metrics
from diffusion_rl.sampling.trajectory import TrajectoryRecorder
from diffusion_rl.sampling.uniform_trajectory import Trajectory, UniformTrajectory

NORMS = ("auto", "block", "masked")
KL_ESTIMATORS = ("k3", "k1")
LOG_RATIO_CLAMP = 10.0  # rl_sdar.py clamps the log-ratio (and the KL's exponent) to +-10
SAME_REWARD = 1e-6  # rewards closer than this agree (as the rollout's zero-std groups)


@dataclass
class TraceRLConfig(ObjectiveConfig):
    name: str = "tracerl"
    # no reference model: TraceRL's KL is to the rollout policy (beta_old); > 0 adds the shared
    # reference KL on the trained tokens, which the public code does not have
    beta: float = 0.0
    eps: float = 0.2  # the public clip range, both sides
    beta_old: float = 0.01  # weight of the KL to the rollout policy (public `training.beta`)
    kl_estimator: str = "k3"  # k3 (public use_kl_estimator_k3: true) | k1 (the plain log-ratio)
    # neighbouring steps merged into one training row: the public code uses 1 for SDAR / TraDo
    # (rl_sdar.yaml) and 8 for LLaDA (rl_llada.yaml, 512 one-token steps). The CPU Sudoku sampler
    # commits 2 cells per step in 8 steps, where 8 would merge the whole trajectory into one fully
    # masked row; 1 keeps every step. Set 8 for LLaDA-scale runs
    shrink: int = 1
    norm: str = "auto"  # auto (block for a block model, else masked) | block (rl_sdar) | masked (rl_llada)
    # with pass_threshold set, groups whose pass rate is outside [pass_min, pass_max] train nothing
    # (reward/rl_reward.py drops them)
    pass_min: float = 0.2
    pass_max: float = 0.8
    # a sample passes when its reward >= this (1.0 for 0/1 rewards). null: the rewards are no pass/fail
    # (Sudoku's cell fraction), so only the groups whose rewards all agree are dropped
    pass_threshold: float | None = None

    def validate(self) -> None:
        super().validate()
        check_clip(self.eps)
        if self.beta_old < 0:
            raise ConfigError("objective.beta_old", self.beta_old, "must be >= 0")
        check_choice("objective.kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        if self.shrink < 1:
            raise ConfigError("objective.shrink", self.shrink, "must be >= 1 (steps merged per training row)")
        check_choice("objective.norm", self.norm, NORMS)
        if not 0 <= self.pass_min <= self.pass_max <= 1:
            raise ConfigError("objective.pass_min", self.pass_min,
                              f"must satisfy 0 <= pass_min <= pass_max={self.pass_max} <= 1")
        if self.behaviour_correction != "none" and self.shrink > 1:
            raise ConfigError("objective.behaviour_correction", self.behaviour_correction,
                              f"needs objective.shrink=1 (with shrink={self.shrink} a row's state is not the "
                              "one the sampler committed each token from)")


def tracerl_loss(
    logp: torch.Tensor,  # (M, L) per-token log-probs of each row's trained tokens (0 elsewhere), with grad
    old_logp: torch.Tensor,  # (M, L) the rollout policy's, no grad
    advantages: torch.Tensor,  # (M, 1) the row's sample's advantage, or (M, L) per token
    mask: torch.Tensor,  # (M, L) the row's trained tokens; a row with none is padding and does not count
    cfg: TraceRLConfig,
    *,
    group_size: int,
    surrogate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TraceRL's per-token PPO loss + KL to the rollout policy; pure function of tensors (``group_size``
    and ``surrogate`` are not used: rows are (sample, round) pairs, each with its own advantage)."""
    if cfg.norm not in ("block", "masked"):
        raise ValueError(f"objective.norm={cfg.norm!r} must be resolved to block or masked (TraceRL.bind)")
    m = mask.bool()
    mf = m.to(logp.dtype)
    rows = m.any(-1).sum().clamp_min(1)  # the public code drops rows with nothing to train
    d = torch.where(m, logp - old_logp.detach(), torch.zeros_like(logp))  # (M, L)
    block = cfg.norm == "block"
    log_ratio = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) if block else d
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - cfg.eps, 1 + cfg.eps)
    surr = torch.min(ratio * advantages, clipped * advantages) * mf  # (M, L)
    per_row = surr.sum(-1) / (logp.shape[-1] if block else mf.sum(-1).clamp_min(1))  # (M,)
    loss = -(per_row.sum() / rows)
    kl = d
    if cfg.kl_estimator == "k3":
        expo = (-d).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) if block else -d
        kl = expo.exp() - 1.0 + d
    kl_rows = (kl * mf).sum(-1) / (logp.shape[-1] if block else 1)  # (M,)
    kl_term = kl_rows.sum() / rows
    if cfg.beta_old > 0:
        loss = loss + cfg.beta_old * kl_term
    metrics = ratio_metrics(d, mf, (ratio < 1 - cfg.eps) & (advantages < 0), (ratio > 1 + cfg.eps) & (advantages > 0))
    metrics.update({"tracerl/kl_old": kl_term.detach(), "tracerl/rows": rows.detach().float(),
                    "tracerl/tokens_per_row": mf.sum().detach() / rows})
    return loss, metrics


@dataclass
class RoundBatch:
    """One inner update's rows: a (sample, round) pair each, padded to the same count on every process."""

    inner_iter: int
    sample: torch.Tensor  # (m,) the sample of each row
    round: torch.Tensor  # (m,) its decoding round
    masked: torch.Tensor  # (m, L) the positions still masked at that round (the row's input)
    trained: torch.Tensor  # (m, L) the positions decoded in that round that the loss counts
    select: torch.Tensor  # (m, L) where the head computes log-probs
    real: int  # rows before padding (0: one empty row keeps the loss on the graph)
    rows: int  # the largest row count over the processes


@dataclass
class TraceRLPlan:
    """What TraceRL's inner updates of one rollout share."""

    rounds: torch.Tensor  # (n, L) the decoding round of every completion position
    kept: torch.Tensor  # (n,) the samples the pass-rate filter keeps
    sample: torch.Tensor  # (m,) every (sample, round) row of the rollout: its sample
    round: torch.Tensor  # (m,) and its round
    update: torch.Tensor  # (m,) the inner update that trains each row
    batch: RoundBatch | None = None  # the latest inner update's rows


@OBJECTIVES.register("tracerl")
class TraceRL(Objective):
    config_class = TraceRLConfig
    cfg: TraceRLConfig
    policy_loss = staticmethod(tracerl_loss)
    advantage_estimators: ClassVar[tuple[str, ...]] = ("zscore", "group", "group_std", "loo")
    token_credit = True
    needs_trajectory = True
    uniform_likelihoods = ("*",)  # a uniform-noise sampler's steps replay as they were (likelihood/trajectory.py)
    kl_agg = "token-mean"  # the optional reference KL (beta > 0): mean over every trained token
    needs_likelihood = LikelihoodNeed("objective=tracerl scores the rollout's own decoding rounds "
                                      "(likelihood/trace.py); leave likelihood at one_step", one_step=True)
    block_size = 0  # the model's (bind): 0 = masked diffusion
    uniform = False  # a uniform-noise model (bind): rows are the recorded steps

    def bind(self, bundle) -> None:
        self.uniform = getattr(bundle, "noise", "mask") == "uniform"
        if self.uniform:  # a row is a recorded step: its canvas and self-conditioning, its accepted tokens
            if self.cfg.shrink != 1:
                raise ConfigError("objective.shrink", self.cfg.shrink, "must be 1 with a uniform-noise model: each "
                                  "step has a canvas of its own, so steps cannot merge into one row")
            if self.cfg.norm == "auto":  # a block-autoregressive model, as SDAR / TraDo (rl_sdar.py)
                self.cfg = replace(self.cfg, norm="block")
            return
        self.block_size = int(bundle.block_size)
        if self.block_size and not bundle.custom_attention_mask:
            raise ConfigError("model.custom_attention_mask", False,
                              "objective=tracerl on a block model scores each round's blocks against their clean "
                              "prefix in one staircase forward: needs a model that takes a 4D mask and position ids")
        if self.cfg.norm == "auto":
            self.cfg = replace(self.cfg, norm="block" if self.block_size else "masked")

    # ---- rollout time -------------------------------------------------------------------
    def select_steps(self, trajectory: Trajectory, completion_ids: torch.Tensor,
                     completion_mask: torch.Tensor, eos_id: int, rollout_id: int,
                     run_seed: int) -> tuple[torch.Tensor, dict[str, float]]:
        """Every recorded step is trained: nothing to select (the rows are built at update time)."""
        if isinstance(trajectory, UniformTrajectory):
            per_step = (trajectory.counts > 0).sum(-1).float()  # (n,)
            return completion_ids.new_zeros(completion_ids.shape[0], 0), {
                "tracerl/rounds_per_sample": per_step.mean().item() if per_step.numel() else 0.0}
        rounds = self._rounds(trajectory, completion_ids.shape[1])
        per_sample = torch.where(rounds == torch.iinfo(torch.int32).max, -1, rounds).amax(-1) + 1  # (n,)
        return completion_ids.new_zeros(completion_ids.shape[0], 0), {
            "tracerl/rounds_per_sample": per_sample.float().mean().item() if per_sample.numel() else 0.0}

    def _rounds(self, traj: TrajectoryRecorder, L: int) -> torch.Tensor:
        assert traj.commit_step is not None, "TraceRL needs the rollout's recorded trajectory"
        return trace_rounds(traj.commit_step[:, -L:], self.block_size or L, self.cfg.shrink)  # (n, L)

    # ---- per rollout: which samples train, and their rows -------------------------------
    def kept_samples(self, ctx: StepContext) -> torch.Tensor:
        """(n,) bool: this process's samples whose group trains: pass rate inside [pass_min, pass_max]
        (with ``pass_threshold``), else rewards that differ."""
        c, ro = self.cfg, ctx.rollout
        r = ro.all_rewards.double().view(-1, ro.group_size)  # (N/G, G) every process's rows
        if c.pass_threshold is None:
            group_keep = (r.amax(-1) - r.amin(-1)) > SAME_REWARD  # (N/G,)
        else:
            rate = (r >= c.pass_threshold).double().mean(-1)  # (N/G,) as sum(correct) / len(correct)
            group_keep = (rate >= c.pass_min) & (rate <= c.pass_max)
        keep = group_keep.repeat_interleave(ro.group_size)  # (N,)
        n = ro.completion_ids.shape[0]
        return keep[ro.shard.offset:ro.shard.offset + n].to(ro.completion_ids.device)

    def make_plan(self, ctx: StepContext) -> TraceRLPlan:
        """Rounds (n, L), kept samples and the rows of every inner update of this rollout."""
        ro = ctx.rollout
        assert ro.trajectory is not None, "objective=tracerl needs the rollout's trajectory"
        kept = self.kept_samples(ctx)
        if isinstance(ro.trajectory, UniformTrajectory):  # rows: (sample, step) pairs that accepted a trained token
            L = ro.completion_ids.shape[1]
            hit = step_positions(ro.trajectory, L).to(kept.device) & (ro.scored_mask.bool() & kept[:, None])[:, None]
            sample, rnd = hit.any(-1).nonzero(as_tuple=True)  # sample-major, then steps
            rounds = torch.zeros_like(ro.completion_ids)  # not used: a row's positions are its step's
            return TraceRLPlan(rounds, kept, sample, rnd, self._update_of_rows(ctx, sample))
        rounds = self._rounds(ro.trajectory, ro.completion_ids.shape[1]).to(ro.completion_ids.device)
        sample, rnd = round_rows(rounds, ro.scored_mask.bool() & kept[:, None])  # (m,) each
        return TraceRLPlan(rounds, kept, sample, rnd, self._update_of_rows(ctx, sample))

    def _update_of_rows(self, ctx: StepContext, sample: torch.Tensor) -> torch.Tensor:
        """(m,) the inner update of each local row: the global row list (every process's rows in sample
        order, as one process would hold them) cut into ``mu`` contiguous equal shares, so the shares do
        not depend on the number of processes."""
        ro, mu = ctx.rollout, self.cfg.mu
        n = ro.completion_ids.shape[0]
        counts = torch.bincount(sample, minlength=n)  # (n,) rows of each local sample
        every = ro.shard.gather(counts)  # (N,)
        first = (every.cumsum(0) - every)[ro.shard.offset:ro.shard.offset + n]  # (n,) global index of its 1st row
        position = first[sample] + (torch.arange(sample.numel(), device=sample.device)
                                    - (counts.cumsum(0) - counts)[sample])  # (m,) global row index
        return position * mu // every.sum().clamp_min(1)

    def _batch(self, ctx: StepContext) -> RoundBatch:
        """This inner update's rows, padded to the same count on every process; kept in the plan."""
        plan: TraceRLPlan = self.plan(ctx)
        if plan.batch is not None and plan.batch.inner_iter == ctx.inner_iter:
            return plan.batch
        ro = ctx.rollout
        idx = (plan.update == ctx.inner_iter % self.cfg.mu).nonzero()[:, 0]
        sample, rnd = plan.sample[idx], plan.round[idx]  # (m,)
        if isinstance(ro.trajectory, UniformTrajectory):
            masked = decoded = step_positions(ro.trajectory, ro.completion_ids.shape[1]).to(sample.device)[sample, rnd]
        else:
            masked, decoded = row_masks(plan.rounds, sample, rnd)  # (m, L)
        trained = decoded & ro.scored_mask.bool()[sample]
        m, M = sample.numel(), self._global_rows(ctx, sample.numel())
        select = trained
        if m == 0 and isinstance(ro.trajectory, UniformTrajectory):  # a step outside the loss keeps the graph
            b, t = ro.trajectory.any_action()
            sample, rnd = sample.new_full((1,), b), rnd.new_full((1,), t)
            trained = torch.zeros_like(ro.completion_mask[:1], dtype=torch.bool)
            masked = select = torch.ones_like(trained)
        elif m == 0:  # one empty row keeps the loss on the graph (zero gradient)
            sample, rnd = sample.new_zeros(1), rnd.new_zeros(1)
            masked = torch.ones_like(ro.completion_mask[:1], dtype=torch.bool)
            trained = torch.zeros_like(masked)
            select = torch.zeros_like(masked)
            select[:, 0] = True
        plan.batch = RoundBatch(ctx.inner_iter, sample, rnd, masked, trained, select, m, M)
        return plan.batch

    @staticmethod
    def _global_rows(ctx: StepContext, m: int) -> int:
        """The largest row count of this update over the processes (rows are gathered, so every process
        pads to it); the sum of one-hot counts, so no collective beyond all_reduce_sum is needed."""
        shard = ctx.rollout.shard
        if shard.world_size == 1:
            return max(m, 1)
        counts = torch.zeros(shard.world_size, dtype=torch.float64, device=ctx.rollout.completion_ids.device)
        counts[shard.rank] = m
        return max(int(shard.all_reduce_sum(counts).max()), 1)

    def _pad(self, x: torch.Tensor, M: int) -> torch.Tensor:
        """(m, ...) -> (M, ...) with zero rows after the real ones."""
        return torch.cat([x, x.new_zeros(M - x.shape[0], *x.shape[1:])]) if x.shape[0] < M else x

    # ---- per inner update ---------------------------------------------------------------
    def logp_units(self, ctx: StepContext, forward: Forward, role: str) -> LogpUnits:
        b, ro = self._batch(ctx), ctx.rollout
        s = b.sample
        if isinstance(ro.trajectory, UniformTrajectory):  # each row's step replayed (likelihood/trajectory.py)
            logp = replay_logps(forward, ro.trajectory, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, s, b.round,
                                b.select)  # (m, L)
            return LogpUnits(self._pad(logp, b.rows), self._pad(b.trained.to(logp.dtype), b.rows))
        args = (forward, ro.prompt_ids[s], ro.prompt_mask[s], ro.completion_ids[s], b.masked, b.select,
                self.likelihood.mask_id)
        logp = block_logps(*args, self.block_size) if self.block_size else masked_logps(*args)  # (m, L)
        mask = b.trained.to(logp.dtype)
        return LogpUnits(self._pad(logp, b.rows), self._pad(mask, b.rows))

    def unit_advantages(self, ctx: StepContext) -> torch.Tensor:
        """Each row's sample's advantage: (M, 1), or (M, L) with per-token advantages."""
        b = self._batch(ctx)
        adv = ctx.rollout.advantages[b.sample]
        return self._pad(adv[:, None] if adv.dim() == 1 else adv, b.rows)

    def sampler_units(self, ctx: StepContext) -> torch.Tensor | None:
        """The sampler's log-prob of each trained token, from the logits it committed it with: the old
        log-prob of the row's state when rounds are single steps (shrink = 1), else not comparable."""
        ro, b = ctx.rollout, self._batch(ctx)
        if isinstance(ro.trajectory, UniformTrajectory):  # the step's recorded log-prob of each trained token
            rec = ro.trajectory.position_logps(ro.completion_ids.shape[1]).to(b.select.device)[b.sample, b.round]
            return self._pad(rec * b.trained.to(rec.dtype), b.rows)
        if ro.sampler_logp is None or self.cfg.shrink > 1:
            return None
        q = ro.sampler_logp[b.sample] * b.trained.to(ro.sampler_logp.dtype)  # (m, L)
        return self._pad(q, b.rows)

    def extra_metrics(self, ctx: StepContext) -> dict[str, torch.Tensor]:
        plan, b, ro = self.plan(ctx), self._batch(ctx), ctx.rollout
        n = max(ro.completion_ids.shape[0], 1)
        return {
            "tracerl/kept_frac": plan.kept.float().mean(),
            "tracerl/rows_per_sample": torch.tensor(plan.sample.numel() / n),
            "cost/train_forwards_per_sample": torch.tensor(b.real / n),
        }
