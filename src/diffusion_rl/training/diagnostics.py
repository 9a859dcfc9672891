"""Diagnostics math (docs/methods.md §6): the gradient-spike tracker and the set of metrics every
run logs.

A spike is a pre-clip gradient norm above ``spike_factor`` x the median of the last ``window`` norms
(only once the window holds ``min_history`` values). The tracker's state is plain data so
checkpoints can carry it. :data:`SPEC_METRICS` is the set every run logs. Metrics need no merging
across processes: the module computes them on the rows of every process (``core/distributed.py``). The
Lightning side (when to update, logging, W&B tables) is ``training/callbacks.py``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from diffusion_rl.core.errors import ConfigError

# docs/methods.md §6. train/kl exists only with a reference model (objective.beta > 0); weights/*
# only for objectives with self-normalised weights (StableDRL).
SPEC_METRICS = (
    "train/reward", "train/reward_std", "train/frac_zero_std_groups", "train/completion_len",
    "train/entropy", "train/loss", "train/lr",
    "ratio/log_mean", "ratio/log_std", "ratio/log_min", "ratio/log_max",
    "ratio/clip_frac_low", "ratio/clip_frac_high",
    "grad/norm", "grad/norm_ema", "grad/spike", "grad/spikes_total",
    "time/rollout_s", "time/update_s", "throughput/tokens_per_s",
)
OPTIONAL_METRICS = {"train/kl": "objective.beta > 0", "weights/ess": "stabledrl", "weights/max": "stabledrl"}


@dataclass
class DiagnosticsConfig:
    spike_factor: float = 3.0
    window: int = 50
    min_history: int = 5
    ema_decay: float = 0.9
    samples_every_n_steps: int = 20  # a table of sample completions every N optimizer steps (0 = off)
    num_samples: int = 8  # rows of that table

    def validate(self) -> None:
        if not self.spike_factor > 1:
            raise ConfigError("diagnostics.spike_factor", self.spike_factor, "must be > 1")
        if self.window < 1:
            raise ConfigError("diagnostics.window", self.window, "must be >= 1")
        if not 1 <= self.min_history <= self.window:
            raise ConfigError("diagnostics.min_history", self.min_history, f"must be in [1, window={self.window}]")
        if not 0 <= self.ema_decay < 1:
            raise ConfigError("diagnostics.ema_decay", self.ema_decay, "must be in [0, 1)")
        if self.samples_every_n_steps < 0:
            raise ConfigError("diagnostics.samples_every_n_steps", self.samples_every_n_steps, "must be >= 0 (0 = off)")
        if self.num_samples < 1:
            raise ConfigError("diagnostics.num_samples", self.num_samples, "must be >= 1")


class GradSpikeTracker:
    def __init__(self, cfg: DiagnosticsConfig | None = None):
        self.cfg = cfg or DiagnosticsConfig()
        self.history: deque[float] = deque(maxlen=self.cfg.window)
        self.ema: float | None = None
        self.spikes_total = 0
        self.count = 0
        self.max_norm = 0.0
        self.sum_norm = 0.0

    def update(self, norm: float) -> dict[str, float]:
        """Record one finite pre-clip norm; returns the ``grad/*`` metrics for this update."""
        spike = len(self.history) >= self.cfg.min_history and norm > self.cfg.spike_factor * statistics.median(self.history)
        self.history.append(norm)
        d = self.cfg.ema_decay
        self.ema = norm if self.ema is None else d * self.ema + (1 - d) * norm
        self.spikes_total += int(spike)
        self.count += 1
        self.max_norm = max(self.max_norm, norm)
        self.sum_norm += norm
        return {"grad/norm": norm, "grad/norm_ema": self.ema, "grad/spike": float(spike),
                "grad/spikes_total": float(self.spikes_total)}

    def summary(self) -> dict[str, float]:
        mean = self.sum_norm / self.count if self.count else math.nan
        return {"grad_norm_mean": mean, "grad_norm_max": self.max_norm if self.count else math.nan,
                "grad_spikes": self.spikes_total, "updates": self.count}

    def state_dict(self) -> dict:
        return {"history": list(self.history), "ema": self.ema, "spikes_total": self.spikes_total,
                "count": self.count, "max_norm": self.max_norm, "sum_norm": self.sum_norm}

    def load_state_dict(self, state: dict) -> None:
        self.history = deque(state["history"], maxlen=self.cfg.window)
        self.ema, self.spikes_total = state["ema"], state["spikes_total"]
        self.count, self.max_norm, self.sum_norm = state["count"], state["max_norm"], state["sum_norm"]
