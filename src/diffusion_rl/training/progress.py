"""A progress bar over optimizer steps (not epochs) showing the current reward, loss and grad norm."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks.progress import ProgressBar
from tqdm.auto import tqdm


class RLProgressBar(ProgressBar):
    def __init__(self) -> None:
        super().__init__()
        self._enabled = True
        self._bar: tqdm | None = None

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer, pl_module) -> None:
        self._bar = tqdm(total=trainer.max_steps, initial=trainer.global_step, desc="RL", unit="step",
                         dynamic_ncols=True, disable=not self._enabled)

    def on_train_batch_end(self, trainer, pl_module, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._bar is None:
            return
        self._bar.n = trainer.global_step
        record = pl_module.record  # the batch's (training/module.py's StepRecord)
        roll = record.rollout.metrics if record.rollout is not None else {}
        row = record.rows[-1][1] if record.rows else {}
        post = {"reward": roll.get("train/reward"), "loss": row.get("train/loss"), "gnorm": row.get("grad/norm")}
        self._bar.set_postfix({k: f"{v:.3f}" for k, v in post.items() if v is not None}, refresh=False)
        self._bar.refresh()

    def on_train_end(self, trainer, pl_module) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
