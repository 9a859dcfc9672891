"""Lightning strategies for the RL loop: ``trainer=ddp`` (DDP) and ``trainer=fsdp`` (FSDP2), and the
gradient clipping, rollouts and checkpoints each needs.

``trainer.strategy`` names a Lightning strategy; ``trainer.strategy_kwargs`` are its arguments.

``trainer=fsdp`` is FSDP2 through Lightning's :class:`~lightning.pytorch.strategies.ModelParallelStrategy`
(:class:`FSDP2Strategy`: one data-parallel mesh over every process of every node, no tensor
parallelism). ``DiffusionRLModule.configure_model`` calls :func:`shard`: every decoder layer (the
classes a Hugging Face model lists in ``_no_split_modules``; the embedded model's ``Block``) is
``fully_shard``-ed, then the network itself (the root: embeddings, final norm, head), with a
:class:`~torch.distributed.fsdp.MixedPrecisionPolicy` (``param_dtype``: the dtype the gathered weights
compute in, bf16 on GPUs; ``reduce_dtype``: the dtype gradients are reduced in, fp32). A unit may hold
bf16 frozen weights and fp32 LoRA adapters together (FSDP2 shards each tensor on its own). The keys of
``strategy_kwargs`` for ``fsdp`` are those of :class:`FSDPOptions`.

Under FSDP2:

- **Gradient clipping** is ``torch.nn.utils.clip_grad_norm_`` over the sharded (DTensor) gradients: the
  norm is reduced over every shard, so the pre-clip norm logged is the global one (:func:`clip_grad_norm`).
  Under DDP the gradients are already all-reduced when it runs.
- **Rollouts gather once** (:func:`gathered`): every unit is unsharded (one all-gather each) before the
  sampler's first step and resharded after its last, instead of one all-gather per unit per denoising
  step; the forwards in between communicate nothing, so processes may run different numbers of steps.
- **Checkpoints** hold what trained (``DiffusionRLModule.state_dict_for_checkpoint``: never a frozen
  base or a frozen copy): LoRA adapters, and their optimizer state, in one file gathered on the first
  process; full fine-tuning sharded with ``torch.distributed.checkpoint`` (a folder, one file per
  process; ``state_dict_type: full`` gathers one file instead).
- **Loading scales** (:func:`broadcast_from_first`): only the first process reads the checkpoint's
  weights; the others build the network on the ``meta`` device (no memory), and after sharding each
  receives its shards of every tensor from the first.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from diffusion_rl.core.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
STATE_DICT_TYPES = ("sharded", "full")


@dataclass
class FSDPOptions:
    """``trainer.strategy_kwargs`` of ``trainer=fsdp`` (``conf/trainer/fsdp.yaml`` sets the GPU values)."""

    param_dtype: str | None = None  # the gathered weights' compute dtype (bfloat16 on GPUs); None: their own
    reduce_dtype: str | None = None  # gradients are reduced in this dtype (float32); None: param_dtype
    reshard_after_forward: bool = True  # free a layer's gathered weights after its forward (ZeRO-3)
    state_dict_type: str = "sharded"  # full fine-tuning checkpoints: sharded (one file per process) | full

    def validate(self) -> None:
        for key in ("param_dtype", "reduce_dtype"):
            value = getattr(self, key)
            if value is not None and value not in DTYPES:
                raise ConfigError(f"trainer.strategy_kwargs.{key}", value, f"allowed: {', '.join(DTYPES)}, null")
        if self.state_dict_type not in STATE_DICT_TYPES:
            raise ConfigError("trainer.strategy_kwargs.state_dict_type", self.state_dict_type,
                              f"allowed: {', '.join(STATE_DICT_TYPES)}")

    def mixed_precision(self) -> Any:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dtype = lambda name: DTYPES[name] if name else None  # noqa: E731
        return MixedPrecisionPolicy(param_dtype=dtype(self.param_dtype), reduce_dtype=dtype(self.reduce_dtype))


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's FSDP2 strategy over one data-parallel mesh of all processes (nodes x devices)."""

    def __init__(self, options: FSDPOptions):
        options.validate()
        super().__init__(save_distributed_checkpoint=options.state_dict_type == "sharded")
        self.options = options

    def setup_environment(self) -> None:
        # fully sharded data parallel over every process; Lightning's "auto" would make the
        # processes of a node a tensor-parallel group
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()

    @property
    def data_parallel_mesh(self) -> Any:
        return self.device_mesh["data_parallel"]

    def small_checkpoint(self) -> bool:
        """Whether this checkpoint is a small part of the policy (LoRA adapters): one gathered file."""
        module: Any = self.lightning_module
        return bool(module.checkpoint_is_small())

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """What trained, sharded or gathered (never frozen weights; see the module docstring)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = not self._save_distributed_checkpoint or self.small_checkpoint()
        opts = StateDictOptions(full_state_dict=full, cpu_offload=True, ignore_frozen_params=True)
        assert self.model is not None
        return get_model_state_dict(self.model, options=opts)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """LoRA checkpoints are small: always one file (written atomically by the checkpoint IO); full
        fine-tuning as ``state_dict_type`` says, a sharded folder written beside its final name and
        swapped in, so a kill mid-write leaves the previous one whole."""
        sharded = self._save_distributed_checkpoint
        try:
            self._save_distributed_checkpoint = sharded and not self.small_checkpoint()
            if not self._save_distributed_checkpoint:
                return super().save_checkpoint(checkpoint, filepath, storage_options)
            path = Path(self.broadcast(str(filepath)))
            tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
            if self.is_global_zero:
                shutil.rmtree(tmp, ignore_errors=True)
            self.barrier()
            super().save_checkpoint(checkpoint, tmp, storage_options)
            self.barrier()
            if self.is_global_zero:
                swap_in(tmp, path, old)
            self.barrier()
        finally:
            self._save_distributed_checkpoint = sharded

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        sharded = self._save_distributed_checkpoint
        try:
            self._save_distributed_checkpoint = sharded and not self.small_checkpoint()
            return super().optimizer_state(optimizer)
        finally:
            self._save_distributed_checkpoint = sharded

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's loading, with the frozen weights left as they are (they are not in the checkpoint)."""
        from lightning.fabric.strategies.model_parallel import _is_sharded_checkpoint

        path = Path(self.broadcast(checkpoint_path))
        if not _is_sharded_checkpoint(path):
            return super().load_checkpoint(path, weights_only)  # strict_loading is off: frozen keys may be absent
        return load_sharded(self, path, weights_only)


