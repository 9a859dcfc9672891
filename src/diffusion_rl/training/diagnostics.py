"""Diagnostics math (SPEC §6): the gradient-spike tracker and the cross-process reduction of metrics.

A spike is a pre-clip gradient norm above ``spike_factor`` x the median of the last ``window`` norms
(only once the window holds ``min_history`` values). The tracker's state is plain data so
checkpoints can carry it. :func:`combine_rows` merges the metric rows of several processes with
sums and counts (never a mean of means); :data:`SPEC_METRICS` is the set every run logs. The
Lightning side (when to update, logging, W&B tables) is ``training/callbacks.py``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from diffusion_rl.errors import ConfigError

# SPEC §6. train/kl exists only with a reference model (objective.beta > 0); weights/* only for
# objectives with self-normalised weights (StableDRL).
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


# ---- cross-process reduction ------------------------------------------------------------------
# How a metric combines over processes. Default "mean": weighted by each process's sample count n,
# i.e. sum(value * n) / sum(n). Exact for per-sample means (reward, completion length, ESS per
# group); per-token means (GRPO's ratio statistics, entropy) are weighted by samples, which is
# exact when every process scores as many tokens. "std": pooled from each process's (n, mean, std)
# with the paired mean key. "same": identical on every process (the gradient is all-reduced before
# its norm is taken; the learning rate is shared), rank 0's value is kept.
_STD_OF = {"train/reward_std": "train/reward", "ratio/log_std": "ratio/log_mean"}
_KIND = {
    "ratio/log_max": "max", "ratio/log_min": "min", "weights/max": "max",
    "train/skipped_updates": "max", "train/inner_iter": "same", "train/lr": "same",
}
_PREFIX_KIND = {"grad/": "same", "time/": "max", "throughput/": "sum"}  # wall time: the slowest process


def reduction(key: str) -> str:
    """``mean | std | max | min | sum | same`` for a metric name."""
    if key in _STD_OF:
        return "std"
    if key in _KIND:
        return _KIND[key]
    for prefix, kind in _PREFIX_KIND.items():
        if key.startswith(prefix):
            return kind
    return "mean"


def combine_rows(rows: list[dict[str, float]], counts: list[float]) -> dict[str, float]:
    """Merge one metric row per process (``counts[i]`` samples behind row ``i``) into one row."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    out: dict[str, float] = {}
    for k in keys:
        have = [(r, float(n)) for r, n in zip(rows, counts) if k in r]
        vals = [float(r[k]) for r, _ in have]
        kind = reduction(k)
        if kind == "same":
            out[k] = vals[0]
        elif kind == "max":
            out[k] = max(vals)
        elif kind == "min":
            out[k] = min(vals)
        elif kind == "sum":
            out[k] = sum(vals)
        elif kind == "std" and all(_STD_OF[k] in r for r, _ in have):
            out[k] = _pooled_std([(n, float(r[_STD_OF[k]]), float(r[k])) for r, n in have])
        else:
            total = sum(n for _, n in have)
            out[k] = sum(v * n for v, (_, n) in zip(vals, have)) / total if total > 0 else sum(vals) / len(vals)
    return out


def _pooled_std(parts: list[tuple[float, float, float]]) -> float:
    """Unbiased std of the union of samples given each part's (count, mean, unbiased std)."""
    n = sum(c for c, _, _ in parts)
    if n <= 1:
        return 0.0
    mean = sum(c * m for c, m, _ in parts) / n
    ss = sum(max(c - 1, 0) * s * s + c * (m - mean) ** 2 for c, m, s in parts)
    return math.sqrt(ss / (n - 1))
