"""``DiffusionRLModule``: the RL loop for a diffusion LM as a LightningModule (manual optimization).

Per batch of prompts (one ``training_step``):
1. roll out ``G`` completions per prompt with the frozen old policy (the behaviour policy);
2. score them with the task's reward functions; group-relative advantages;
3. ``mu`` inner updates: the objective's loss (old log-probs on the same mask seeds), backward,
   total gradient norm *before* clipping, clip, optimizer step. A non-finite loss or gradient skips
   the update, counts it in ``train/skipped_updates`` and leaves weights and optimizer untouched;
4. copy the policy into the old policy.

``old_policy=copy`` keeps a frozen copy of the policy as the behaviour policy; ``old_policy=cached``
keeps none: the rollout is sampled with the policy itself and, before the first update, the
objective's ``old_values`` (old log-probs / ELBOs on every inner iteration's mask seeds) are computed
from the same weights (``Objective.precompute_old``). Both give the same losses. With LoRA the
reference policy (``beta > 0``) is the base model with the adapters switched off, not a copy.

Data parallel (DDP, FSDP): every process reads the same prompts and keeps its contiguous share of the
``prompts x G`` rows (``diffusion_rl/distributed.py``); rewards are gathered before advantages, the
objective's loss and metrics are computed on the gathered rows, so every row of metrics is already
global (``metrics_are_global``).

The math lives elsewhere (sampler, likelihood estimators, objectives, rewards); this file only
orchestrates. Every optimizer step leaves one row of metrics (SPEC §6 names) in ``pending_rows``;
``training/callbacks.py``'s ``DiagnosticsCallback`` adds the gradient-spike metrics, reduces rows
across processes and writes them to the loggers after each batch.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from diffusion_rl.distributed import Shard
from diffusion_rl.errors import ConfigError
from diffusion_rl.models.adapters import has_adapter, reference_logits_fn
from diffusion_rl.models.policy import PolicyBundle, decode_completions, encode_prompts, logits_fn
from diffusion_rl.objectives.base import Objective, Rollout, StepContext, group_advantages
from diffusion_rl.sampling import SamplerConfig
from diffusion_rl.sampling.block import policy_generate
from diffusion_rl.sampling.sampler import completion_mask
from diffusion_rl.seeding import mix_seed
from diffusion_rl.training.checkpoint import rng_state, set_rng_state
from diffusion_rl.training.strategy import clip_grad_norm

log = logging.getLogger(__name__)


@dataclass
class OptimConfig:
    lr: float = 3e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0  # max total norm; 0 = no clipping (the norm is still logged)
    warmup_steps: int = 0
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


class EntropyMeter:
    """Sampler recorder: mean full-vocabulary entropy of the committed tokens' distributions."""

    def __init__(self) -> None:
        self.total, self.count = 0.0, 0

    def on_step(self, step, x_before, logits, candidates, committed) -> None:
        logp = logits[committed].float().log_softmax(-1)  # (n, V)
        self.total += float(-(logp.exp() * logp).sum(-1).sum())
        self.count += int(committed.sum())

    def entropy_stats(self) -> tuple[float, int]:
        return self.total, self.count


class Recorders:
    """Fan one sampler's steps out to several recorders."""

    def __init__(self, *recorders) -> None:
        self.recorders = recorders

    def on_step(self, *args) -> None:
        for r in self.recorders:
            r.on_step(*args)


