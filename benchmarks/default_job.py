"""Wall time of the embedded default job (``python src/train.py objective=grpo task=sudoku``) in this
tree against another revision, in one run.

    python benchmarks/default_job.py --baseline 1e4862f [--repeats 2] [--steps 200]

The baseline revision is checked out into a temporary git worktree; both trees run the same command
alternately (baseline, this tree, baseline, ...) with one shared warm-start cache, filled once before
timing, so neither pays the warm start. Prints each run's wall time (``summary.json``'s ``wall_s``: the
whole ``train()``, evaluations included), held-out cell accuracy after RL, and the ratio of the mean
wall times. Timing needs an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(tree: Path, out: Path, cache: Path, steps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cmd = [sys.executable, "src/train.py", "objective=grpo", "task=sudoku", f"trainer.max_steps={steps}",
           "trainer.enable_progress_bar=false", f"hydra.run.dir={out}", f"paths.cache_dir={cache}"]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: the default job failed\n{done.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="a git revision to time against")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="default_job_"))
    base = tmp / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=ROOT, check=True,
                   capture_output=True)
    try:
        run(ROOT, tmp / "warm", tmp / "cache", 1)  # fills the warm-start cache both trees read
        times: dict[str, list[float]] = {"baseline": [], "this tree": []}
        for i in range(args.repeats):
            for name, tree in (("baseline", base), ("this tree", ROOT)):
                s = run(tree, tmp / f"{name.replace(' ', '_')}_{i}", tmp / "cache", args.steps)
                times[name].append(s["wall_s"])
                print(f"{name:9s} run {i}: {s['wall_s']:.1f} s, cell accuracy {s['before']['cell_accuracy']:.3f} -> "
                      f"{s['after']['cell_accuracy']:.3f}", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    mean = {k: sum(v) / len(v) for k, v in times.items()}
    print(f"\nwall time, this tree / {args.baseline}: {mean['this tree'] / mean['baseline']:.3f} "
          f"({mean['this tree']:.1f} s vs {mean['baseline']:.1f} s)")


if __name__ == "__main__":
    main()
