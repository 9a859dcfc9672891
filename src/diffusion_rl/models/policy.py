"""The policy interface the rest of the code sees, and the registry of model builders.

A :class:`PolicyBundle` holds a network whose call ``net(input_ids=..., attention_mask=...)``
returns an object with ``.logits`` (what the embedded model and Hugging Face diffusion LMs such as
LLaDA both satisfy), its tokenizer, and the special ids the sampler needs. Nothing downstream knows
which network it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from diffusion_rl.errors import ConfigError
from diffusion_rl.registry import Registry

MODELS: Registry[Callable[[ModelConfig], PolicyBundle]] = Registry("model.name")


@dataclass
class ModelConfig:
    name: str = "tiny"
    # embedded model
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    ffn_mult: float = 2.75
    max_len: int = 512
    block_size: int = 0  # >0: block diffusion (block-causal attention)
    learned_positions: bool = True  # learned absolute positions on top of rotary ones
    # Hugging Face models (later issue): path or hub id and special ids
    path: str | None = None
    mask_token_id: int | None = None
    eos_token_id: int | None = None
    trust_remote_code: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        for key in ("d_model", "n_layers", "n_heads", "max_len"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key}", getattr(self, key), "must be >= 1")
        if self.d_model % self.n_heads:
            raise ConfigError("model.d_model", self.d_model, f"must be divisible by model.n_heads={self.n_heads}")
        if self.block_size < 0:
            raise ConfigError("model.block_size", self.block_size, "must be >= 0 (0 = full attention)")


@dataclass
class PolicyBundle:
    net: nn.Module
    tokenizer: Any
    mask_token_id: int
    eos_token_id: int
    pad_token_id: int
    block_size: int = 0


def logits_fn(net: nn.Module) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
    """Adapt a network to ``(ids, attention_mask) -> logits (B, T, V)`` float32."""

    def forward(ids: torch.Tensor, attn: torch.Tensor | None) -> torch.Tensor:
        out = net(input_ids=ids, attention_mask=attn)
        return out.logits.float()

    return forward


@MODELS.register("tiny")
def build_tiny(cfg: ModelConfig) -> PolicyBundle:
    from diffusion_rl.models.tiny import TinyConfig, TinyDiffusionLM
    from diffusion_rl.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    net = TinyDiffusionLM(
        TinyConfig(
            vocab_size=tok.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
            ffn_mult=cfg.ffn_mult, max_len=cfg.max_len, block_size=cfg.block_size,
            learned_positions=cfg.learned_positions,
        )
    )
    return PolicyBundle(net, tok, tok.mask_token_id, tok.eos_token_id, tok.pad_token_id, cfg.block_size)


def build_policy(cfg: ModelConfig) -> PolicyBundle:
    cfg.validate()
    return MODELS.get(cfg.name)(cfg)


def encode_prompts(tokenizer, prompts: list[str], device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask, (B, P) each."""
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(prompts, padding=True, add_special_tokens=False, return_tensors="pt")
    finally:
        tokenizer.padding_side = old_side
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)
