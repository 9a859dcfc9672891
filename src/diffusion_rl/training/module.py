"""``DiffusionRLModule``: the RL loop for a diffusion LM as a LightningModule (manual optimization).

Per batch of prompts, ``training_step`` is four calls:
1. :meth:`rollout`: ``G`` completions per prompt from the old policy, scored, with advantages
   (``diffusion_rl/rl/rollout.py``, which knows nothing of Lightning);
2. :meth:`step_context`: what the objective needs (policy forwards; old log-probs when precomputed);
3. ``mu`` x :meth:`inner_update`: the objective's loss and its backward (part by part where the
   objective splits it, ``Objective.loss_parts``), total gradient norm *before* clipping, clip,
   optimizer step. A non-finite loss or gradient skips the update, counts it in
   ``train/skipped_updates`` and leaves weights and optimizer untouched;
4. :meth:`sync_old_policy`: copy the policy into the old policy.

With ``rollout.staleness=k > 0`` (``training/async_rollout.py``) step 1 is a rollout worker's: the
batch is submitted to it and the batch submitted ``k`` batches earlier trains, its sampling weights
loaded into the old policy in place of step 4.

``old_policy=copy`` keeps a frozen copy of the policy as the old policy; ``old_policy=precomputed``
keeps none: the rollout is sampled with the policy itself and, before the first update, the
objective's ``compute_old_logp`` (old log-probs / ELBOs on every inner iteration's mask seeds) are computed
from the same weights (``Objective.precompute_old_logp``). Both give the same losses. With LoRA the
reference policy (``beta > 0``) is the base model with the adapters switched off, not a copy.

Data parallel (DDP, FSDP): every process reads the same prompts and keeps its contiguous share of the
``prompts x G`` rows (``diffusion_rl/core/distributed.py``); rewards are gathered once, before the
advantages, and the objective's loss and metrics are computed on the gathered rows, so every row of
metrics is already global.

The math lives elsewhere (sampler, likelihood estimators, objectives, rewards); this file only
orchestrates. Each batch fills a :class:`StepRecord`, which only this module writes: the rollout and
one row of metrics (docs/methods.md §6 names) per optimizer step. ``training/callbacks.py``'s
``DiagnosticsCallback`` adds the gradient-spike metrics to the rows and writes them to the loggers
after each batch; ``training/progress.py``'s bar shows the last one.

Everything else is the callbacks' and ``train()``'s: what a checkpoint holds and how a resume puts
it back (``training/checkpoint.py``'s ``RunCheckpoint``: the trainable tensors, the counters below,
the global generators, the run's config and warm start), faults on purpose (``training/faults.py``
wraps the objective or the task from outside), and the config checks (``app/train.py``'s ``build``).
Every collaborator comes in through the constructor.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from torch.utils.data import DistributedSampler

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.adapters import has_adapter, reference_logits_fn
from diffusion_rl.models.llada2 import LLaDA2MoE, router_metrics
from diffusion_rl.models.policy import PolicyBundle, dropout_disabled, logits_fn
from diffusion_rl.rl.advantages import AdvantageEstimator
from diffusion_rl.rl.batch import Rollout
from diffusion_rl.rl.objectives.base import Objective, StepContext
from diffusion_rl.rl.rollout import RolloutConfig, RolloutEngine
from diffusion_rl.sampling import SamplerConfig
from diffusion_rl.tasks.base import Task
from diffusion_rl.training.async_rollout import RolloutPipeline
from diffusion_rl.training.strategy import (
    FSDP2Strategy,
    broadcast_from_first,
    clip_grad_norm,
    fsdp_units,
    gathered,
    shard,
)

if TYPE_CHECKING:
    from diffusion_rl.training.rollout_ranks import RolloutGroup


@dataclass
class OptimConfig:
    lr: float = 3e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0  # max total norm; 0 = no clipping (the norm is still logged)
    warmup_steps: int = 0
    # linear decay of the learning rate to 0 over this many optimizer steps (StableDRL's linear_decay,
    # 2000 steps); 0 = constant after the warm-up
    decay_steps: int = 0
    max_consecutive_skips: int = 50  # stop with an error instead of looping on a broken run

    def validate(self) -> None:
        if self.lr <= 0:
            raise ConfigError("optim.lr", self.lr, "must be > 0")
        if self.grad_clip < 0:
            raise ConfigError("optim.grad_clip", self.grad_clip, "must be >= 0 (0 = off)")
        if self.weight_decay < 0:
            raise ConfigError("optim.weight_decay", self.weight_decay, "must be >= 0")
        if self.warmup_steps < 0:
            raise ConfigError("optim.warmup_steps", self.warmup_steps, "must be >= 0")
        if self.decay_steps < 0:
            raise ConfigError("optim.decay_steps", self.decay_steps, "must be >= 0 (0 = no decay)")

    def lr_factor(self, step: int) -> float:
        """The learning rate at optimizer step ``step`` (from 0) over ``lr``: the linear warm-up, then
        the linear decay to 0 at ``decay_steps`` when set."""
        warm = min(1.0, (step + 1) / (self.warmup_steps + 1)) if self.warmup_steps else 1.0
        return warm * (max(0.0, 1.0 - step / self.decay_steps) if self.decay_steps else 1.0)


OLD_POLICIES = ("copy", "precomputed")  # the old policy: a frozen copy, or its log-probs taken at rollout time


def check_old_policy(value: str) -> None:
    if value not in OLD_POLICIES:
        raise ConfigError("old_policy", value, f"allowed: {', '.join(OLD_POLICIES)}")


@dataclass
class StepRecord:
    """What one training batch did, written by the module alone and read by the callbacks after it
    (``DiagnosticsCallback`` logs the rows, ``RLProgressBar`` shows the last one)."""

    rollout: Rollout | None = None  # the batch's rollout: the table of sample completions, the bar's reward
    # one row of metrics per optimizer step of the batch (a skipped update leaves one too): (step, row)
    rows: list[tuple[int, dict[str, float]]] = field(default_factory=list)


class DiffusionRLModule(L.LightningModule):

    def __init__(self, bundle: PolicyBundle, task: Task, objective: Objective, advantage: AdvantageEstimator,
                 sampler: SamplerConfig, optim: OptimConfig, seed: int = 0, old_policy: str = "copy",
                 rollout: RolloutConfig | None = None, rollout_group: RolloutGroup | None = None):
        super().__init__()
        # the configs were validated where they were read (app/train.py's build); a mode string is
        # checked here too, since an unknown one would otherwise run as "precomputed"
        check_old_policy(old_policy)
        self.bundle, self.task, self.objective = bundle, task, objective
        self.sampler_cfg, self.optim_cfg, self.seed = sampler, optim, seed
        self.rollouts = RolloutEngine(bundle, task, objective, advantage, sampler, rollout, seed)
        # rollout.staleness > 0: a worker samples ahead of the trainer (training/async_rollout.py; the
        # config was checked by app/train.py's check_staleness); rollout ranks sample even at staleness 0
        self.pipeline = (RolloutPipeline(self.rollouts, rollout.staleness, rollout.worker, rollout.worker_threads,
                                         rollout_group, rollout.push_every)
                         if rollout is not None and (rollout.staleness or rollout_group is not None) else None)
        self.policy = bundle.net
        copy_net = lambda: copy.deepcopy(bundle.net).requires_grad_(False).eval()
        # a ratio-free objective that scores no old policy needs no frozen copy of it: the
        # rollout then samples with the policy itself, as with old_policy=precomputed
        self.old_policy = copy_net() if old_policy == "copy" and objective.needs_old_logp() else None
        self.needs_ref = objective.cfg.beta > 0
        self.ref_policy = copy_net() if self.needs_ref and not has_adapter(bundle.net) else None
        self.automatic_optimization = False
        self.rollout_count = 0
        self.skipped_updates = 0
        self.has_routers = any(isinstance(m, LLaDA2MoE) for m in bundle.net.modules())  # moe/* metrics per update
        self.consecutive_skips = 0
        # a checkpoint holds what trains (training/checkpoint.py's RunCheckpoint): a tensor a state dict
        # lacks keeps its value, the base's; that callback refuses the tensors this module lacks
        self.strict_loading = False
        self.record = StepRecord()  # what the last training batch did, for the callbacks

    # ---- Lightning plumbing -------------------------------------------------------------
    def configure_model(self) -> None:
        """``trainer=fsdp``: shard the policy (and a frozen reference copy) with FSDP2 and fill every
        process's shards from the first process's weights (``training/strategy.py``); else nothing.
        Checkpoints then hold only what trains, so the frozen tensors a checkpoint lacks stay as built."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        if not isinstance(strategy, FSDP2Strategy) or fsdp_units(self.policy):
            return
        first = strategy.global_rank == 0
        for net in (n for n in (self.policy, self.ref_policy) if n is not None):
            full = {k: v for k, v in net.state_dict().items()} if first else None  # (unsharded, on the first process)
            buffers = {k: b.clone() for k, b in net.named_buffers()} if first else None
            shard(net, strategy.data_parallel_mesh, strategy.options)
            broadcast_from_first(net, full, buffers, strategy.root_device)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.policy.parameters() if p.requires_grad]

    def checkpoint_is_small(self) -> bool:
        """Whether a checkpoint holds a small part of the policy (LoRA adapters): one file under FSDP."""
        return has_adapter(self.policy)

    def configure_optimizers(self):
        c = self.optim_cfg
        opt = torch.optim.AdamW(self.trainable_parameters(), lr=c.lr, betas=tuple(c.betas), weight_decay=c.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, c.lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def _check_data_parallel(self) -> None:
        sampler = getattr(self.trainer.train_dataloader, "sampler", None)
        if self.trainer.world_size > 1 and isinstance(sampler, DistributedSampler):  # Lightning's subclass it
            raise ConfigError("trainer.extra.use_distributed_sampler", True,
                              "must be false with several processes: each reads the same prompts and keeps its rows")

    def on_train_start(self) -> None:
        self._check_data_parallel()

    # ---- the RL step --------------------------------------------------------------------
    def training_step(self, items: list[dict[str, Any]], batch_idx: int) -> None:
        self.record = StepRecord()  # a new one per batch: bounded even without the callbacks
        t0 = time.perf_counter()
        if self.pipeline is not None:
            self._stale_step(items)
        else:
            ro = self.rollout(items)
            self._updates(self.step_context(ro))
            self.sync_old_policy()
        if self.record.rows:  # the batch's wall time: its rollout (or the wait for it) and its updates
            self.record.rows[-1][1]["time/step_s"] = time.perf_counter() - t0

    def _updates(self, ctx: StepContext) -> None:
        for it in range(self.objective.cfg.mu):
            if self.trainer.global_step >= self.trainer.max_steps > 0:
                break  # trainer.max_steps counts optimizer steps: a rollout's last updates may fall past it
            self.inner_update(ctx, it)

    def _stale_step(self, items: list[dict[str, Any]]) -> None:
        """``rollout.staleness=k``: submit this batch to the rollout worker and train on the batch
        submitted ``k`` batches ago, with the weights that sampled it as the old policy (nothing
        during the first ``k`` batches)."""
        assert self.pipeline is not None
        if self.trainer.world_size > 1:
            raise ConfigError("rollout.staleness", self.pipeline.k, "runs with one training process for now "
                              "(rollout workers as ranks of their own under torchrun are not built)")
        taken = self.pipeline.step(self.rollout_count, items, self.policy)
        self.rollout_count += 1
        if taken is None:
            return
        done, metrics = taken
        ro = done.rollout
        ro.metrics.update(metrics)
        self.task.reward_failures += done.reward_failures
        self.record.rollout = ro
        if self.old_policy is not None:
            self.pipeline.load_version(done.version, self.old_policy)
        # a batch sampled with older weights than the policy's: its old log-probs are the old policy's own,
        # never the policy's (the ratio is not 1 at the first update)
        self._updates(self.step_context(ro, policy_is_old=done.version == self.pipeline.trained))
        self.pipeline.finish_step()

    def teardown(self, stage: str) -> None:
        self.stop_workers()

    def stop_workers(self) -> None:
        """Stop the rollout worker process (``rollout.staleness > 0``); it starts again at the next batch."""
        if self.pipeline is not None:
            self.pipeline.close()

    def rollout(self, items: list[dict[str, Any]]) -> Rollout:
        """Sample, score and compute advantages with the old policy (``rl/rollout.py``)."""
        old_policy = self.old_policy if self.old_policy is not None else self.policy
        with gathered(old_policy):  # FSDP: the weights gathered once for every denoising step
            ro = self.rollouts(items, old_policy, self.rollout_count)
        self.rollout_count += 1
        self.record.rollout = ro
        return ro

    def step_context(self, ro: Rollout, policy_is_old: bool = True) -> StepContext:
        """The forwards the objective calls; with ``old_policy=precomputed`` every inner iteration's old
        values are taken now, while the policy still is the old policy. ``policy_is_old``: whether the
        policy holds the weights that sampled ``ro`` (False only for a stale batch, with the frozen copy)."""
        ref = None
        if self.needs_ref:
            ref = logits_fn(self.ref_policy) if self.ref_policy is not None else reference_logits_fn(self.policy)
        policy = logits_fn(self.policy)
        if self.old_policy is not None:
            return StepContext(ro, 0, self.seed, policy, logits_fn(self.old_policy), ref, policy_is_old=policy_is_old)
        assert policy_is_old, "old log-probs taken from the policy need the policy to be the old policy"
        ctx = StepContext(ro, 0, self.seed, policy, policy, ref, policy_is_old=True)
        self.policy.eval()
        self.objective.precompute_old_logp(ctx, self.objective.cfg.mu)
        ctx.old_policy = None
        return ctx

    def sync_old_policy(self) -> None:
        if self.old_policy is not None:
            self.old_policy.load_state_dict(self.policy.state_dict())

    def inner_update(self, ctx: StepContext, inner_iter: int) -> None:
        """One optimizer step on the objective's loss; a non-finite loss or gradient skips it."""
        ctx.inner_iter, ctx.step = inner_iter, self.global_step
        opt, sched = self.optimizers(), self.lr_schedulers()
        assert not isinstance(opt, list) and sched is not None and not isinstance(sched, list)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss, metrics, norm = self._loss_and_gradient(ctx)
        ok = math.isfinite(norm)
        if not ok:
            opt.zero_grad(set_to_none=True)
            self.skipped_updates += 1
            self.consecutive_skips += 1
            if self.consecutive_skips > self.optim_cfg.max_consecutive_skips:
                raise RuntimeError(f"{self.consecutive_skips} consecutive updates had a non-finite loss or gradient; stopping")
            row = {"train/skipped_updates": float(self.skipped_updates), "train/loss": float(loss.detach())}
            self._log_row(row, step=self.global_step)
            return
        self.consecutive_skips = 0
        opt.step()
        ctx.policy_is_old = False
        sched.step()
        row = {k: float(v) for k, v in metrics.items()}
        if inner_iter == 0:
            row.update(ctx.rollout.metrics)
        row["grad/norm"] = norm  # pre-clip; the callback adds its EMA and spike flag
        if self.has_routers:
            row.update(router_metrics(self.policy))  # the routing of this update's forward
        row.update({"train/loss": float(loss.detach()), "train/lr": opt.param_groups[0]["lr"],
                    "train/skipped_updates": float(self.skipped_updates), "train/inner_iter": float(ctx.inner_iter),
                    "time/update_s": time.perf_counter() - t0})
        self._log_row(row, step=self.global_step)

    def _loss_and_gradient(self, ctx: StepContext) -> tuple[torch.Tensor, dict[str, torch.Tensor], float]:
        """The objective's loss, its backward and the total gradient norm before clipping (clipped in
        place); the norm is NaN when the loss is not finite (then the caller drops the gradients).

        The loss comes in parts (``Objective.loss_parts``; one for most objectives), each backpropagated
        as soon as it is computed, so the gradients accumulate and one part's graph is alive at a time.
        Forward and backward (whose activation checkpointing recomputes the forward) run with dropout
        off: the old log-probs were taken without it, so the ratio is exactly 1 at theta = theta_old."""
        self.policy.train()
        loss, metrics = torch.zeros(()), {}
        with dropout_disabled(self.policy):
            for part, part_metrics in self.objective.loss_parts(ctx):
                loss = loss.to(part.device) + part.detach()
                metrics.update(part_metrics)
                if not bool(torch.isfinite(part)):
                    return loss, metrics, math.nan
                # the loss is the global batch's on every process and strategies average gradients over
                # processes, so scale by their number (core/distributed.py)
                self.manual_backward(part * ctx.rollout.shard.world_size)
        clip = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
        return loss, metrics, clip_grad_norm(self.trainable_parameters(), clip)  # pre-clip, over every shard

    def _log_row(self, row: dict[str, float], step: int) -> None:
        self.record.rows.append((step, row))
