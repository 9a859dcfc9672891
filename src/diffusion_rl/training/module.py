"""``DiffusionRLModule``: the RL loop for a diffusion LM as a LightningModule (manual optimization).

Per batch of prompts (one ``training_step``):
1. roll out ``G`` completions per prompt with the frozen old policy (the behaviour policy);
2. score them with the task's reward functions; group-relative advantages;
3. ``mu`` inner updates: the objective's loss (old log-probs on the same mask seeds), backward,
   total gradient norm *before* clipping, clip, optimizer step. A non-finite loss or gradient skips
   the update, counts it in ``train/skipped_updates`` and leaves weights and optimizer untouched;
4. copy the policy into the old policy.

The math lives elsewhere (sampler, likelihood estimators, objectives, rewards); this file only
orchestrates and logs. Every optimizer step writes one row of metrics (SPEC §6 names).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from diffusion_rl.errors import ConfigError
from diffusion_rl.likelihood.base import _mix
from diffusion_rl.models.policy import PolicyBundle, encode_prompts, logits_fn
from diffusion_rl.objectives.base import Objective, Rollout, StepContext, group_advantages
from diffusion_rl.sampling import SamplerConfig, generate
from diffusion_rl.sampling.sampler import completion_mask
from diffusion_rl.training.diagnostics import DiagnosticsConfig, GradSpikeTracker
from diffusion_rl.training.evaluation import decode_completions


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

    @property
    def value(self) -> float:
        return self.total / max(self.count, 1)


class Recorders:
    """Fan one sampler's steps out to several recorders."""

    def __init__(self, *recorders) -> None:
        self.recorders = recorders

    def on_step(self, *args) -> None:
        for r in self.recorders:
            r.on_step(*args)


class DiffusionRLModule(L.LightningModule):
    def __init__(self, bundle: PolicyBundle, task, objective: Objective, sampler: SamplerConfig,
                 optim: OptimConfig, diagnostics: DiagnosticsConfig | None = None, seed: int = 0):
        super().__init__()
        optim.validate()
        sampler.validate()
        self.bundle, self.task, self.objective = bundle, task, objective
        self.sampler_cfg, self.optim_cfg, self.seed = sampler, optim, seed
        self.policy = bundle.net
        self.old_policy = copy.deepcopy(bundle.net).requires_grad_(False).eval()
        needs_ref = objective.cfg.beta > 0
        self.ref_policy = copy.deepcopy(bundle.net).requires_grad_(False).eval() if needs_ref else None
        self.automatic_optimization = False
        self.tracker = GradSpikeTracker(diagnostics)
        self.rollout_count = 0
        self.skipped_updates = 0
        self._consecutive_skips = 0
        self.last_metrics: dict[str, float] = {}
        self.last_rollout_metrics: dict[str, float] = {}

    # ---- Lightning plumbing -------------------------------------------------------------
    def configure_optimizers(self):
        c = self.optim_cfg
        opt = torch.optim.AdamW(self.policy.parameters(), lr=c.lr, betas=tuple(c.betas), weight_decay=c.weight_decay)
        warm = max(c.warmup_steps, 0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (warm + 1)) if warm else 1.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rl_state"] = {"rollout_count": self.rollout_count, "skipped_updates": self.skipped_updates,
                                  "tracker": self.tracker.state_dict()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("rl_state", {})
        self.rollout_count = state.get("rollout_count", 0)
        self.skipped_updates = state.get("skipped_updates", 0)
        if "tracker" in state:
            self.tracker.load_state_dict(state["tracker"])

    # ---- the RL step --------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, items: list[dict[str, Any]]) -> tuple[Rollout, dict[str, float]]:
        G = self.task.cfg.group_size
        t0 = time.perf_counter()
        prompts = [self.task.prompt(it) for it in items for _ in range(G)]
        group_items = [it for it in items for _ in range(G)]
        ids, mask = encode_prompts(self.bundle.tokenizer, prompts, self.device)
        gen = torch.Generator(device=self.device).manual_seed(_mix(self.seed, self.rollout_count, 0xA11))
        meter = EntropyMeter()
        recorder = self.objective.make_recorder()
        out = generate(logits_fn(self.old_policy), ids, mask, self.sampler_cfg, self.bundle.mask_token_id, gen,
                       Recorders(meter, recorder) if recorder is not None else meter)
        comp_mask = completion_mask(out.completion, self.bundle.eos_token_id)
        texts = decode_completions(self.bundle.tokenizer, out.completion, self.bundle.eos_token_id)
        rewards = self.task.rewards(texts, group_items).to(self.device)
        adv = group_advantages(rewards, G, self.objective.cfg.scale_rewards)
        t_roll = time.perf_counter() - t0
        ro = Rollout(self.rollout_count, G, ids, mask, out.completion, comp_mask, rewards, adv,
                     extras={"texts": texts, "items": group_items, "tokenizer": self.bundle.tokenizer,
                             "eos_token_id": self.bundle.eos_token_id})
        self.rollout_count += 1
        extra = self.objective.on_rollout(ro, recorder, self.task)
        group_std = rewards.view(-1, G).std(-1)
        metrics = {
            "train/reward": rewards.mean().item(),
            "train/reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
            "train/frac_zero_std_groups": (group_std < 1e-6).float().mean().item(),
            "train/completion_len": comp_mask.sum(-1).mean().item(),
            "train/entropy": meter.value,
            "time/rollout_s": t_roll,
            "throughput/tokens_per_s": out.completion.numel() / max(t_roll, 1e-9),
            **extra,
        }
        return ro, metrics

    def training_step(self, items: list[dict[str, Any]], batch_idx: int) -> None:
        ro, roll_metrics = self.rollout(items)
        self.last_rollout_metrics = roll_metrics
        ctx = StepContext(ro, 0, self.seed, logits_fn(self.policy), logits_fn(self.old_policy),
                          logits_fn(self.ref_policy) if self.ref_policy is not None else None)
        for it in range(self.objective.cfg.mu):
            ctx.inner_iter = it
            self._inner_update(ctx, roll_metrics if it == 0 else {})
        self.old_policy.load_state_dict(self.policy.state_dict())

    def _inner_update(self, ctx: StepContext, extra: dict[str, float]) -> None:
        opt = self.optimizers()
        sched = self.lr_schedulers()
        t0 = time.perf_counter()
        self.policy.train()
        loss, metrics = self.objective.loss(ctx)
        norm = math.nan
        ok = bool(torch.isfinite(loss))
        opt.zero_grad(set_to_none=True)
        if ok:
            self.manual_backward(loss)
            params = [p for p in self.policy.parameters() if p.grad is not None]
            clip = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
            norm = float(torch.nn.utils.clip_grad_norm_(params, clip)) if params else 0.0  # pre-clip norm
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
        row.update(self.tracker.update(norm))
        row.update({"train/loss": float(loss.detach()), "train/lr": opt.param_groups[0]["lr"],
                    "train/skipped_updates": float(self.skipped_updates), "train/inner_iter": float(ctx.inner_iter),
                    "time/update_s": time.perf_counter() - t0})
        self._log_row(row, step=self.global_step)

    def _log_row(self, row: dict[str, float], step: int) -> None:
        self.last_metrics = row
        for logger in self.loggers:
            logger.log_metrics(row, step=step)
