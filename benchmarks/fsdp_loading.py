"""Peak host memory of each process when two processes start an RL run on one model: FSDP2 against DDP.

    python benchmarks/fsdp_loading.py [--d-model 1024 --layers 8]

Writes a random checkpoint in LLaDA's released layout at a scaled size (fp32), then runs one RL step
of ``src/train.py`` on it with two gloo processes on the CPU, twice: ``trainer=fsdp`` (the first
process reads the weights; the other builds the network on the ``meta`` device and receives its
shards: ``training/strategy.py``) and ``trainer=ddp`` (every process loads the whole model, the
baseline). Prints each process's peak resident memory over the run (``ru_maxrss``, as each run logs
it: the weights, gradients and optimizer state the process holds, and what reading the checkpoint
took), the model's size, and what FSDP2 saved on the process that does not load it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.released_layouts import write_checkpoint  # noqa: E402

RUN = ["model=llada_8b_instruct", "model.dtype=float32", "model.lora_r=0", "model.gradient_checkpointing=false",
       "old_policy=precomputed", "objective=grpo", "task.num_train=16", "task.num_test=2", "task.num_val=2",
       "task.prompts_per_batch=1", "task.group_size=2", "warmstart.enabled=false", "eval.before=false",
       "eval.after=false", "eval.every_n_steps=0", "sampler.gen_length=16", "sampler.block_length=16",
       "sampler.steps=2", "trainer.max_steps=1", "trainer.checkpoint_every_n_steps=0", "trainer.accelerator=cpu",
       "trainer.devices=2", "trainer.enable_progress_bar=false", "diagnostics.samples_every_n_steps=0"]
STRATEGIES = {"fsdp": ["trainer=fsdp", "trainer.strategy_kwargs.param_dtype=null",
                       "trainer.strategy_kwargs.reduce_dtype=null"],
              "ddp": ["trainer=ddp"]}
PEAK = re.compile(r"peak host memory of process (\d+): ([0-9.]+) GiB")


def peaks(run_dir: Path) -> dict[int, float]:
    """{process: peak GiB} from the run's logs (the first process's and the others')."""
    found = {}
    for log in run_dir.glob("*.log"):
        for m in PEAK.finditer(log.read_text()):
            found[int(m.group(1))] = float(m.group(2))
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fsdp_loading_"))
    heads = max(1, args.d_model // 128)
    folder = write_checkpoint("llada", tmp / "model", real_ids=False, overrides={
        "d_model": args.d_model, "n_layers": args.layers, "n_heads": heads, "n_kv_heads": heads,
        "mlp_hidden_size": int(args.d_model * 2.6875) // 8 * 8})
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**30
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}
    results = {}
    for name, extra in STRATEGIES.items():
        run = tmp / name
        out = subprocess.run([sys.executable, "src/train.py", *RUN, *extra, f"model.path={folder}",
                              f"hydra.run.dir={run}", f"paths.cache_dir={tmp / 'cache'}"], cwd=ROOT, env=env,
                             capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
        results[name] = peaks(run)
    print(f"model: {args.layers} layers, d_model {args.d_model}: {size:.2f} GiB of fp32 weights\n")
    print("| process | DDP: each loads the model (GiB) | FSDP2: the first loads, the other gets shards (GiB) |")
    print("|---|---|---|")
    for rank in sorted(results["ddp"]):
        print(f"| {rank} | {results['ddp'][rank]:.2f} | {results['fsdp'].get(rank, float('nan')):.2f} |")
    saved = results["ddp"][1] - results["fsdp"][1]
    print(f"\nprocess 1 holds {saved:.2f} GiB less under FSDP2 ({saved / size:.2f} x the model's size)")


if __name__ == "__main__":
    main()
