"""How far a newcomer walks to follow one GRPO step, in this tree and (optionally) another revision.

    python benchmarks/step_walk.py [--baseline REV] [-- extra Hydra overrides]

Runs the default job (``objective=grpo task=sudoku``) for two optimizer steps with a Python profiler
on, and reads one step: everything the project calls between the end of the first ``training_step``
and the end of the second (the data loader's next batch, the callbacks, the rollout, the loss, the
backward and the optimizer step). Prints

- ``files``: the project's source files (``src/diffusion_rl/**``) with at least one function called;
- ``packages``: the sub-packages those files sit in;
- ``nested calls to the network``: the project's frames on the stack from ``training_step`` down to
  the first call of the network itself (an ``nn.Module.forward`` defined in ``diffusion_rl/models``)
  during the rollout, both ends counted; library frames (torch, Lightning) in between are not counted;
- ``functions``: the distinct project functions called in the step.

``--baseline`` checks the revision out into a temporary git worktree and walks it the same way.
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
OVERRIDES = [
    "objective=grpo", "task=sudoku", "trainer.max_steps=2", "trainer.enable_progress_bar=false",
    "trainer.checkpoint_every_n_steps=0", "warmstart.steps=2",
    "eval.before=false", "eval.after=false", "eval.every_n_steps=0",
]


class Walk:
    """A profiler hook that records the project's calls inside the window of one step."""

    def __init__(self, package_dir: str):
        self.package_dir = package_dir
        self.stack: list[tuple[str, str]] = []  # the project's frames now open (file, function)
        self.steps_done = 0
        self.open = False
        self.calls: set[tuple[str, str]] = set()
        self.depth_to_network: int | None = None
        self.chain: list[str] = []

    def ours(self, frame) -> bool:
        return frame.f_code.co_filename.startswith(self.package_dir)

    def __call__(self, frame, event, arg) -> None:
        if event not in ("call", "return") or not self.ours(frame):
            return
        code = frame.f_code
        key = (code.co_filename[len(self.package_dir):], code.co_name)
        if event == "call":
            self.stack.append(key)
            if self.open:
                self.calls.add(key)
                if self.depth_to_network is None and self.is_network(frame):
                    names = [name for _, name in self.stack]
                    start = names.index("training_step")
                    self.depth_to_network = len(names) - start
                    self.chain = [f"{f}:{name}" for f, name in self.stack[start:]]
            return
        if self.stack:
            self.stack.pop()
        if code.co_name == "training_step":
            self.steps_done += 1
            self.open = self.steps_done == 1  # the window: end of step 1 .. end of step 2

    def is_network(self, frame) -> bool:
        import torch

        me = frame.f_locals.get("self")
        return (frame.f_code.co_name == "forward" and "/models/" in frame.f_code.co_filename
                and isinstance(me, torch.nn.Module))


def child(out: Path, extra: list[str]) -> None:
    """Runs in the walked tree (its ``src`` first on ``sys.path``)."""
    from hydra import compose, initialize_config_dir

    import diffusion_rl
    from diffusion_rl.app.conf_store import register_configs
    from diffusion_rl.app.train import train

    package_dir = str(Path(diffusion_rl.__file__).resolve().parent) + "/"
    register_configs()
    with initialize_config_dir(config_dir=str(Path.cwd() / "conf"), version_base="1.3"):
        # a fresh cache folder: the warm start is trained, never reused (overrides every revision takes)
        fresh = [f"paths.cache_dir={tempfile.mkdtemp(prefix='step_walk_cache_')}"]
        cfg = compose(config_name="config", overrides=OVERRIDES + fresh + extra)
    walk = Walk(package_dir)
    run_dir = Path(tempfile.mkdtemp(prefix="step_walk_"))
    sys.setprofile(walk)
    import threading

    threading.setprofile(walk)
    try:
        train(cfg, run_dir)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    files = sorted({f for f, _ in walk.calls})
    result = {
        "files": files,
        "packages": sorted({f.split("/")[0] for f in files if "/" in f}),
        "functions": len(walk.calls),
        "nested_calls_to_network": walk.depth_to_network,
        "chain": walk.chain,
        "calls": sorted(f"{f}:{name}" for f, name in walk.calls),
    }
    out.write_text(json.dumps(result, indent=1))


def walk_tree(tree: Path, extra: list[str]) -> dict:
    out = Path(tempfile.mkdtemp(prefix="step_walk_out_")) / "walk.json"
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(out), "--", *extra]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: the walk failed\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", help="a git revision to walk as well")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--list", action="store_true", help="print the files, the chain to the network and the functions")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for both trees, after --")
    args = p.parse_args()
    if args.child:
        child(Path(args.child), args.overrides)
        return
    trees = {"this tree": ROOT}
    if args.baseline:
        base = Path(tempfile.mkdtemp(prefix="step_walk_")) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=ROOT, check=True,
                       capture_output=True)
        trees = {f"baseline {args.baseline}": base, **trees}
    try:
        for name, tree in trees.items():
            r = walk_tree(tree, args.overrides)
            print(f"{name}: {len(r['files'])} files in {len(r['packages'])} packages, "
                  f"{r['nested_calls_to_network']} nested calls from training_step to the network, "
                  f"{r['functions']} functions")
            if args.list:
                print("  files:\n    " + "\n    ".join(r["files"]))
                print("  from training_step to the network:\n    " + "\n    ".join(r["chain"]))
                print("  functions:\n    " + "\n    ".join(r["calls"]))
    finally:
        if args.baseline:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)


if __name__ == "__main__":
    main()
