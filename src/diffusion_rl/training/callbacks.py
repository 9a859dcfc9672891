"""``DiagnosticsCallback``: turns the module's per-update rows into the logged diagnostics
(docs/methods.md §6).

The module computes what only it can (loss, the objective's metric dict, the pre-clip gradient norm,
rollout statistics and timings) and leaves one row per optimizer step in its ``record``
(``training/module.py``'s ``StepRecord``, which only the module writes). After each training batch
(one rollout, ``mu`` optimizer steps) this callback

1. adds the gradient-spike metrics (``grad/norm_ema``, ``grad/spike``, ``grad/spikes_total``) from
   its :class:`GradSpikeTracker`, whose state rides in the checkpoint (Lightning stores callback
   state), so a resumed run keeps counting;
2. writes one row per optimizer step to every logger, at that step (the module computes every
   metric on the rows of all processes, so each process holds the same row);
3. every ``samples_every_n_steps`` optimizer steps, logs a table of sample completions (prompt,
   completion, reward): a W&B table when W&B logs, and ``samples.jsonl`` in the run folder.

On an exception the rows of the unfinished batch are still written, and W&B runs are closed as failed.
"""

from __future__ import annotations

import json
import logging
import math
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L

from diffusion_rl.training.diagnostics import DiagnosticsConfig, GradSpikeTracker

log = logging.getLogger(__name__)


class DiagnosticsCallback(L.Callback):
    def __init__(self, cfg: DiagnosticsConfig | None = None, run_dir: str | Path | None = None):
        self.cfg = cfg or DiagnosticsConfig()
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.tracker = GradSpikeTracker(self.cfg)
        self.last_table_step = 0
        # (the module's record, how many of its rows are written): no row is written twice; a weak
        # reference, so that a finished batch's rollout is not kept alive here
        self._written: tuple[Callable[[], Any], int] = (lambda: None, 0)

    # ---- checkpoint state ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"tracker": self.tracker.state_dict(), "last_table_step": self.last_table_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state_dict["tracker"])
        self.last_table_step = state_dict.get("last_table_step", 0)

    # ---- hooks --------------------------------------------------------------------------------
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._flush(trainer, pl_module)
        every = self.cfg.samples_every_n_steps
        if every and trainer.global_step // every > self.last_table_step // every:
            self.last_table_step = trainer.global_step
            self._log_samples(trainer, pl_module)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._flush(trainer, pl_module)
        from diffusion_rl.training.loggers import finish_loggers

        finish_loggers(trainer.loggers, failed=True)

    # ---- work -------------------------------------------------------------------------------
    def _flush(self, trainer, pl_module) -> None:
        """Write the record's rows not written yet (after a batch; on an exception, those of the
        unfinished batch)."""
        record = pl_module.record
        seen, done = self._written
        pending = record.rows[done:] if record is seen() else record.rows
        self._written = (weakref.ref(record), len(record.rows))
        rows = []
        for step, row in pending:
            row = dict(row)
            norm = row.get("grad/norm")
            if norm is not None and math.isfinite(norm):
                row.update(self.tracker.update(float(norm)))
            rows.append((step, row))
        for step, row in rows:
            for logger in trainer.loggers:
                logger.log_metrics(row, step=step)

    def _log_samples(self, trainer, pl_module) -> None:
        ro = pl_module.record.rollout
        if ro is None:
            return
        items, texts = ro.items, ro.texts
        n = min(self.cfg.num_samples, len(texts))
        # one sample from each of the first groups, then the next one of each, ... (spread over prompts)
        G = ro.group_size
        order = sorted(range(len(texts)), key=lambda i: (i % G, i // G))[:n]
        step = trainer.global_step
        rows = [[step, pl_module.task.prompt(items[i]), texts[i], float(ro.rewards[i])] for i in order]
        columns = ["step", "prompt", "completion", "reward"]
        for logger in trainer.loggers:
            if hasattr(logger, "log_table"):  # W&B (Lightning's WandbLogger)
                logger.log_table(key="samples/completions", columns=columns, data=rows, step=step)
        if self.run_dir is not None and trainer.is_global_zero:
            with open(self.run_dir / "samples.jsonl", "a") as f:
                for r in rows:
                    f.write(json.dumps(dict(zip(columns, r))) + "\n")
