"""Offline report of one run or a multirun: PNG plots and a markdown table, no W&B needed.

``python src/report.py <run folder | multirun folder> [--out DIR]`` reads every run folder below the
given one (a folder with ``.hydra/``), each run's ``metrics.csv`` (one row per optimizer step, SPEC §6
names), ``summary.json`` and ``.hydra/overrides.yaml``, and writes into ``<folder>/report/``:

- ``heldout.png``: held-out accuracy at each evaluation (before RL at step 0, every
  ``eval.every_n_steps``, after RL); a single run shows each of its task's metrics;
- ``reward.png``: mean rollout reward, smoothed (EMA) with each rollout's value faint behind it;
- ``kl.png``: KL to the reference policy (runs with ``objective.beta > 0``); ``entropy.png``: entropy
  of the policy at the sampled tokens;
- ``grad_norm.png``: pre-clip gradient norm over optimizer steps (log scale), spikes marked ``x``;
- ``ratio_log_std.png``: spread of the log importance ratios; ``ess.png``: effective sample size of
  the self-normalised weights (objectives that have them);
- the rollout's cost and honesty: ``mismatch.png`` (``rollout/mismatch_log_ratio``, the sampler's
  log-probability against the objective's estimator at theta_old), ``forwards.png`` (forward passes
  per sample), ``rollout_time.png`` / ``update_time.png`` (wall time of the rollout and of an update);
- ``report.md``: the table (spikes, max gradient norm, final reward, held-out accuracy before and
  after RL, skipped updates), a cost table (mean rollout and update seconds per step, RL wall time,
  forwards per sample, mean mismatch) when the runs logged them, and the plots.

One line per run, labelled by the overrides that differ between the runs (``eps=5``, ``eps=100``).
The log-ratio spread and ESS panels are left out, and named in ``report.md``, when their metric has
the same value at every step of every run: with ``objective.mu=1`` the policy is its own behaviour
policy at every update, so the spread is 0 and the weights uniform by construction. A run without ``summary.json``
is listed as failed (with the error of its ``failed.json``), whatever it logged is still plotted.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PLOTS = (  # file, metric, title, log scale (heldout.png is drawn by plot_heldout)
    ("reward.png", "train/reward", "mean rollout reward (line: EMA; faint: each rollout)", False),
    ("kl.png", "train/kl", "KL to the reference policy (k3 estimate)", False),
    ("entropy.png", "train/entropy", "policy entropy at the sampled tokens (nats)", False),
    ("grad_norm.png", "grad/norm", "pre-clip gradient norm (x = spike)", True),
    ("ratio_log_std.png", "ratio/log_std", "std of log importance ratios", False),
    ("ess.png", "weights/ess", "effective sample size of the group weights", False),
    ("mismatch.png", "rollout/mismatch_log_ratio", "log q_sampler - log pi_old (estimator), mean", False),
    ("forwards.png", "rollout/forwards_per_sample", "forward passes per sample (rollout)", False),
    ("rollout_time.png", "time/rollout_s", "rollout wall time per rollout (s)", False),
    ("update_time.png", "time/update_s", "wall time per optimizer update (s)", False),
)
COST = (  # cost table: header, metric (mean over the run's rows)
    ("rollout s", "time/rollout_s"), ("update s", "time/update_s"), ("forwards / sample", "rollout/forwards_per_sample"),
    ("tokens / forward", "rollout/tokens_per_forward"), ("mismatch (mean)", "rollout/mismatch_log_ratio"),
)
SMOOTHED = {"train/reward": 0.9}  # metric -> EMA weight of the line drawn over its raw values
RAW_ALPHA = 0.3  # the raw values behind a smoothed line: visible, not competing
FINAL_WINDOW = 5  # "final reward" = mean reward of the last 5 rollouts
EVAL_PREFIX = "eval/"  # held-out metrics logged during training (training/evaluation.py)
# panels that are flat by construction in some configurations (mu=1: ratio 1, uniform weights):
# left out when their metric never changes, and named in report.md
# (and the exact sampler's fixed number of forwards per sample)
OMIT_IF_CONSTANT = ("ratio/log_std", "weights/ess", "rollout/forwards_per_sample")
_IGNORED_KEYS = ("hydra.", "paths.", "trainer.enable_progress_bar")


@dataclass
class RunData:
    path: Path
    overrides: list[str]
    metrics: dict[str, list[tuple[int, float]]]  # metric -> [(step, value)] in logged order
    summary: dict[str, Any] | None
    failure: dict[str, Any] | None
    label: str = ""
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.summary is None


def find_runs(root: str | Path) -> list[Path]:
    """The run folders at or below ``root``, multirun jobs in job-number order."""
    root = Path(root)
    if (root / ".hydra").is_dir():
        return [root]
    runs = sorted({p.parent.parent for p in root.rglob(".hydra/config.yaml")} |
                  {p.parent.parent for p in root.rglob(".hydra/overrides.yaml")}, key=_job_order)
    return [r for r in runs if "report" not in r.relative_to(root).parts]


def _job_order(p: Path) -> tuple:
    head = p.name.split("_", 1)[0]
    return (str(p.parent), int(head) if head.isdigit() else math.inf, p.name)


def load_run(path: Path) -> RunData:
    overrides: list[str] = []
    ov = path / ".hydra" / "overrides.yaml"
    if ov.exists():
        overrides = [str(o) for o in (yaml.safe_load(ov.read_text()) or [])]
    metrics: dict[str, list[tuple[int, float]]] = {}
    mpath = path / "metrics.csv"
    if mpath.exists():
        with open(mpath) as f:
            for row in csv.DictReader(f):
                step = int(float(row.get("step") or 0))
                for k, v in row.items():
                    if k != "step" and v not in ("", None):
                        metrics.setdefault(k, []).append((step, float(v)))
    summary = _read_json(path / "summary.json")
    failure = _read_json(path / "failed.json")
    return RunData(path, overrides, metrics, summary, failure)


def _read_json(p: Path) -> dict[str, Any] | None:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def run_labels(overrides: list[list[str]], names: list[str]) -> list[str]:
    """Label each run by the overrides whose values differ between the runs (``eps=5``)."""
    parsed = [_parse_overrides(o) for o in overrides]
    keys = list(dict.fromkeys(k for p in parsed for k in p))
    differing = [k for k in keys if len({p.get(k) for p in parsed}) > 1]
    short = {k: k.lstrip("+~").rsplit(".", 1)[-1] for k in differing}
    if len(set(short.values())) < len(short):  # ambiguous short names: keep the full keys
        short = {k: k.lstrip("+~") for k in differing}
    labels = [",".join(f"{short[k]}={p[k]}" for k in differing if k in p) for p in parsed]
    return [lab or name for lab, name in zip(labels, names)]


def _parse_overrides(overrides: list[str]) -> dict[str, str]:
    out = {}
    for o in overrides:
        if "=" not in o:
            continue
        k, v = o.split("=", 1)
        k = k.removeprefix("override ").strip()
        if not k.lstrip("+~").startswith(_IGNORED_KEYS):
            out[k] = v
    return out


def run_stats(run: RunData) -> dict[str, Any]:
    """The table's numbers for one run (NaN where the run logged nothing)."""
    m, s = run.metrics, run.summary or {}
    norms = [v for _, v in m.get("grad/norm", [])]
    spikes = m.get("grad/spikes_total")
    rewards = [v for _, v in m.get("train/reward", [])]
    skipped = m.get("train/skipped_updates")
    after, before = s.get("after") or {}, s.get("before") or {}
    acc_key = next(iter(after or before), None)
    return {
        "status": "ok" if not run.failed else "failed",
        "steps": s.get("optimizer_steps", max((st for st, _ in m.get("grad/norm", [])), default=0)),
        "spikes": int(spikes[-1][1]) if spikes else int(sum(v for _, v in m.get("grad/spike", []))),
        "max_grad_norm": max(norms) if norms else math.nan,
        "final_reward": sum(rewards[-FINAL_WINDOW:]) / len(rewards[-FINAL_WINDOW:]) if rewards else math.nan,
        "acc_key": acc_key,
        "acc_before": before.get(acc_key, math.nan) if acc_key else math.nan,
        "acc_after": after.get(acc_key, math.nan) if acc_key else math.nan,
        "skipped": int(s["skipped_updates"]) if "skipped_updates" in s else int(skipped[-1][1]) if skipped else 0,
        "error": _error_line(run),
    }