class DiffusionRLModule(L.LightningModule):
    metrics_are_global = True  # rows hold whole-batch values on every process: no cross-process merge

    def __init__(self, bundle: PolicyBundle, task, objective: Objective, sampler: SamplerConfig,
                 optim: OptimConfig, seed: int = 0, old_policy: str = "copy"):
        super().__init__()
        optim.validate()
        sampler.validate()
        if old_policy not in ("copy", "cached"):
            raise ConfigError("old_policy", old_policy, "allowed: copy, cached")
        if old_policy == "cached" and not objective.supports_cached_old():
            raise ConfigError("old_policy", old_policy, f"objective {objective.cfg.name} has no old_values(); use copy")
        if sampler.rollout_batch_size and objective.needs_trajectory:
            raise ConfigError("sampler.rollout_batch_size", sampler.rollout_batch_size,
                              f"must be 0 with objective {objective.cfg.name} (its trajectory is recorded in one sampler call)")
        self.bundle, self.task, self.objective = bundle, task, objective
        self.sampler_cfg, self.optim_cfg, self.seed = sampler, optim, seed
        self.policy = bundle.net
        copy_net = lambda: copy.deepcopy(bundle.net).requires_grad_(False).eval()
        self.old_policy = copy_net() if old_policy == "copy" else None
        self.needs_ref = objective.cfg.beta > 0
        self.ref_policy = copy_net() if self.needs_ref and not has_adapter(bundle.net) else None
        self.automatic_optimization = False
        self.rollout_count = 0
        self.skipped_updates = 0
        self._consecutive_skips = 0
        self.last_metrics: dict[str, float] = {}
        self.last_rollout_metrics: dict[str, float] = {}
        self.last_rollout: Rollout | None = None  # for the callback's table of sample completions
        self.pending_rows: list[tuple[int, dict[str, float]]] = []  # (step, row), flushed by the callback
        self.warm_start: dict[str, Any] | None = None  # provenance, set by train(); rides in checkpoints
        self.fault: Any = None  # a training.faults.FaultInjector in fault-injection runs (conf/fault)
        self._rng_to_restore: dict[str, Any] | None = None

    # ---- Lightning plumbing -------------------------------------------------------------
    def configure_optimizers(self):
        c = self.optim_cfg
        opt = torch.optim.AdamW(self.policy.parameters(), lr=c.lr, betas=tuple(c.betas), weight_decay=c.weight_decay)
        warm = max(c.warmup_steps, 0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (warm + 1)) if warm else 1.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Plain data only: checkpoints load with weights_only=True. Mask and Gumbel generators are
        # seeded from (seed, rollout_count), the data order is the train loader's state (Lightning).
        checkpoint["rl_state"] = {"rollout_count": self.rollout_count, "skipped_updates": self.skipped_updates,
                                  "consecutive_skips": self._consecutive_skips,
                                  "reward_failures": getattr(self.task, "reward_failures", 0),
                                  "warm_start": self.warm_start, "rng": rng_state()}
        for logger in self.loggers:  # the metrics on disk reach as far as the checkpoint
            logger.save()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("rl_state", {})
        self.rollout_count = state.get("rollout_count", 0)
        self.skipped_updates = state.get("skipped_updates", 0)
        self._consecutive_skips = state.get("consecutive_skips", 0)
        self.task.reward_failures = state.get("reward_failures", 0)
        saved = state.get("warm_start")
        if saved and self.warm_start and saved.get("key") != self.warm_start.get("key"):
            log.warning("the checkpoint's warm start (%s) differs from this config's (%s); the checkpoint's "
                        "weights are used", saved.get("key"), self.warm_start.get("key"))
        self.warm_start = saved or self.warm_start
        self._rng_to_restore = state.get("rng")  # applied at on_train_start, after Lightning's own setup

    def on_fit_start(self) -> None:
        if self.old_policy is not None and "FSDP" in type(self.trainer.strategy).__name__:
            raise ConfigError("old_policy", "copy", "trainer=fsdp needs old_policy=cached (no second, sharded model)")

    def _check_data_parallel(self) -> None:
        sampler = getattr(self.trainer.train_dataloader, "sampler", None)
        if self.trainer.world_size > 1 and "Distributed" in type(sampler).__name__:
            raise ConfigError("trainer.extra.use_distributed_sampler", True,
                              "must be false with several processes: each reads the same prompts and keeps its rows")

    def on_train_start(self) -> None:
        self._check_data_parallel()
        if self._rng_to_restore is not None:
            set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None

    # ---- the RL step --------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, items: list[dict[str, Any]]) -> tuple[Rollout, dict[str, float]]:
        G = self.task.cfg.group_size
        t0 = time.perf_counter()
        prompts = [self.task.prompt(it) for it in items for _ in range(G)]
        group_items = [it for it in items for _ in range(G)]
        ids, mask = encode_prompts(self.bundle.tokenizer, prompts, self.device, self.bundle.block_size)  # (N, P)
        shard = Shard.current(ids.shape[0])  # every process padded all N rows alike; keep this one's share
        rows = shard.rows(ids.shape[0])
        ids, mask, group_items = ids[rows], mask[rows], group_items[rows]  # (n, P)
        recorder = self.objective.make_recorder()
        # a recorder that already measures step entropies (EGSPO's trajectory) stands in for the meter
        meter = recorder if hasattr(recorder, "entropy_stats") else EntropyMeter()
        hooks = meter if recorder is None or recorder is meter else Recorders(meter, recorder)
        completion = self._generate(ids, mask, shard.offset, hooks)
        comp_mask = completion_mask(completion, self.bundle.eos_token_id)
        texts = decode_completions(self.bundle.tokenizer, completion, self.bundle.eos_token_id)
        rewards = self.task.rewards(texts, group_items).to(self.device)  # (n,)
        all_rewards = shard.gather(rewards)  # (N,): a group may span processes
        adv = group_advantages(all_rewards, G, self.objective.cfg.scale_rewards)[rows]
        t_roll = time.perf_counter() - t0
        ro = Rollout(self.rollout_count, G, ids, mask, completion, comp_mask, rewards, adv,
                     extras={"texts": texts, "items": group_items, "tokenizer": self.bundle.tokenizer,
                             "eos_token_id": self.bundle.eos_token_id}, shard=shard)
        self.rollout_count += 1
        extra = self.objective.on_rollout(ro, recorder, self.task)
        if shard.world_size > 1 and extra:  # the objective's rollout metrics: mean over equal shares
            vals = shard.all_reduce_sum(torch.tensor(list(extra.values()), dtype=torch.float64, device=self.device))
            extra = dict(zip(extra, (vals / shard.world_size).tolist()))
        group_std = all_rewards.view(-1, G).std(-1)
        lengths = shard.gather(comp_mask.sum(-1))  # (N,)
        ent = shard.all_reduce_sum(torch.tensor(meter.entropy_stats(), dtype=torch.float64, device=self.device))
        metrics = {
            "train/reward": all_rewards.mean().item(),
            "train/reward_std": all_rewards.std().item() if all_rewards.numel() > 1 else 0.0,
            "train/frac_zero_std_groups": (group_std < 1e-6).float().mean().item(),
            "train/completion_len": lengths.float().mean().item(),
            "train/entropy": float(ent[0] / ent[1].clamp_min(1)),
            "time/rollout_s": t_roll,
            "throughput/tokens_per_s": completion.numel() * shard.world_size / max(t_roll, 1e-9),
            **extra,
        }
        return ro, metrics

    def _generate(self, ids: torch.Tensor, mask: torch.Tensor, offset: int, recorder) -> torch.Tensor:
        """Completions (n, L) from the behaviour policy, ``sampler.rollout_batch_size`` rows per call."""
        net = self.old_policy if self.old_policy is not None else self.policy
        was_training = net.training
        net.eval()
        n = ids.shape[0]
        size = self.sampler_cfg.rollout_batch_size or n
        parts = []
        for s in range(0, n, size):
            first = offset + s  # global row: the same rows draw the same noise on any number of processes
            key = mix_seed(self.seed, self.rollout_count, 0xA11) if first == 0 else mix_seed(self.seed, self.rollout_count, 0xA11, first)
            gen = torch.Generator(device=self.device).manual_seed(key)
            out = policy_generate(net, self.bundle.block_size, ids[s:s + size], mask[s:s + size], self.sampler_cfg,
                                  self.bundle.mask_token_id, gen, recorder)
            parts.append(out.completion)
        net.train(was_training)
        return torch.cat(parts)

    def training_step(self, items: list[dict[str, Any]], batch_idx: int) -> None:
        self.pending_rows.clear()  # bounded even without the callback
        ro, roll_metrics = self.rollout(items)
        self.last_rollout, self.last_rollout_metrics = ro, roll_metrics
        ref = None
        if self.needs_ref:
            ref = logits_fn(self.ref_policy) if self.ref_policy is not None else reference_logits_fn(self.policy)
        mu = self.objective.cfg.mu
        if self.old_policy is not None:
            ctx = StepContext(ro, 0, self.seed, logits_fn(self.policy), logits_fn(self.old_policy), ref)
        else:  # old_policy=cached: the policy is still the behaviour policy; take every iteration's values now
            ctx = StepContext(ro, 0, self.seed, logits_fn(self.policy), logits_fn(self.policy), ref)
            self.policy.eval()
            self.objective.precompute_old(ctx, mu)
            ctx.old_policy = None
        for it in range(mu):
            ctx.inner_iter = it
            self._inner_update(ctx, roll_metrics if it == 0 else {})
        if self.old_policy is not None:
            self.old_policy.load_state_dict(self.policy.state_dict())

    def _inner_update(self, ctx: StepContext, extra: dict[str, float]) -> None:
        opt = self.optimizers()
        sched = self.lr_schedulers()
        t0 = time.perf_counter()
        self.policy.train()
        loss, metrics = self.objective.loss(ctx)
        if self.fault is not None:
            loss = self.fault.corrupt_loss(loss, self.global_step)
        norm = math.nan
        ok = bool(torch.isfinite(loss))
        opt.zero_grad(set_to_none=True)
        if ok:
            # the loss is the global batch's on every process and strategies average gradients over
            # processes, so scale by their number (distributed.py)
            self.manual_backward(loss * ctx.rollout.shard.world_size)
            clip = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
            norm = clip_grad_norm(self, list(self.policy.parameters()), clip)  # pre-clip; FSDP-aware
            ok = math.isfinite(norm)
        if not ok:
            opt.zero_grad(set_to_none=True)
            self.skipped_updates += 1
            self._consecutive_skips += 1
            if self._consecutive_skips > self.optim_cfg.max_consecutive_skips:
                raise RuntimeError(f"{self._consecutive_skips} consecutive updates had a non-finite loss or gradient; stopping")
            row = {"train/skipped_updates": float(self.skipped_updates), "train/loss": float(loss.detach())}
            self._log_row(row, step=self.global_step)
            return
        self._consecutive_skips = 0
        opt.step()
        sched.step()
        row = {k: float(v) for k, v in metrics.items()}
        row.update(extra)
        row["grad/norm"] = norm  # pre-clip; the callback adds its EMA and spike flag
        row.update({"train/loss": float(loss.detach()), "train/lr": opt.param_groups[0]["lr"],
                    "train/skipped_updates": float(self.skipped_updates), "train/inner_iter": float(ctx.inner_iter),
                    "time/update_s": time.perf_counter() - t0})
        self._log_row(row, step=self.global_step)

    def _log_row(self, row: dict[str, float], step: int) -> None:
        self.last_metrics = row
        self.pending_rows.append((step, row))
