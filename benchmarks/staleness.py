"""Wall time per RL step of bounded-staleness rollouts (``rollout.staleness=k``) against the synchronous
loop, at the same total number of threads, in one run.

    python benchmarks/staleness.py [--threads 2] [--worker-threads 1] [--staleness 1] [--steps 40] [--repeats 2]
        [--worker process|ranks] [-- overrides]

Arms, run alternately (sync, stale, sync, ...), each a ``src/train.py`` process of the embedded default
job (``objective=grpo task=sudoku``, evaluations and checkpoints off) with its warm start cached before
timing:

- ``sync``: ``rollout.staleness=0`` with ``trainer.threads=T``;
- ``stale``: ``rollout.staleness=k``, the trainer on ``T - w`` threads and the rollout worker process on
  ``w`` (``rollout.worker_threads``), so both arms use ``T`` threads in all. With ``--worker ranks`` the
  worker is a rollout rank instead: ``torchrun --standalone --nproc_per_node=2`` starts the trainer
  (rank 0) and one rollout rank, which receive weights and return rollouts over gloo.

The figure is the median of ``time/step_s`` (a training batch's wall time: its rollout, or the wait
for it, and its updates) over the steps after the first ``k + 2`` (the worker's start and the
pipeline's fill are start-up, not steady state), and ``fit_s`` over the optimizer steps for the whole
fit. Also printed: the medians of the sync arm's rollout and update times, and the stale arm's wait
for rollouts and the worker's busy and idle time per batch, which say where the time goes. Timing
needs an otherwise idle machine. Prints each run and the ratio of the means (sync / stale: above 1 =
staleness is faster).

    python benchmarks/staleness.py --gpu-model [--gpus 8] [--rollout-share 0.89]

prints, without running anything, the step time of ``--gpus`` GPUs colocated (every GPU samples, then
every GPU trains: ``R + U``) against a split (``a`` GPUs sample while ``gpus - a`` train, staleness 1:
``max(R gpus / a, U gpus / (gpus - a))``) for every ``a``, in units of the colocated step, from the
rollout's share of a colocated step's work. Both phases are taken to scale linearly with GPUs and the
weight transfer to cost nothing: computed, not measured. The default share is the FLOP count of
StableDRL's public regime on LLaDA-8B (``gpu_phase_flops``).
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
FIXED = ["objective=grpo", "task=sudoku", "eval.before=false", "eval.after=false", "eval.every_n_steps=0",
         "trainer.enable_progress_bar=false", "trainer.checkpoint_every_n_steps=0",
         "diagnostics.samples_every_n_steps=0"]


def run(out: Path, cache: Path, steps: int, extra: list[str], threads: int) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] if "rollout.worker=ranks" in extra else []
    cmd = [sys.executable, *launcher, "src/train.py", *FIXED, f"trainer.max_steps={steps}", f"hydra.run.dir={out}",
           f"paths.cache_dir={cache}", *extra]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(extra)}: the job failed\n{done.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text()) | {"rows": list(csv.DictReader(open(out / "metrics.csv")))}


def median_of(rows: list[dict[str, str]], key: str, skip: int) -> float:
    vals = [float(r[key]) for r in rows if r.get(key)][skip:]
    return statistics.median(vals) if vals else float("nan")


def gpu_phase_flops(params: float = 8e9, prompt: int = 150, gen: int = 256, steps: int = 128, mc: int = 2,
                    inner: int = 2) -> tuple[float, float]:
    """FLOPs per completion of an RL step's rollout and of its updates, at StableDRL's public regime on
    LLaDA-8B (256 tokens in 128 steps without a cache; ``mc`` ELBO samples for the old policy at rollout
    time and for the policy in each of ``inner`` updates, forward and backward): 2 FLOPs per parameter
    and token forward, 6 forward and backward."""
    tokens = prompt + gen
    rollout = steps * 2 * params * tokens
    update = mc * 2 * params * tokens + inner * mc * 6 * params * tokens
    return rollout, update


def gpu_model(gpus: int, share: float) -> None:
    R, U = share, 1 - share  # a colocated step is R + U = 1
    print(f"{gpus} GPUs, rollout {100 * share:.0f}% of the work (computed, not measured):")
    print("  colocated (sample, then train, on every GPU): 1.000")
    for a in range(1, gpus):
        t = max(R * gpus / a, U * gpus / (gpus - a))
        print(f"  split {a} sampling + {gpus - a} training, staleness 1: {t:.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2, help="threads of each arm in all")
    p.add_argument("--worker-threads", type=int, default=1, help="of them, the rollout worker's (stale arm)")
    p.add_argument("--staleness", type=int, default=1)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--worker", choices=("process", "ranks"), default="process", help="the stale arm's worker")
    p.add_argument("--gpu-model", action="store_true", help="print the computed GPU table and stop")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--rollout-share", type=float, default=None, help="default: gpu_phase_flops's share")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for both arms, after --")
    a = p.parse_args()
    if a.gpu_model:
        rollout, update = gpu_phase_flops()
        return gpu_model(a.gpus, a.rollout_share if a.rollout_share is not None else rollout / (rollout + update))
    if not 0 < a.worker_threads < a.threads or a.staleness < 1:
        raise SystemExit("need 0 < --worker-threads < --threads and --staleness >= 1")
    k, T, w = a.staleness, a.threads, a.worker_threads
    arms = {"sync": ([f"trainer.threads={T}"], T),
            f"staleness={k}": ([f"rollout.staleness={k}", f"trainer.threads={T - w}", f"rollout.worker_threads={w}",
                                f"rollout.worker={a.worker}"], T - w)}
    tmp = Path(tempfile.mkdtemp(prefix="staleness_"))
    skip = k + 2
    for name, (extra, threads) in arms.items():  # the warm start is cached per thread count
        run(tmp / f"warm_{name.replace('=', '')}", tmp / "cache", 1, extra + a.overrides, threads)
    per_step: dict[str, list[float]] = {name: [] for name in arms}
    for i in range(a.repeats):
        for name, (extra, threads) in arms.items():
            s = run(tmp / f"{name.replace('=', '')}_{i}", tmp / "cache", a.steps, extra + a.overrides, threads)
            rows = s["rows"]
            step = median_of(rows, "time/step_s", skip)
            per_step[name].append(step)
            if name == "sync":
                where = (f"rollout {median_of(rows, 'time/rollout_s', skip):.3f} s, "
                         f"update {median_of(rows, 'time/update_s', skip):.3f} s")
            else:
                where = (f"wait for rollout {median_of(rows, 'time/trainer_wait_s', skip):.3f} s, "
                         f"update {median_of(rows, 'time/update_s', skip):.3f} s; worker busy "
                         f"{median_of(rows, 'time/worker_busy_s', skip):.3f} s, idle "
                         f"{median_of(rows, 'time/worker_idle_s', skip):.3f} s")
            print(f"{name:12s} run {i}: {step:.3f} s per RL step (median after {skip}), "
                  f"{s['fit_s'] / s['optimizer_steps']:.3f} s per step over the whole fit; {where} (medians)",
                  flush=True)
    mean = {name: sum(v) / len(v) for name, v in per_step.items()}
    stale = f"staleness={k}"
    print(f"\ns per RL step at {T} threads in all: sync {mean['sync']:.3f}, {stale} ({T - w} trainer + {w} {a.worker}) "
          f"{mean[stale]:.3f}; sync / {stale} = {mean['sync'] / mean[stale]:.2f}")


if __name__ == "__main__":
    main()