def swap_in(new: Path, path: Path, old: Path) -> None:
    """Put the folder ``new`` at ``path``: the previous one is renamed aside first and removed last."""
    shutil.rmtree(old, ignore_errors=True)
    if path.is_dir():
        path.rename(old)
    elif path.exists():
        path.unlink()
    new.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def load_sharded(strategy: FSDP2Strategy, path: Any, weights_only: bool | None) -> dict[str, Any]:
    """Restore a ``torch.distributed.checkpoint`` folder written by :meth:`FSDP2Strategy.save_checkpoint`:
    the trainable tensors and the optimizer; returns the rest of the checkpoint (metadata)."""
    from lightning.fabric.strategies.model_parallel import _distributed_checkpoint_load
    from lightning.fabric.utilities.load import _METADATA_FILENAME
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    module = strategy.model
    assert module is not None
    opts = StateDictOptions(ignore_frozen_params=True)
    state = {"state_dict": get_model_state_dict(module, options=opts)}
    _distributed_checkpoint_load(state, path)
    set_model_state_dict(module, state["state_dict"], options=StateDictOptions(strict=False))
    for i, optimizer in enumerate(strategy.optimizers):
        key = f"optimizer_{i}"
        optim_state = {key: get_optimizer_state_dict(module, optimizer)}
        _distributed_checkpoint_load(optim_state, path)
        set_optimizer_state_dict(module, optimizer, optim_state_dict=optim_state[key],
                                 options=StateDictOptions(cpu_offload=True))
    return torch.load(path / _METADATA_FILENAME, weights_only=weights_only)


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
        raise ConfigError("trainer.strategy", "fsdp", f"found no decoder layer of the classes {sorted(names)} in the model")
    return classes


def shard(net: nn.Module, mesh: Any, options: FSDPOptions) -> nn.Module:
    """``fully_shard`` every decoder layer of ``net`` (layers that share weights as one unit), then ``net``
    (the root); in place."""
    from torch.distributed.fsdp import fully_shard

    layers = decoder_layer_classes(net)
    kwargs = {"mesh": mesh, "mp_policy": options.mixed_precision()}
    for unit in sharing_groups([m for m in net.modules() if type(m) in layers]):
        fully_shard(unit if len(unit) > 1 else unit[0], reshard_after_forward=options.reshard_after_forward, **kwargs)
    fully_shard(net, **kwargs)
    return net


