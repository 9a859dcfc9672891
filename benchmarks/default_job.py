"""Speed of the embedded default job (``python src/train.py objective=grpo task=sudoku``) in this tree
against another revision, in one run.

    python benchmarks/default_job.py --baseline 4607e93 --step [--repeats 2] [--steps 40]   # the RL step
    python benchmarks/default_job.py --baseline 4607e93 [--repeats 2] [--steps 200]         # the whole job

The baseline revision is checked out into a temporary git worktree; both trees run the same command
alternately (baseline, this tree, baseline, ...), each with its warm start cached before timing (one
shared cache folder, filled by a 1-step run of each tree), so neither pays the warm start.

- ``--step``: the RL step at equal rollouts (``task.prompts_per_batch`` x ``task.group_size``
  completions a step, both trees' defaults), evaluations off: seconds per optimizer step (the fit's
  wall time over its steps) and the median rollout / update time of a step from ``metrics.csv``;
- otherwise the whole ``train()`` (``summary.json``'s ``wall_s``: start-up after the imports,
  evaluations before, during and after RL) and the held-out cell accuracy after RL.

Prints each run and the ratio of the means (baseline / this tree: above 1 = this tree is faster).
Extra Hydra overrides for both trees follow ``--`` (e.g. ``-- objective=stabledrl``); against a revision
from before the default GRPO job took per-cell credit and a 200-step warm start on Sudoku
(``conf/testbed/tiny_grpo.yaml``), ``-- advantage=per_token warmstart.steps=200`` runs both trees alike. Timing needs an
otherwise idle machine; ``--threads`` sets the torch threads of both (default: torch's own).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_EVAL = ["eval.before=false", "eval.after=false", "eval.every_n_steps=0"]


def run(tree: Path, out: Path, cache: Path, steps: int, extra: list[str], threads: int | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, "src/train.py", "objective=grpo", "task=sudoku", f"trainer.max_steps={steps}",
           "trainer.enable_progress_bar=false", "trainer.checkpoint_every_n_steps=0", f"hydra.run.dir={out}",
           f"paths.cache_dir={cache}", *extra]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: the default job failed\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    for key in ("time/rollout_s", "time/update_s"):
        vals = [float(r[key]) for r in rows if r.get(key)]
        summary[key] = statistics.median(vals) if vals else float("nan")
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="a git revision to time against")
    p.add_argument("--step", action="store_true", help="time the RL step alone (evaluations off)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: 40 with --step, else 200)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("overrides", nargs="*", help="Hydra overrides for both trees, after --")
    args = p.parse_args()
    steps = args.steps or (40 if args.step else 200)
    extra = (NO_EVAL if args.step else []) + args.overrides
    tmp = Path(tempfile.mkdtemp(prefix="default_job_"))
    base = tmp / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=ROOT, check=True,
                   capture_output=True)
    trees = {"baseline": base, "this tree": ROOT}
    measure = (lambda s: s["fit_s"] / s["optimizer_steps"]) if args.step else (lambda s: s["wall_s"])
    unit = "s per optimizer step" if args.step else "s wall"
    try:
        for name, tree in trees.items():  # fills the warm-start cache each tree reads
            run(tree, tmp / f"warm_{name.replace(' ', '_')}", tmp / "cache", 1, NO_EVAL + args.overrides, args.threads)
        times: dict[str, list[float]] = {name: [] for name in trees}
        for i in range(args.repeats):
            for name, tree in trees.items():
                s = run(tree, tmp / f"{name.replace(' ', '_')}_{i}", tmp / "cache", steps, extra, args.threads)
                times[name].append(measure(s))
                line = (f"rollout {s['time/rollout_s']:.3f} s, update {s['time/update_s']:.3f} s (medians)"
                        if args.step else f"cell accuracy {s['before']['cell_accuracy']:.3f} -> "
                                          f"{s['after']['cell_accuracy']:.3f}")
                print(f"{name:9s} run {i}: {measure(s):.3f} {unit}; {line}", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    mean = {k: sum(v) / len(v) for k, v in times.items()}
    print(f"\n{unit}: {args.baseline} {mean['baseline']:.3f}, this tree {mean['this tree']:.3f}; "
          f"speed-up {mean['baseline'] / mean['this tree']:.2f}x")


if __name__ == "__main__":
    main()
