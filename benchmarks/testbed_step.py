"""Cost of an RL step on a testbed against the Sudoku step, in this tree, in one run.

    python benchmarks/testbed_step.py                                   # task=multi_sudoku vs task=sudoku, StableDRL
    python benchmarks/testbed_step.py --steps 6 --threads 1 -- objective=grpo
    python benchmarks/testbed_step.py --testbed task=multi_sudoku task.grids=4 sampler.gen_length=64

Both arms run ``src/train.py`` with evaluations off, the warm start cached first (a 1-step run of each, not
timed), then alternately (Sudoku, testbed, Sudoku, ...). Prints seconds per optimizer step (the fit's wall
time over its steps), the median rollout and update time of a step from ``metrics.csv``, the ratio
testbed / Sudoku, and what a grid of ``--grid-runs`` runs of ``--grid-steps`` steps costs at the
testbed's rate, ``--jobs`` at a time (evaluations not included). Timing needs an otherwise idle machine;
``--threads`` sets the torch threads of both arms (the experiment grids run one thread a job).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from default_job import NO_EVAL, ROOT, run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--testbed", nargs="+", default=["task=multi_sudoku"], help="the testbed's overrides")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps a timed run")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--grid-runs", type=int, default=45, help="runs of the grid to cost")
    p.add_argument("--grid-steps", type=int, default=100, help="optimizer steps a run of the grid")
    p.add_argument("--jobs", type=int, default=2, help="runs of the grid at a time")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for both arms, after -- (default objective=stabledrl)")
    args = p.parse_args()
    common = args.overrides or ["objective=stabledrl"]
    arms = {"sudoku": ["task=sudoku", *common], "testbed": [*common, *args.testbed]}
    tmp = Path(tempfile.mkdtemp(prefix="testbed_step_"))
    for name, extra in arms.items():  # fills the warm-start cache each arm reads
        run(ROOT, tmp / f"warm_{name}", tmp / "cache", 1, NO_EVAL + extra, args.threads)
    per_step: dict[str, list[float]] = {name: [] for name in arms}
    for i in range(args.repeats):
        for name, extra in arms.items():
            s = run(ROOT, tmp / f"{name}_{i}", tmp / "cache", args.steps, NO_EVAL + extra, args.threads)
            per_step[name].append(s["fit_s"] / s["optimizer_steps"])
            print(f"{name:7s} run {i}: {per_step[name][-1]:.2f} s per optimizer step; rollout "
                  f"{s['time/rollout_s']:.2f} s, update {s['time/update_s']:.2f} s (medians)", flush=True)
    mean = {k: sum(v) / len(v) for k, v in per_step.items()}
    hours = mean["testbed"] * args.grid_steps * args.grid_runs / args.jobs / 3600
    print(f"\ns per optimizer step: sudoku {mean['sudoku']:.2f}, testbed {mean['testbed']:.2f} "
          f"({mean['testbed'] / mean['sudoku']:.1f}x)")
    print(f"a grid of {args.grid_runs} runs x {args.grid_steps} steps, {args.jobs} at a time: {hours:.1f} h of RL steps "
          "(evaluations and warm start not included)")


if __name__ == "__main__":
    main()
