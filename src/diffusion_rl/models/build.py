"""Build a policy by name: the registered builder, then the training options (dtype, LoRA, checkpointing).

Every module of this package is imported first (:func:`~diffusion_rl.core.registry.discover`), so a new
architecture is one file that registers its builder with ``@MODELS.register(name)``.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

import diffusion_rl.models as models_pkg
from diffusion_rl.core.registry import discover
from diffusion_rl.models.adapters import prepare_for_training
from diffusion_rl.models.policy import MODELS, ModelConfig, PolicyBundle


def discover_models() -> None:
    """Import every model module: registers the builders, and the native architectures with
    ``AutoConfig`` / ``AutoModel`` (so ``AutoModel.from_pretrained`` builds them too)."""
    discover(models_pkg.__name__, models_pkg.__path__)


def build_policy(cfg: ModelConfig, meta: bool = False) -> PolicyBundle:
    """Build the named model, then apply the training options (LoRA, activation checkpointing).

    ``meta``: every tensor on the ``meta`` device (the network's structure, no memory, no weights
    read): a process that receives its weights from another (FSDP, ``training/strategy.py``)."""
    discover_models()
    cfg.validate()
    with torch.device("meta") if meta else nullcontext():
        bundle = MODELS.get(cfg.name)(cfg)
        bundle.net = prepare_for_training(bundle.net, cfg)
    return bundle


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "config.json")


def files_digest(folder: Path, cache_dir: str | None) -> str:
    """sha256 over the weight files and config of a model folder (names and bytes), remembered in
    ``<cache_dir>/base_hashes.json`` by path, size and modification time (hashing 16 GB takes a while)."""
    files = sorted({p for pattern in WEIGHT_FILES for p in folder.glob(pattern) if p.is_file()})
    stamp = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    memo = Path(cache_dir) / "base_hashes.json" if cache_dir else None
    known = json.loads(memo.read_text()) if memo is not None and memo.is_file() else {}
    entry = known.get(str(folder.resolve()))
    if entry and entry.get("files") == stamp:
        return str(entry["sha256"])
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
    digest = h.hexdigest()
    if memo is not None:
        memo.parent.mkdir(parents=True, exist_ok=True)
        known[str(folder.resolve())] = {"files": stamp, "sha256": digest}
        tmp = memo.with_name(f"{memo.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, memo)
    return digest


def tensors_digest(net: torch.nn.Module, names: set[str] | None = None) -> str:
    """sha256 over a network's state dict (names, dtypes, shapes and bytes), for a model built here;
    ``names``: those entries only."""
    h = hashlib.sha256()
    for name, t in sorted(net.state_dict().items()):
        if names is not None and name not in names:
            continue
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def base_identity(bundle: PolicyBundle, cfg: ModelConfig, cache_dir: str | None) -> dict[str, Any]:
    """Where the weights a run starts from came from, and their content hash: what a checkpoint that
    leaves out the frozen weights (a LoRA base, a frozen reference copy) is resumed or evaluated on.

    A model folder (``model.path``): its path and the sha256 of its weight files; a hub id: the id
    (its files live in the hub's cache); a model built in-process (the embedded one, the tiny
    DiffusionGemma): the sha256 of its frozen tensors as built (after the warm start), the ones a
    checkpoint leaves out -- its trained tensors are in the checkpoint (a full fine-tune of a model with
    frozen routers is evaluated on the same initial routers whatever the warm start did to the rest);
    with none frozen, of every tensor (the warm start the run's reference policy is)."""
    if cfg.path:
        folder = Path(cfg.path).expanduser()
        if folder.is_dir():
            return {"path": str(folder.resolve()), "sha256": files_digest(folder, cache_dir)}
        return {"path": cfg.path, "sha256": None}
    frozen = {n for n, p in bundle.net.named_parameters(remove_duplicate=False) if not p.requires_grad}
    return {"path": f"embedded:{cfg.name}", "sha256": tensors_digest(bundle.net, frozen or None)}
