"""Offline report of one run or a multirun: PNG plots and a markdown table, no W&B needed.

``python src/report.py <run folder | multirun folder> [--out DIR]`` reads every run folder below the
given one (a folder with ``.hydra/``), each run's ``metrics.csv`` (one row per optimizer step,
docs/methods.md §6 names; ``metrics.csv.xz`` where ``scripts/compact_results.py`` compacted it),
``summary.json`` and ``.hydra/overrides.yaml``, and writes into ``<folder>/report/``:

- ``heldout.png``: held-out accuracy: the validation split during RL (before RL at step 0, every
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
  forwards per sample, mean mismatch) when the runs logged them, the environment the runs ran in
  (and where they differ), and the plots.

One line per run, labelled by the overrides that differ between the runs (``eps=5``, ``eps=100``).
The log-ratio spread and ESS panels are left out, and named in ``report.md``, when their metric has
the same value at every step of every run: with ``objective.mu=1`` the policy is its own behaviour
policy at every update, so the spread is 0 and the weights uniform by construction. A run without ``summary.json``
is listed as failed (with the error of its ``failed.json``), whatever it logged is still plotted.
"""

from __future__ import annotations

import math
from pathlib import Path

from diffusion_rl.report.groups import (
    bootstrap_table,
    group_runs,
    grouped_table,
    has_seeds,
    plot_grouped,
    seed_table,
)
from diffusion_rl.report.runs import (  # noqa: F401  (ema, RAW_ALPHA, find_runs, run_labels: the report's API)
    EVAL_PREFIX,
    FIGSIZE,
    FINAL_WINDOW,
    RAW_ALPHA,
    SMOOTHED,
    VAL_PREFIX,
    RunData,
    clip_threshold,
    constant_value,
    ema,
    find_runs,
    finish_axes,
    fmt,
    load_run,
    markdown_table,
    mean,
    pyplot,
    run_labels,
    run_stats,
)

PLOTS = (  # file, metric, title, log scale (heldout.png is drawn by plot_heldout)
    ("reward.png", "train/reward", "mean rollout reward (line: EMA; faint: each rollout)", False),
    ("kl.png", "train/kl", "KL to the reference policy (k3 estimate)", False),
    ("entropy.png", "train/entropy", "policy entropy at the sampled tokens (nats)", False),
    ("grad_norm.png", "grad/norm", "pre-clip gradient norm (x = spike; dotted: optim.grad_clip)", True),
    ("ratio_log_std.png", "ratio/log_std", "std of log importance ratios (nats)", False),
    ("ess.png", "weights/ess", "effective sample size of the group weights", False),
    ("mismatch.png", "rollout/mismatch_log_ratio", "log q_sampler - log pi_old (estimator), mean", False),
    ("forwards.png", "rollout/forwards_per_sample", "forward passes per sample (rollout)", False),
    ("rollout_time.png", "time/rollout_s", "rollout wall time per rollout (s)", False),
    ("update_time.png", "time/update_s", "wall time per optimizer update (s)", False),
)
INTRO = "INTRO.md"  # in the report's folder: written before the tables (docs/results/*)
COST = (  # cost table: header, metric (mean over the run's rows)
    ("rollout s", "time/rollout_s"), ("update s", "time/update_s"), ("forwards / sample", "rollout/forwards_per_sample"),
    ("tokens / forward", "rollout/tokens_per_forward"), ("mismatch (mean)", "rollout/mismatch_log_ratio"),
)
# panels that are flat by construction in some configurations (mu=1: ratio 1, uniform weights):
# left out when their metric never changes, and named in report.md
# (and the exact sampler's fixed number of forwards per sample)
OMIT_IF_CONSTANT = ("ratio/log_std", "weights/ess", "rollout/forwards_per_sample")



