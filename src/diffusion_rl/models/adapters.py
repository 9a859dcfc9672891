"""Training options that apply to any policy network: dtype, activation checkpointing, LoRA (peft).

- ``model.dtype`` casts the weights (Hugging Face models are loaded in it directly). Mixed precision
  is the trainer's business: ``trainer.precision=bf16-mixed`` (``conf/trainer/gpu.yaml``).
- ``model.gradient_checkpointing`` recomputes each decoder layer in backward: a Hugging Face model's
  own ``gradient_checkpointing_enable`` where it has one, else PyTorch's non-reentrant checkpoint
  wrapper around the decoder layer classes (``_no_split_modules``; the embedded model's ``Block``).
- ``model.lora_r > 0`` wraps the network in a ``peft`` LoRA model (``r``, ``lora_alpha``,
  ``lora_dropout`` on ``model.lora_targets``; the papers: r = 128, alpha = 64, dropout 0.05 on the
  attention and MLP projections). Only the adapters train. The reference policy is then the base
  model with the adapters switched off (:func:`reference_logits_fn`), so ``beta > 0`` costs no copy.

``peft`` is an optional dependency (``pip install 'diffusion-rl[hf]'``); asking for LoRA without it
fails in one line.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.policy import DTYPES, ModelConfig, PolicyForward


def prepare_for_training(net: nn.Module, cfg: ModelConfig) -> nn.Module:
    """Apply ``model.dtype``, ``model.gradient_checkpointing`` and LoRA; returns the network to train."""
    if not cfg.load_in_4bit:  # quantised weights keep their storage dtype
        net = net.to(DTYPES[cfg.dtype])
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(net)
    if cfg.lora_r > 0:
        net = add_lora(net, cfg)
    return net


def decoder_layer_names(net: nn.Module) -> set[str]:
    names: set[str] = set()
    for m in net.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return names or {"Block"}  # the embedded model's transformer block


def enable_activation_checkpointing(net: nn.Module) -> None:
    hf = next(
        (m for m in net.modules() if getattr(m, "supports_gradient_checkpointing", False)), None
    )
    if hf is not None:
        kwargs = {"use_reentrant": False}
        # transformers >= 5 renamed it (the old name is deprecated)
        enable: Any = getattr(hf, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            enable = hf.gradient_checkpointing_enable
            enable(gradient_checkpointing_kwargs=kwargs)
        config = getattr(hf, "config", None)
        if getattr(config, "use_cache", False):
            config.use_cache = False  # type: ignore[union-attr]
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    names = decoder_layer_names(net)
    if not any(type(m).__name__ in names for m in net.modules()):
        raise ConfigError(
            "model.gradient_checkpointing",
            True,
            f"found no decoder layer ({sorted(names)}) to checkpoint",
        )
    apply_activation_checkpointing(net, check_fn=lambda m: type(m).__name__ in names)


def add_lora(net: nn.Module, cfg: ModelConfig) -> nn.Module:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise ConfigError(
            "model.lora_r",
            cfg.lora_r,
            "LoRA needs peft: pip install 'diffusion-rl[hf]' (or 0 = full fine-tuning)",
        ) from err
    if cfg.load_in_4bit:
        from peft import prepare_model_for_kbit_training

        net = prepare_model_for_kbit_training(
            net, use_gradient_checkpointing=cfg.gradient_checkpointing
        )
    lora = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=cfg.lora_targets,
        bias="none",
    )
    try:
        wrapped = get_peft_model(net, lora)
    except ValueError as err:  # no module matched
        names = sorted(
            {n.rsplit(".", 1)[-1] for n, m in net.named_modules() if isinstance(m, nn.Linear)}
        )
        raise ConfigError(
            "model.lora_targets",
            cfg.lora_targets,
            f"matched no module ({str(err).splitlines()[0][:120]}); linear layers here: {', '.join(names)}",
        ) from err
    tie = getattr(net, "tie_adapters", None)  # a network whose modules share weights shares their adapters too
    if callable(tie):
        tie()
    return wrapped


def has_adapter(net: nn.Module) -> bool:
    """Whether ``net`` carries LoRA adapters that can be switched off (a peft model)."""
    return callable(getattr(type(net), "disable_adapter", None))


class ReferenceForward(PolicyForward):
    """The base model under a LoRA policy: :class:`PolicyForward` with the adapters switched off.

    Every module leaves in the training mode it came in with. peft (0.22) sets an adapter's dropout to its
    layer's mode when it switches the adapter back on, which undid ``dropout_disabled`` halfway through an
    update: the policy's forward ran without LoRA dropout, the recomputation of its checkpointed layers in
    the backward with it, and torch's checkpoint refused the mismatch."""

    def run(self, **kwargs: Any) -> Any:
        modes = [(m, m.training) for m in self.net.modules()]
        try:
            with self.net.disable_adapter():  # type: ignore[operator]
                return self.net(**kwargs)
        finally:
            for m, training in modes:
                m.training = training


def reference_logits_fn(net: nn.Module) -> PolicyForward:
    """The base model under a LoRA policy, as the estimators call it (adapters off)."""
    return ReferenceForward(net)
