"""Seeds aggregated: the conditions of a multirun (its runs' overrides but ``seed``), their mean and
spread per optimizer step, a table of mean +- sd over seeds, and paired confidence intervals of each
condition against a reference condition (``report.py`` uses this whenever a condition has more than
one seed).

Two intervals, both pairing runs by their RL seed (runs that differ only in ``seed`` share the warm
start and the test items, ``conf/config.yaml``):

- over seeds (:func:`seed_table`): each seed's difference of test accuracy after RL (condition minus
  reference), and each condition's gain over its warm start, with 95% Student-t intervals over the
  seeds. The RL seed is the unit of replication, so this interval carries the run-to-run noise of RL;
  it is the one a claim rests on;
- over test items (:func:`bootstrap_table`): the items of each seed resampled with replacement, the
  2.5 and 97.5 percentiles of the mean per-item difference. It holds the seeds fixed, so it says how
  sure the test set is of these particular runs, not how another seed would come out.
"""

from __future__ import annotations

import csv
import json
import math
import random
import statistics
from collections.abc import Callable
from pathlib import Path

from diffusion_rl.report.runs import (
    FIGSIZE,
    FINAL_WINDOW,
    RAW_ALPHA,
    RunData,
    ema,
    finish_axes,
    fmt,
    open_text,
    parse_overrides,
    pyplot,
)

BOOTSTRAP_RESAMPLES = 2000
EVAL_GENERATIONS = "eval_generations.jsonl"  # the after-RL test evaluation, one line per item (train())
EVAL_REWARDS = "eval_rewards.csv.xz"  # its rewards alone, where report/compact.py dropped the generations


def condition(run: RunData, keys: list[str]) -> str:
    """The run's label without its seed: the overrides of ``keys`` (those that differ between runs)."""
    parsed = parse_overrides(run.overrides)
    short = {k: k.lstrip("+~").rsplit(".", 1)[-1] for k in keys}
    return ",".join(f"{short[k]}={parsed[k]}" for k in keys if k in parsed) or "all runs"


def group_runs(runs: list[RunData]) -> dict[str, list[RunData]]:
    """Runs grouped by condition (every differing override but ``seed``), in first-seen order."""
    parsed = [parse_overrides(r.overrides) for r in runs]
    keys = list(dict.fromkeys(k for p in parsed for k in p))
    differing = [k for k in keys if len({p.get(k) for p in parsed}) > 1 and k.lstrip("+~") != "seed"]
    out: dict[str, list[RunData]] = {}
    for r in runs:
        out.setdefault(condition(r, differing), []).append(r)
    return out


def has_seeds(groups: dict[str, list[RunData]]) -> bool:
    return any(len(rs) > 1 for rs in groups.values())


def per_step(runs: list[RunData], metric: str, smooth: float | None = None) -> tuple[list[int], list[list[float]]]:
    """Steps logged by every run, and at each the runs' values (each run smoothed first if asked)."""
    series = []
    for r in runs:
        pts = sorted(dict(r.metrics.get(metric, [])).items())
        if not pts:
            continue
        vals = ema([v for _, v in pts], smooth) if smooth else [v for _, v in pts]
        series.append(dict(zip([s for s, _ in pts], vals)))
    if not series:
        return [], []
    steps = sorted(set.intersection(*(set(s) for s in series)))
    return steps, [[s[t] for s in series] for t in steps]


