"""``ValidationCallback``: held-out metrics during training, on the task's validation split.

Every ``eval.every_n_steps`` optimizer steps (and once before the first update) the policy answers
the validation items greedily with the training sampler's settings at temperature 0, and the task's
metrics are logged as ``val/<metric>`` at that step (``metrics.csv``, W&B, TensorBoard), so accuracy
over training is a curve rather than two numbers. Greedy decoding draws no random numbers, so a
validated run trains exactly like one that is not. The validation split is disjoint from training
and test items (``Task.splits``); reports and READMEs quote the test split.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import lightning as L

from diffusion_rl.models.policy import PolicyBundle
from diffusion_rl.sampling import SamplerConfig
from diffusion_rl.training.evaluation import evaluate


class ValidationCallback(L.Callback):
    def __init__(self, bundle: PolicyBundle, task: Any, items: list[dict[str, Any]], sampler: SamplerConfig,
                 every_n_steps: int, batch_size: int):
        self.bundle, self.task, self.items = bundle, task, items
        self.sampler, self.every, self.batch_size = replace(sampler, temperature=0.0), every_n_steps, batch_size
        self.last_step = -1
        self.history: list[dict[str, float]] = []  # {"step": s, "val/<metric>": v, ...}

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step, "history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_step, self.history = state_dict["last_step"], list(state_dict["history"])

    def on_train_start(self, trainer, pl_module) -> None:
        if self.last_step < 0:  # not when resuming: the curve already has its first point
            self._validate(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step // self.every > self.last_step // self.every:
            self._validate(trainer)

    def _validate(self, trainer) -> None:
        step = trainer.global_step
        self.last_step = step
        if not trainer.is_global_zero or "FSDP" in type(trainer.strategy).__name__:
            return  # one process evaluates; sharded weights are evaluated after training from the checkpoint
        metrics, _ = evaluate(self.bundle, self.task, self.items, self.sampler, self.batch_size, desc=None)
        row = {f"val/{k}": float(v) for k, v in metrics.items()}
        self.history.append({"step": float(step), **row})
        for logger in trainer.loggers:
            logger.log_metrics(row, step=step)
