"""``evaluate_checkpoint(cfg)``: greedy evaluation of a trained policy on a task's held-out items.

Writes ``generations.jsonl`` (prompt, completion, reward, gold fields) and ``eval_summary.json``
(the task's metrics) to the run folder. Checkpoints are loaded with ``weights_only=True``: nothing
in them is unpickled as code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from diffusion_rl.config import from_dict
from diffusion_rl.errors import ConfigError
from diffusion_rl.models.policy import ModelConfig, PolicyBundle, build_policy
from diffusion_rl.sampling import SamplerConfig
from diffusion_rl.train import EvalConfig, build_task
from diffusion_rl.training.evaluation import evaluate


def load_policy_weights(bundle: PolicyBundle, ckpt_path: str | Path) -> None:
    """Load the policy's weights from a Lightning checkpoint of :class:`DiffusionRLModule`."""
    path = Path(ckpt_path)
    if not path.is_file():
        raise ConfigError("ckpt_path", str(ckpt_path), "no such checkpoint file")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - corrupt or foreign file: one clear line
        raise ConfigError("ckpt_path", str(ckpt_path), f"unreadable checkpoint ({type(err).__name__})") from err
    state = blob.get("state_dict", blob)
    policy = {k.removeprefix("policy."): v for k, v in state.items() if k.startswith("policy.")}
    if not policy:
        raise ConfigError("ckpt_path", str(ckpt_path), "holds no 'policy.*' weights (not a diffusion_rl checkpoint?)")
    missing, unexpected = bundle.net.load_state_dict(policy, strict=False)
    if missing or unexpected:
        raise ConfigError("ckpt_path", str(ckpt_path),
                          f"does not match model config (missing {len(missing)}, unexpected {len(unexpected)} tensors)")


def evaluate_checkpoint(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    task = build_task(cfg.task)
    sampler = from_dict(SamplerConfig, cfg.sampler, "sampler")
    ev = from_dict(EvalConfig, cfg.eval, "eval")
    bundle = build_policy(from_dict(ModelConfig, cfg.model, "model"))
    if cfg.get("ckpt_path"):
        load_policy_weights(bundle, cfg.ckpt_path)
    items = task.test_items()
    metrics, records = evaluate(bundle, task, items, sampler, ev.batch_size)
    with open(run_dir / "generations.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    summary = {"ckpt_path": cfg.get("ckpt_path"), "task": cfg.task.name, "num_items": len(items), **metrics}
    with open(run_dir / "eval_summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    return summary