def plot_grouped(groups: dict[str, list[RunData]], metric: str, title: str, path: Path, log_y: bool = False,
                 smooth: float | None = None, hline: float | None = None, ylabel: str | None = None) -> bool:
    """Mean over seeds (line) and their range (band), one colour per condition."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    cmap = plt.get_cmap("tab20" if len(groups) > 10 else "tab10")
    drawn = False
    for i, (name, runs) in enumerate(groups.items()):
        steps, vals = per_step(runs, metric, smooth)
        if not steps:
            continue
        color = cmap(i % cmap.N)
        mean = [statistics.fmean(v) for v in vals]
        ax.fill_between(steps, [min(v) for v in vals], [max(v) for v in vals], color=color, alpha=RAW_ALPHA, lw=0)
        ax.plot(steps, mean, "-", color=color, lw=1.8, label=f"{name} (n={len(runs)})")
        drawn = True
    if not drawn:
        plt.close(fig)
        return False
    if hline is not None:
        ax.axhline(hline, color="black", ls=":", lw=1, label=f"clip threshold {hline:g}")
    if log_y:
        ax.set_yscale("log")
    finish_axes(fig, ax, path, ylabel or metric, title + " (line: mean over seeds; band: their range)")
    plt.close(fig)
    return True


def _mean_sd(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {sd:.3f}"


def _log_ratio_spread(runs: list[RunData]) -> str:
    """The largest log importance ratio of an update (``ratio/log_max``), pooled over a condition's
    updates and seeds: its median and its maximum; where it passes log eps, a clamp at eps acted."""
    values = [v for r in runs for _, v in r.metrics.get("ratio/log_max", []) if not math.isnan(v)]
    if not values:
        return "-"
    return f"{statistics.median(values):.2f}, {max(values):.2f}"


def grouped_table(groups: dict[str, list[RunData]]) -> str:
    """Mean ± sd over seeds per condition: held-out accuracy, its gain, spikes, gradient norms, clipping."""
    keys = {r.stats["acc_key"] for rs in groups.values() for r in rs if r.stats.get("acc_key")}
    acc = keys.pop() if len(keys) == 1 else "accuracy"
    head = ["condition", "seeds ok", f"test {acc} before", f"test {acc} after", "gain", "grad spikes",
            "max grad norm", "ratio clipped (high)", "largest log-ratio: median update, max",
            f"final reward (last {FINAL_WINDOW})"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, runs in groups.items():
        ok = [r for r in runs if not r.failed]
        st = [r.stats for r in ok]
        clip = [statistics.fmean(v for _, v in r.metrics["ratio/clip_frac_high"]) for r in ok
                if r.metrics.get("ratio/clip_frac_high")]
        lines.append("| " + " | ".join([
            name, f"{len(ok)}/{len(runs)}", _mean_sd([s["acc_before"] for s in st]), _mean_sd([s["acc_after"] for s in st]),
            _mean_sd([s["acc_after"] - s["acc_before"] for s in st]), _mean_sd([float(s["spikes"]) for s in st]),
            fmt(max((s["max_grad_norm"] for s in st), default=math.nan)), _mean_sd(clip), _log_ratio_spread(ok),
            _mean_sd([s["final_reward"] for s in st])]) + " |")
    return "\n".join(lines)


def item_scores(run: RunData) -> list[float] | None:
    """Per-item reward of the after-RL test evaluation (``eval_generations.jsonl``, or the
    ``eval_rewards.csv.xz`` kept of it), in test order."""
    path = run.path / EVAL_GENERATIONS
    if path.exists():
        return [float(json.loads(line)["reward"]) for line in path.read_text().splitlines() if line.strip()]
    path = run.path / EVAL_REWARDS
    if path.exists():
        with open_text(path) as f:
            return [float(row["reward"]) for row in csv.DictReader(f)]
    return None


def run_seed(run: RunData) -> str:
    cfg = (run.summary or {}).get("config") or {}
    return str(cfg.get("seed", parse_overrides(run.overrides).get("seed", "0")))


def paired_bootstrap(a: list[RunData], b: list[RunData], scores: Callable[[RunData], list[float] | None] = item_scores,
                     resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float, float, int] | None:
    """Mean per-item difference (a - b) over the seeds both ran, and its 95% bootstrap interval;
    None when no seed has item scores in both."""
    by_seed_a = {run_seed(r): scores(r) for r in a if not r.failed}
    by_seed_b = {run_seed(r): scores(r) for r in b if not r.failed}
    diffs = []
    for s in sorted(set(by_seed_a) & set(by_seed_b)):
        xa, xb = by_seed_a[s], by_seed_b[s]
        if xa and xb and len(xa) == len(xb):
            diffs.append([u - v for u, v in zip(xa, xb)])
    if not diffs:
        return None
    rng = random.Random(seed)
    mean = statistics.fmean(d for per in diffs for d in per)
    boots = []
    for _ in range(resamples):
        total = count = 0.0
        for per in diffs:  # resample each seed's items, keep the seeds
            sample = rng.choices(per, k=len(per))
            total, count = total + sum(sample), count + len(sample)
        boots.append(total / count)
    boots.sort()
    return mean, boots[int(0.025 * resamples)], boots[int(0.975 * resamples) - 1], len(diffs)


# two-sided 95% quantiles of Student's t by degrees of freedom (1-30); beyond, the normal's 1.96
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t_interval(values: list[float]) -> tuple[float, float, float] | None:
    """Mean and 95% Student-t interval of ``values`` (the seeds); None with fewer than two."""
    values = [v for v in values if not math.isnan(v)]
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    half = (T975[len(values) - 2] if len(values) - 1 <= len(T975) else 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def verdict(interval: tuple[float, float, float], what: str = "0") -> str:
    """``above`` / ``below`` when the interval excludes 0, else ``cannot tell``."""
    _, lo, hi = interval
    return f"above {what}" if lo > 0 else f"below {what}" if hi < 0 else "cannot tell"


def seed_values(runs: list[RunData], value: Callable[[dict], float]) -> dict[str, float]:
    return {run_seed(r): value(r.stats) for r in runs if not r.failed and r.stats.get("acc_after") is not None}


def seed_table(groups: dict[str, list[RunData]], reference: str | None = None, points: float = 100.0) -> str:
    """Each condition's gain over its warm start and its difference from the reference condition (the
    first by default) after RL, per seed, as mean and 95% t-interval over the seeds, in points."""
    names = list(groups)
    ref = reference if reference in groups else names[0]
    fmt_i = lambda iv: "-" if iv is None else f"{iv[0] * points:+.1f} [{iv[1] * points:+.1f}, {iv[2] * points:+.1f}]"  # noqa: E731
    lines = [f"Over RL seeds (the runs of a seed share the warm start and the test items), test accuracy in "
             f"points, mean and 95% t-interval over the seeds; the difference is each condition minus `{ref}`, "
             "seed by seed:", "",
             "| condition | seeds | gain over the warm start | | difference from the reference | |",
             "|---|---|---|---|---|---|"]
    ref_after = seed_values(groups[ref], lambda s: s["acc_after"])
    for name in names:
        gains = seed_values(groups[name], lambda s: s["acc_after"] - s["acc_before"])
        after = seed_values(groups[name], lambda s: s["acc_after"])
        gain = t_interval(list(gains.values()))
        diff = None if name == ref else t_interval([after[s] - ref_after[s] for s in sorted(set(after) & set(ref_after))])
        lines.append(f"| {name} | {len(gains)} | {fmt_i(gain)} | {'-' if gain is None else verdict(gain)} | "
                     f"{'reference' if name == ref else fmt_i(diff)} | "
                     f"{'' if name == ref or diff is None else verdict(diff, ref)} |")
    return "\n".join(lines)


def bootstrap_table(groups: dict[str, list[RunData]], reference: str | None = None) -> str:
    """Each condition's test score minus the reference condition's (first by default), paired."""
    names = list(groups)
    ref = reference if reference in groups else names[0]
    lines = [f"Paired bootstrap ({BOOTSTRAP_RESAMPLES} resamples of the test items within each seed) of the "
             f"after-RL per-item test reward, each condition minus `{ref}`:", "",
             "| condition | seeds paired | mean difference | 95% interval |", "|---|---|---|---|"]
    for name in names:
        if name == ref:
            continue
        res = paired_bootstrap(groups[name], groups[ref])
        if res is None:
            lines.append(f"| {name} | 0 | - | - |")
        else:
            mean, lo, hi, n = res
            lines.append(f"| {name} | {n} | {mean:+.4f} | [{lo:+.4f}, {hi:+.4f}] |")
    return "\n".join(lines)
