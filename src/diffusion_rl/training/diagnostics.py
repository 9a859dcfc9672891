"""Gradient-spike tracking (SPEC §6): EMA of the pre-clip norm, spike flag against a running median.

A spike is a norm above ``spike_factor`` x the median of the last ``window`` norms (only once the
window holds ``min_history`` values). The state is plain data so checkpoints can carry it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass


@dataclass
class DiagnosticsConfig:
    spike_factor: float = 3.0
    window: int = 50
    min_history: int = 5
    ema_decay: float = 0.9


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