def _error_line(run: RunData) -> str:
    if not run.failed:
        return ""
    if run.failure:
        msg = f"{run.failure.get('type', 'Error')}: {run.failure.get('error', '')}"
    else:
        msg = "no summary.json (crashed, interrupted or still running)"
    msg = " ".join(msg.split()).replace("|", "/")
    return msg if len(msg) <= 120 else msg[:117] + "..."


def markdown_table(runs: list[RunData]) -> str:
    keys = {r.stats["acc_key"] for r in runs if r.stats["acc_key"]}
    acc_name = keys.pop() if len(keys) == 1 else "accuracy"
    head = ["run", "status", "steps", "grad spikes", "max grad norm", f"final reward (last {FINAL_WINDOW})",
            f"held-out {acc_name} before -> after", "skipped updates"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        st = r.stats
        status = st["status"] if not st["error"] else f"failed: {st['error']}"
        acc = f"{_fmt(st['acc_before'])} -> {_fmt(st['acc_after'])}" if not r.failed else "-"
        lines.append("| " + " | ".join([r.label, status, str(st["steps"]), str(st["spikes"]), _fmt(st["max_grad_norm"]),
                                         _fmt(st["final_reward"]), acc, str(st["skipped"])]) + " |")
    return "\n".join(lines)


def cost_table(runs: list[RunData]) -> str | None:
    """Mean per-row cost metrics and the RL wall time (``fit_s``) of each run; None when no run logged any."""
    if not any(r.metrics.get(m) for r in runs for _, m in COST):
        return None
    head = ["run", *(h for h, _ in COST), "RL wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        means = [_mean([v for _, v in r.metrics.get(m, [])]) for _, m in COST]
        fit = (r.summary or {}).get("fit_s", math.nan)
        lines.append("| " + " | ".join([r.label, *map(_fmt, means), _fmt(fit)]) + " |")
    return "\n".join(lines)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _fmt(x: Any) -> str:
    return "-" if not isinstance(x, (int, float)) or math.isnan(x) else f"{x:.3f}"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ema(values: list[float], weight: float) -> list[float]:
    """Exponential moving average, debiased (the first values are not pulled towards 0)."""
    out, acc, norm = [], 0.0, 0.0
    for v in values:
        acc, norm = weight * acc + (1 - weight) * v, weight * norm + (1 - weight)
        out.append(acc / norm)
    return out


def constant_value(runs: list[RunData], metric: str) -> float | None:
    """The value ``metric`` has at every logged step of every run, if it never changes."""
    values = {v for r in runs for _, v in r.metrics.get(metric, [])}
    return values.pop() if len(values) == 1 else None


def _finish(fig, ax, path: Path, ylabel: str, title: str) -> None:
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_metric(runs: list[RunData], metric: str, title: str, path: Path, log_y: bool = False) -> bool:
    """One line per run that logged ``metric``; False (no file) when none did."""
    plt = _pyplot()
    have = [r for r in runs if r.metrics.get(metric)]
    if not have:
        return False
    fig, ax = plt.subplots(figsize=(9, 4.8))
    cmap = plt.get_cmap("tab20" if len(runs) > 10 else "tab10")
    for i, r in enumerate(runs):
        pts = r.metrics.get(metric)
        if not pts:
            continue
        color = cmap(i % cmap.N)
        style = "--" if r.failed else "-"
        steps, values = [s for s, _ in pts], [v for _, v in pts]
        if metric in SMOOTHED:
            ax.plot(steps, values, "-", color=color, lw=0.8, alpha=RAW_ALPHA)
            ax.plot(steps, ema(values, SMOOTHED[metric]), style, color=color, lw=1.8, label=r.label)
        else:
            ax.plot(steps, values, style, color=color, lw=1.2, label=r.label)
        if metric == "grad/norm":
            spikes = {s for s, v in r.metrics.get("grad/spike", []) if v > 0}
            xs = [(s, v) for s, v in pts if s in spikes]
            if xs:
                ax.plot([s for s, _ in xs], [v for _, v in xs], "x", color=color, ms=8, mew=2)
    if log_y:
        ax.set_yscale("log")
    _finish(fig, ax, path, metric, title)
    plt.close(fig)
    return True


def heldout_metrics(runs: list[RunData]) -> list[str]:
    """The ``eval/*`` metrics to draw: every one of a single run's task (but its mean reward, which is
    not an accuracy), the runs' common accuracy metric when there are several."""
    logged = list(dict.fromkeys(k for r in runs for k in r.metrics if k.startswith(EVAL_PREFIX)))
    if len(runs) == 1:
        return [k for k in logged if k not in (EVAL_PREFIX + "reward", EVAL_PREFIX + "num_items")]
    keys = {str(r.stats["acc_key"]) for r in runs if r.stats.get("acc_key")}
    main = EVAL_PREFIX + keys.pop() if len(keys) == 1 else None
    return [main] if main in logged else logged[:1]


def plot_heldout(runs: list[RunData], path: Path) -> bool:
    """Held-out metrics at each evaluation (markers), one line per run and metric."""
    metrics = heldout_metrics(runs)
    if not metrics:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    cmap = plt.get_cmap("tab20" if len(runs) * len(metrics) > 10 else "tab10")
    k = 0
    for r in runs:
        for m in metrics:
            pts = sorted(dict(r.metrics.get(m, [])).items())  # one value per step
            if not pts:
                continue
            name = m.removeprefix(EVAL_PREFIX)
            label = name if len(runs) == 1 else (r.label if len(metrics) == 1 else f"{r.label} {name}")
            ax.plot([s for s, _ in pts], [v for _, v in pts], "o-", color=cmap(k % cmap.N), lw=1.5, ms=5, label=label)
            k += 1
    ax.set_ylim(-0.02, 1.02)
    _finish(fig, ax, path, "held-out value", "held-out metrics at each evaluation (step 0: before RL)")
    plt.close(fig)
    return True


def build_report(root: str | Path, out_dir: str | Path | None = None) -> tuple[Path, list[RunData]]:
    """Write the plots and ``report.md``; returns the report's path and the runs it covers."""
    root = Path(root)
    paths = find_runs(root)
    if not paths:
        raise FileNotFoundError(f"no run folders (with .hydra/) under {root}")
    runs = [load_run(p) for p in paths]
    for r, lab in zip(runs, run_labels([r.overrides for r in runs], [p.name for p in paths])):
        r.label = lab
        r.stats = run_stats(r)
    out = Path(out_dir) if out_dir is not None else root / "report"
    out.mkdir(parents=True, exist_ok=True)
    made, constant = [], []
    if plot_heldout(runs, out / "heldout.png"):
        made.append(("heldout.png", "held-out metrics at each evaluation"))
    for f, metric, title, log_y in PLOTS:
        (out / f).unlink(missing_ok=True)  # a panel left out now must not linger from an earlier report
        value = constant_value(runs, metric) if metric in OMIT_IF_CONSTANT else None
        if value is not None:
            constant.append(f"`{metric}` ({value:g} at every step)")
        elif plot_metric(runs, metric, title, out / f, log_y):
            made.append((f, title))
    failed = [r for r in runs if r.failed]
    lines = [f"# Report: {root}", "", f"{len(runs)} runs, {len(failed)} failed. Labels are the overrides that "
             "differ between runs. Spikes: pre-clip gradient norm above `diagnostics.spike_factor` x its "
             "running median.", "", markdown_table(runs), ""]
    cost = cost_table(runs)
    if cost is not None:
        lines += ["Rollout cost (means over the logged rows; `RL wall s` is the training loop's, without evaluation):",
                  "", cost, ""]
    if constant:
        why = (" (with `objective.mu=1` the policy is its own behaviour policy at every update: ratios are 1, "
               "weights uniform)") if any("ratio/" in c or "weights/" in c for c in constant) else ""
        lines += ["Not plotted, constant in every run: " + ", ".join(constant) + why + ".", ""]
    lines += [f"![{title}]({f})" for f, title in made]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report, runs
