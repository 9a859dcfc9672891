"""Lightning strategies for the RL loop: ``trainer=ddp`` and ``trainer=fsdp``, and gradient clipping
that is correct under each.

``trainer.strategy`` names a Lightning strategy; ``trainer.strategy_kwargs`` are its arguments.
For ``fsdp`` two keys are ours: ``auto_wrap: decoder_layers`` wraps every decoder layer (the classes
a Hugging Face model lists in ``_no_split_modules``; the embedded model's ``Block``) in its own FSDP
unit, and ``activation_checkpointing: true`` checkpoints the same classes. The rest go to
:class:`lightning.pytorch.strategies.FSDPStrategy` as they are (``sharding_strategy``,
``state_dict_type: full | sharded``, ``use_orig_params``, ``cpu_offload``, ...).

Clipping: ``torch.nn.utils.clip_grad_norm_`` over a process's parameters is right under DDP (the
gradients are all-reduced before it runs) but wrong under FSDP, where each process holds a shard of
every gradient: there the root module's ``clip_grad_norm_`` computes the norm over all shards.
Both return the total norm *before* clipping, which is what the module logs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from diffusion_rl.errors import ConfigError


def decoder_layer_classes(net: nn.Module) -> set[type[nn.Module]]:
    """The classes of a network's decoder layers: Hugging Face's ``_no_split_modules``, else
    the embedded model's block."""
    names: set[str] = set()
    for m in net.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    if not names:
        from diffusion_rl.models.tiny import Block

        names = {Block.__name__}
    classes = {type(m) for m in net.modules() if type(m).__name__ in names}
    if not classes:
        raise ConfigError(
            "trainer.strategy_kwargs.auto_wrap",
            "decoder_layers",
            f"found no layer of the classes {sorted(names)} in the model",
        )
    return classes


def make_strategy(name: str, kwargs: dict[str, Any], net: nn.Module) -> Any:
    """A Lightning strategy object (or its name when there is nothing to configure)."""
    if not kwargs:
        return name
    kwargs = dict(kwargs)
    if name.startswith("ddp"):
        from lightning.pytorch.strategies import DDPStrategy

        start = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork"}.get(name)
        if start is None:
            raise ConfigError(
                "trainer.strategy",
                name,
                "with strategy_kwargs allowed: ddp, ddp_spawn, ddp_fork, fsdp",
            )
        return DDPStrategy(start_method=start, **kwargs)  # type: ignore[arg-type]  # one of the literals
    if name == "fsdp":
        from lightning.pytorch.strategies import FSDPStrategy

        wrap = kwargs.pop("auto_wrap", None)
        ckpt = kwargs.pop("activation_checkpointing", False)
        if wrap not in (None, "decoder_layers"):
            raise ConfigError(
                "trainer.strategy_kwargs.auto_wrap", wrap, "allowed: decoder_layers, null"
            )
        layers = decoder_layer_classes(net) if (wrap or ckpt) else set()
        if wrap:
            kwargs["auto_wrap_policy"] = layers
        if ckpt:
            kwargs["activation_checkpointing_policy"] = layers
        return FSDPStrategy(**kwargs)
    raise ConfigError(
        "trainer.strategy", name, "with strategy_kwargs allowed: ddp, ddp_spawn, ddp_fork, fsdp"
    )


def fsdp_root(module: Any) -> Any:
    """The FSDP root wrapping a LightningModule, or None when it is not trained under FSDP."""
    trainer = getattr(module, "_trainer", None)
    model = getattr(getattr(trainer, "strategy", None), "model", None)
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - builds without distributed support
        return None
    return model if isinstance(model, FullyShardedDataParallel) else None


def clip_grad_norm(module: Any, params: list[nn.Parameter], max_norm: float) -> float:
    """Clip the total gradient norm to ``max_norm`` (``inf``: no clipping); returns the pre-clip norm."""
    root = fsdp_root(module)
    if root is not None:  # a collective: every process calls it
        return float(root.clip_grad_norm_(max_norm))
    params = [p for p in params if p.grad is not None]
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
