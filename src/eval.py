"""Evaluate a checkpoint greedily: ``python src/eval.py task=sudoku ckpt_path=... [task.data_path=file.csv]``.

Thin Hydra app around :func:`diffusion_rl.evaluate.evaluate_checkpoint`; writes
``generations.jsonl`` and ``eval_summary.json`` to the run folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

CONF = Path(__file__).resolve().parents[1] / "conf"


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def main(cfg: DictConfig) -> None:
    from diffusion_rl.cli import exit_on_config_error
    from diffusion_rl.evaluate import evaluate_checkpoint

    with exit_on_config_error():
        out_dir = HydraConfig.get().runtime.output_dir
        summary = evaluate_checkpoint(cfg, out_dir)
    print(json.dumps(summary, indent=2))
    print(f"written to {out_dir}")


if __name__ == "__main__":
    from diffusion_rl.cli import run_hydra_app

    run_hydra_app(main, CONF)
