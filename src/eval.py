"""Evaluate with the papers' protocol, or re-score saved generations.

    python src/eval.py ckpt_path=<run folder | .ckpt | last> [task.data_path=file.csv]
    python src/eval.py task=gsm8k task.data_path=gsm8k_test.jsonl ckpt_path=... eval.gen_lengths=[128,256,512]
    python src/eval.py policy=warmstart task=sudoku                                      # no RL, no checkpoint
    python src/eval.py policy=reference task=math500 task.data_path=math500_test.jsonl   # must score 100%
    python src/eval.py mode=score task=gsm8k generations=.../generations.jsonl            # no model
    python src/eval.py mode=score task=gsm8k eval.protocol=d1 generations=<d1_llada_eval folder>  # the papers' row

A checkpoint carries its run's model, tokenizer, task and sampler config, and the evaluation uses
them; what the command line sets explicitly goes on top (a different network is refused).

Thin Hydra app (config ``conf/eval.yaml``) around :func:`diffusion_rl.app.evaluate.run_eval`; writes
``generations.jsonl``, ``eval_summary.json`` and ``eval_summary.md`` to the run folder and returns
the first metric of the first length (what a sweeper optimises).
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from diffusion_rl.app.conf_store import register_configs

CONF = Path(__file__).resolve().parents[1] / "conf"
register_configs()  # the dataclass defaults the yaml files start from; at import, so sweep workers have them


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="eval")
def main(cfg: DictConfig) -> float | None:
    from diffusion_rl.app.cli import hydra_job
    from diffusion_rl.app.evaluate import run_eval

    summary = hydra_job(lambda run_dir: run_eval(cfg, run_dir))
    if summary is None:  # a failed multirun job (failed.json in its folder)
        return float("nan")
    out_dir = HydraConfig.get().runtime.output_dir
    print((Path(out_dir) / "eval_summary.md").read_text())
    print(json.dumps({k: v for k, v in summary.items() if k not in ("by_length", "metric_definitions")}, indent=2))
    print(f"written to {out_dir}")
    first: dict = next(iter(summary["by_length"].values()), {})
    return next(iter(first.values()), None)


if __name__ == "__main__":
    from diffusion_rl.app.cli import run_hydra_app

    run_hydra_app(main, CONF, config_name="eval")