def sharing_groups(layers: list[nn.Module]) -> list[list[nn.Module]]:
    """``layers`` grouped so that layers sharing a parameter are in one group, in order of first appearance:
    a parameter is sharded by one FSDP2 unit, so tied layers (DiffusionGemma's encoder layer ``i`` and its
    decoder layer ``i``, one set of weights) are sharded together, each with its experts."""
    owner: dict[int, int] = {}  # parameter id -> group index
    groups: list[list[nn.Module]] = []
    for layer in layers:
        hit = {owner[id(p)] for p in layer.parameters() if id(p) in owner}
        if len(hit) > 1:
            raise ValueError("a layer shares weights with two otherwise separate layers: no FSDP2 unit can hold them")
        g = hit.pop() if hit else len(groups)
        if g == len(groups):
            groups.append([])
        groups[g].append(layer)
        owner.update({id(p): g for p in layer.parameters()})
    return groups


def fsdp_units(net: nn.Module) -> list[nn.Module]:
    """The modules of ``net`` that FSDP2 shards (empty when it is not sharded)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in net.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(net: nn.Module) -> Iterator[None]:
    """Inside the block, every FSDP2 unit of ``net`` holds its whole weights: one all-gather per unit
    on entry, none per forward, one reshard per unit on exit. A no-op for a network that is not sharded.

    Every process must enter it together (the all-gathers are collectives); inside, forwards run
    without communication (inference only: no backward may run inside)."""
    units = fsdp_units(net)
    if not units:
        yield
        return
    root = units[0]
    root._get_fsdp_state()._lazy_init()  # type: ignore[operator]  # FSDP2 fixes its root at the first forward
    inner = [u for u in units if u is not root]
    saved = [all(g.post_forward_mesh_info is not None for g in u._get_fsdp_state()._fsdp_param_groups)  # type: ignore[operator]
             for u in inner]
    for u in inner:
        u.set_reshard_after_forward(False, recurse=False)  # type: ignore[operator]
    for u in units:
        u.unshard()  # type: ignore[operator]
    try:
        yield
    finally:
        for u, was in zip(inner, saved):
            u.set_reshard_after_forward(was, recurse=False)  # type: ignore[operator]
        for u in units:
            u.reshard()  # type: ignore[operator]


def broadcast_from_first(net: nn.Module, full_state: dict[str, torch.Tensor] | None,
                         buffers: dict[str, torch.Tensor] | None, device: torch.device) -> None:
    """After :func:`shard`: allocate ``net``'s shards on ``device`` and fill them from the first process's
    ``full_state`` (its unsharded state dict; ``None`` on the others, whose ``net`` may be on ``meta``),
    buffers likewise (non-persistent ones, such as rotary tables, are not in a state dict)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    net.to_empty(device=device)
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True)
    set_model_state_dict(net, (full_state or {}) if dist.get_rank() == 0 else {}, options=opts)  # type: ignore[arg-type]
    for name, buf in net.named_buffers():
        if dist.get_rank() == 0 and buffers is not None:
            buf.copy_(buffers[name])
        dist.broadcast(buf, src=0)


def make_strategy(name: str, kwargs: dict[str, Any]) -> Any:
    """A Lightning strategy object (or its name when there is nothing to configure)."""
    from diffusion_rl.core.config import from_dict

    if name == "fsdp":
        return FSDP2Strategy(from_dict(FSDPOptions, kwargs, "trainer.strategy_kwargs"))
    if not kwargs:
        return name
    if name.startswith("ddp"):
        from lightning.pytorch.strategies import DDPStrategy

        start = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork"}.get(name)
        if start is not None:
            return DDPStrategy(start_method=start, **kwargs)  # type: ignore[arg-type]  # one of the literals
    raise ConfigError("trainer.strategy", name, "with strategy_kwargs allowed: ddp, ddp_spawn, ddp_fork, fsdp")


def is_fsdp(strategy: Any) -> bool:
    """Whether the trainer shards the policy (``trainer=fsdp``)."""
    return isinstance(strategy, FSDP2Strategy)


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """Clip the total gradient norm to ``max_norm`` (``inf``: no clipping); returns the pre-clip norm.

    With FSDP2 the gradients are sharded DTensors and the norm is reduced over all shards (a
    collective: every process calls it)."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    full = getattr(norm, "full_tensor", None)
    return float(full() if full is not None else norm)