def cost_table(runs: list[RunData]) -> str | None:
    """Mean per-row cost metrics and the RL wall time (``fit_s``) of each run; None when no run logged any."""
    if not any(r.metrics.get(m) for r in runs for _, m in COST):
        return None
    head = ["run", *(h for h, _ in COST), "RL wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        means = [mean([v for _, v in r.metrics.get(m, [])]) for _, m in COST]
        fit = (r.summary or {}).get("fit_s", math.nan)
        lines.append("| " + " | ".join([r.label, *map(fmt, means), fmt(fit)]) + " |")
    return "\n".join(lines)


def environment_line(runs: list[RunData]) -> str | None:
    """What the runs ran on (``summary.json``'s ``environment``) in one line, naming each field in which
    they differ: runs from different installs, thread counts or commits differ in their floating-point
    sums, so they compare as separate draws, not bit for bit. None when no run recorded it."""
    envs = [flat_environment(r.summary["environment"]) for r in runs if r.summary and r.summary.get("environment")]
    if not envs:
        return None
    keys = list(dict.fromkeys(k for e in envs for k in e))
    same = {k: envs[0].get(k) for k in keys if all(e.get(k) == envs[0].get(k) for e in envs)}
    parts = [f"{k} {v}" for k, v in same.items() if v is not None]
    line = "Environment: " + ", ".join(parts) + "."
    differ = [f"`{k}` ({', '.join(sorted({str(e.get(k)) for e in envs}))})" for k in keys if k not in same]
    if differ:
        line += " The runs differ in " + "; ".join(differ) + "."
    missing = len(runs) - len(envs)
    if missing:
        line += f" Not recorded for {missing} of {len(runs)} runs."
    return line


def flat_environment(env: dict) -> dict[str, object]:
    """``environment`` as one level of names: packages by name, the source as its commit (``+modified``
    when its tracked files differed)."""
    out: dict[str, object] = {k: v for k, v in env.items() if k not in ("packages", "source", "platform")}
    out.update(env.get("packages") or {})
    src = env.get("source")
    out["commit"] = None if not src else src["commit"][:10] + ("+modified" if src.get("dirty") else "")
    return out


def plot_metric(runs: list[RunData], metric: str, title: str, path: Path, log_y: bool = False) -> bool:
    """One line per run that logged ``metric``; False (no file) when none did."""
    plt = pyplot()
    have = [r for r in runs if r.metrics.get(metric)]
    if not have:
        return False
    fig, ax = plt.subplots(figsize=FIGSIZE)
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
    clip = clip_threshold(runs) if metric == "grad/norm" else None
    if clip is not None:
        ax.axhline(clip, color="black", ls=":", lw=1, label=f"clip threshold {clip:g}")
    if log_y:
        ax.set_yscale("log")
    finish_axes(fig, ax, path, metric, title)
    plt.close(fig)
    return True


def heldout_metrics(runs: list[RunData]) -> list[str]:
    """The held-out metrics to draw (names without prefix): every one of a single run's task (but its
    mean reward, which is not an accuracy), the runs' common accuracy metric when there are several."""
    logged = list(dict.fromkeys(k.split("/", 1)[1] for r in runs for k in r.metrics
                                if k.startswith((EVAL_PREFIX, VAL_PREFIX))))
    if len(runs) == 1:
        return [k for k in logged if k not in ("reward", "num_items")]
    keys = {str(r.stats["acc_key"]) for r in runs if r.stats.get("acc_key")}
    main = keys.pop() if len(keys) == 1 else None
    return [main] if main in logged else logged[:1]


def plot_heldout(runs: list[RunData], path: Path) -> bool:
    """Held-out metrics: the validation split during RL (lines) and the test split before and after
    RL (diamonds), one colour per run and metric."""
    metrics = heldout_metrics(runs)
    if not metrics:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    cmap = plt.get_cmap("tab20" if len(runs) * len(metrics) > 10 else "tab10")
    k = 0
    for r in runs:
        for m in metrics:
            label = m if len(runs) == 1 else (r.label if len(metrics) == 1 else f"{r.label} {m}")
            color = cmap(k % cmap.N)
            val = sorted(dict(r.metrics.get(VAL_PREFIX + m, [])).items())  # one value per step
            test = sorted(dict(r.metrics.get(EVAL_PREFIX + m, [])).items())
            if val:
                ax.plot([s for s, _ in val], [v for _, v in val], "o-", color=color, lw=1.5, ms=4, label=label)
            if test:
                ax.plot([s for s, _ in test], [v for _, v in test], "D", color=color, ms=8,
                        label=f"{label} (test)", markeredgecolor="black")
            k += bool(val or test)
    ax.set_ylim(-0.02, 1.02)
    finish_axes(fig, ax, path, "held-out value",
            "held-out metrics: validation split during RL (lines), test split before / after (diamonds)")
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

    groups = group_runs(runs)
    seeds = has_seeds(groups)
    if seeds:  # one line per condition: the mean over its seeds, their range as a band
        acc = next((r.stats["acc_key"] for r in runs if r.stats.get("acc_key")), None)
        if acc and plot_grouped(groups, VAL_PREFIX + acc, f"validation {acc} during RL", out / "heldout.png",
                                ylabel=acc):
            made.append(("heldout.png", f"validation {acc} during RL"))
    elif plot_heldout(runs, out / "heldout.png"):
        made.append(("heldout.png", "held-out metrics at each evaluation"))
    for f, metric, title, log_y in PLOTS:
        (out / f).unlink(missing_ok=True)  # a panel left out now must not linger from an earlier report
        value = constant_value(runs, metric) if metric in OMIT_IF_CONSTANT else None
        if value is not None:
            constant.append(f"`{metric}` ({value:g} at every step)")
        elif seeds and plot_grouped(groups, metric, title, out / f, log_y, SMOOTHED.get(metric),
                                    clip_threshold(runs) if metric == "grad/norm" else None):
            made.append((f, title))
        elif not seeds and plot_metric(runs, metric, title, out / f, log_y):
            made.append((f, title))
    failed = [r for r in runs if r.failed]
    intro = root / INTRO  # a recorded experiment's question, answer and command: the report's first lines
    head = [intro.read_text().rstrip(), ""] if intro.is_file() else [f"# Report: {root}", ""]
    lines = [*head, f"{len(runs)} runs, {len(failed)} failed. Labels are the overrides that "
             "differ between runs. Spikes: pre-clip gradient norm above `diagnostics.spike_factor` x its "
             "running median.", ""]
    if seeds:
        lines += [f"{len(groups)} conditions, mean ± sd over their seeds (test split; gain = after - before):", "",
                  grouped_table(groups), "", seed_table(groups), "", bootstrap_table(groups), "", "Every run:", ""]
    lines += [markdown_table(runs), ""]
    env = environment_line(runs)
    if env is not None:
        lines += [env, ""]
    cost = cost_table(runs)
    if cost is not None:
        lines += ["Rollout cost (means over the logged rows; `RL wall s` is the training loop's, without evaluation):",
                  "", cost, ""]
    if constant:
        why = (" (with `objective.mu=1` the policy is its own old policy at every update: ratios are 1, "
               "weights uniform)") if any("ratio/" in c or "weights/" in c for c in constant) else ""
        lines += ["Not plotted, constant in every run: " + ", ".join(constant) + why + ".", ""]
    lines += [f"![{title}]({f})" for f, title in made]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report, runs
