"""Train a diffusion LM with RL: ``python src/train.py objective=grpo task=sudoku``.

Thin Hydra app around :func:`diffusion_rl.app.train.train`. Shorten a run with ``trainer.max_steps=4``,
place it with ``hydra.run.dir=...``, resume with ``hydra.run.dir=<run> ckpt_path=last``, sweep with ``-m``;
``--cfg job`` prints the config that runs, ``--explain`` where each of its values comes from.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from diffusion_rl.app.conf_store import register_configs

CONF = Path(__file__).resolve().parents[1] / "conf"
register_configs()  # the dataclass defaults the yaml files start from; at import, so sweep workers have them


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def main(cfg: DictConfig) -> float | None:
    from diffusion_rl.app.cli import hydra_job, job_sources
    from diffusion_rl.app.train import format_summary, train

    summary = hydra_job(lambda run_dir: train(cfg, run_dir, sources=job_sources(CONF)))
    if summary is None:  # a failed multirun job (failed.json in its folder)
        return float("nan")
    print(format_summary(summary))
    after = summary.get("after") or {}
    return next(iter(after.values()), None)  # the metric a sweeper optimises


if __name__ == "__main__":
    from diffusion_rl.app.cli import run_hydra_app

    run_hydra_app(main, CONF)
