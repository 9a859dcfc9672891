"""Rebuild the policy a checkpoint holds, as its run built it: what ``src/eval.py`` evaluates.

Every checkpoint carries its run's resolved config (``checkpoint["run"]["config"]``,
``training/checkpoint.py``). :func:`config_from_checkpoint` starts the ``model``, ``task`` and
``sampler`` groups from it, so ``python src/eval.py ckpt_path=<run>`` scores the model, tokenizer,
test set and sampler the run trained with, whatever the command line's defaults say. What the user
sets explicitly wins: ``task.data_path=file.csv`` on top of the run's task, ``task=gsm8k`` instead
of it. A model override that changes the network (``model=tiny_block`` against a ``model=tiny``
checkpoint: same tensors, other attention) is refused in one line by :func:`check_architecture`;
keys that only change how the same network runs (:data:`RUNTIME_MODEL_KEYS`) may differ.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from diffusion_rl.core.config import from_dict, override_key
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.build import base_identity
from diffusion_rl.models.policy import ModelConfig, PolicyBundle
from diffusion_rl.training.checkpoint import (
    RUN_KEY,
    RUNS_ROOT,
    CheckpointRef,
    check_base,
    load_checkpoint,
    load_sharded_tensors,
    newest_run_checkpoint,
)

log = logging.getLogger(__name__)

GROUPS = ("model", "task", "sampler")  # what a checkpoint's run config decides for an evaluation
# model keys that change how the same weights run, not which network they belong to
RUNTIME_MODEL_KEYS = ("dtype", "gradient_checkpointing", "trust_remote_code", "extra", "path", "load_in_4bit")


def command_line_overrides() -> list[str]:
    """The overrides the user typed (Hydra's ``overrides.task``); [] outside a Hydra app."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def find_checkpoint(value: str) -> str:
    """``ckpt_path`` as a file or folder; ``last`` is the newest ``last.ckpt`` under ``outputs/``."""
    if value != "last":
        return value
    newest = newest_run_checkpoint(RUNS_ROOT)
    if newest is None:
        raise ConfigError("ckpt_path", value, f"means the newest training run under {RUNS_ROOT.resolve()}, and none "
                          "there has a checkpoint: give ckpt_path=<run folder or .ckpt>")
    log.info("ckpt_path=last: %s", newest)
    return str(newest)


def config_from_checkpoint(cfg: DictConfig, stored: dict[str, Any], overrides: list[str]) -> DictConfig:
    """``cfg`` with :data:`GROUPS` taken from the checkpoint's config ``stored``, unless the user
    chose the group (``task=gsm8k``); the user's ``group.key=value`` overrides go on top."""
    merged: dict[str, Any] = OmegaConf.to_container(cfg, resolve=False)  # type: ignore[assignment]
    keys = [(override_key(o), "~" if o.startswith("~") else "=") for o in overrides]  # (key, operator)
    for group in GROUPS:
        if group not in stored or any(k == group for k, _ in keys):
            continue
        node = OmegaConf.create(stored[group])
        for key, op in keys:
            if not key.startswith(group + "."):
                continue
            sub = key[len(group) + 1:]
            if op == "~":
                parent, _, leaf = sub.rpartition(".")
                target = OmegaConf.select(node, parent) if parent else node
                if isinstance(target, DictConfig) and leaf in target:
                    del target[leaf]
            else:
                OmegaConf.update(node, sub, OmegaConf.select(cfg, key), merge=False, force_add=True)
        if group == "task" and ("task.data_path", "=") in keys and ("task.num_test", "=") not in keys:
            node.num_test = None  # the run's cap was on its own test set: a file the user names is scored whole
        merged[group] = OmegaConf.to_container(node)
    return OmegaConf.create(merged)


def check_architecture(trained: dict[str, Any], wanted: dict[str, Any], ckpt: str) -> None:
    """Refuse (one line) a model config whose network differs from the one the checkpoint trained."""
    # both with every default filled in: a checkpoint older than a new ModelConfig field lacks it
    a, b = (dataclasses.asdict(from_dict(ModelConfig, m, "model")) for m in (trained, wanted))
    for key in a:
        if key in RUNTIME_MODEL_KEYS or a[key] == b[key]:
            continue
        raise ConfigError(f"model.{key}", b[key], f"the checkpoint {ckpt} was trained with "
                          f"model.{key}={a[key]!r}: another network; drop the model override")


def restore_policy(bundle: PolicyBundle, blob: dict[str, Any], path: Path, value: str,
                   model: ModelConfig | None = None, cache_dir: str | None = None) -> None:
    """Load the checkpoint's ``policy.*`` weights into ``bundle.net``: every tensor it holds must fit;
    those it leaves out must be frozen ones (a LoRA base), which ``bundle`` was built with from the
    base the checkpoint names (path and content hash, checked here: ``model``, ``cache_dir``).
    A sharded checkpoint folder (FSDP) is read in this process alone."""
    own = bundle.net.state_dict()
    if "sharded" in blob:  # a torch.distributed.checkpoint folder: its tensors, shaped as this network's
        wanted = {k: own[k.removeprefix("policy.")] for k in blob["sharded"]
                  if k.startswith("policy.") and k.removeprefix("policy.") in own}
        state = load_sharded_tensors(path, wanted)
    else:
        state = blob["state_dict"]
    policy = {k.removeprefix("policy."): v for k, v in state.items() if k.startswith("policy.")}
    try:
        missing, unexpected = bundle.net.load_state_dict(policy, strict=False)
    except RuntimeError as err:  # shape mismatches
        shapes = "; ".join(line.strip() for line in str(err).splitlines()[1:3])
        raise ConfigError("ckpt_path", value, f"{path} does not fit the model config ({shapes[:200]})") from None
    frozen = {n for n, p in bundle.net.named_parameters(remove_duplicate=False) if not p.requires_grad}
    if unexpected or set(missing) - frozen or (missing and "sharded" in blob and len(policy) < len(wanted)):
        raise ConfigError("ckpt_path", value, f"{path} does not fit the model config "
                          f"(missing {len(set(missing) - frozen)}, unexpected {len(unexpected)} tensors)")
    if missing and model is not None:  # the frozen weights are this build's: the checkpoint's base?
        run = blob.get(RUN_KEY) or {}
        ref = CheckpointRef(path, int(blob.get("global_step", 0)), dict(run) if isinstance(run, dict) else {})
        check_base(ref, base_identity(bundle, model, cache_dir))


def load_run_checkpoint(cfg: DictConfig, value: str, overrides: list[str]) -> tuple[DictConfig, Path, dict[str, Any]]:
    """``(cfg with the checkpoint's run config, checkpoint file, checkpoint dict)`` for ``ckpt_path=value``;
    an override that changes the network is refused here, before any model is built."""
    path, blob = load_checkpoint(find_checkpoint(value))
    run = blob.get(RUN_KEY) or {}
    stored = run.get("config") if isinstance(run, dict) else None
    if not stored:  # written before checkpoints carried their config: the command line decides
        log.warning("%s carries no run config (an older checkpoint): using the command line's model, task "
                    "and sampler", path)
        return cfg, path, blob
    new = config_from_checkpoint(cfg, stored, overrides)
    check_architecture(stored["model"], OmegaConf.to_container(new.model, resolve=True), str(path))  # type: ignore[arg-type]
    log.info("evaluating %s (step %s): model=%s, task=%s", path, blob.get("global_step"), new.model.name, new.task.name)
    return new, path, blob
