"""The embedded diffusion LM: a small Llama-style transformer without a causal mask.

RMSNorm, rotary positions, SwiGLU and SDPA attention, like LLaDA at a scale that trains on two CPU
cores. ``block_size > 0`` makes attention block-causal (bidirectional inside a block, causal across
blocks) for SDAR-style block diffusion. The call signature matches a Hugging Face model:
``model(input_ids=..., attention_mask=..., position_ids=...).logits``; ``attention_mask`` is either
a ``(B, L)`` padding mask or a boolean ``(B|1, 1, L, L)`` "may attend" mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class TinyConfig:
    vocab_size: int = 102
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    ffn_mult: float = 2.75  # SwiGLU hidden = ffn_mult * d_model, rounded to a multiple of 8
    max_len: int = 512
    block_size: int = 0  # 0: full bidirectional attention; >0: block-causal
    rope_base: float = 10000.0
    init_std: float = 0.02  # small embeddings: at unit scale the model sits at chance (SPEC §8)
    learned_positions: bool = False  # add learned absolute position embeddings to rotary ones


@dataclass
class TinyOutput:
    logits: torch.Tensor  # (B, L, V)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).type_as(x) * self.weight


def rotary(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate pairs of channels of ``x`` (B, H, L, D) by angles ``pos`` (B, L) x frequency."""
    d = x.shape[-1]
    freqs = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)  # (D/2,)
    ang = pos.float()[:, None, :, None] * freqs  # (B, 1, L, D/2)
    cos, sin = ang.cos().type_as(x), ang.sin().type_as(x)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        d, hidden = cfg.d_model, int(cfg.ffn_mult * cfg.d_model) // 8 * 8
        self.n_heads, self.rope_base = cfg.n_heads, cfg.rope_base
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, L, 3, self.n_heads, D // self.n_heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, L, Dh)
        q, k = rotary(q, pos, self.rope_base), rotary(k, pos, self.rope_base)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, L, Dh)
        x = x + self.proj(att.transpose(1, 2).reshape(B, L, D))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def block_causal_mask(length: int, block_size: int, device=None) -> torch.Tensor:
    """Boolean (L, L): query i may attend key j iff block(j) <= block(i)."""
    blk = torch.arange(length, device=device) // block_size
    return blk[None, :] <= blk[:, None]


class TinyDiffusionLM(nn.Module):
    """Bidirectional (or block-causal) transformer mapping ids (B, L) to logits (B, L, V)."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model={cfg.d_model} must be divisible by n_heads={cfg.n_heads}")
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_embed = nn.Embedding(cfg.max_len, cfg.d_model) if cfg.learned_positions else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)

    def _init(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=self.config.init_std)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> TinyOutput:
        B, L = input_ids.shape
        mask = None
        if attention_mask is not None and attention_mask.dim() == 2:
            keep = attention_mask.bool()  # (B, L) padding mask
            if position_ids is None:
                position_ids = (keep.long().cumsum(-1) - 1).clamp(min=0)
            mask = keep[:, None, None, :]  # (B, 1, 1, L)
        elif attention_mask is not None:
            mask = attention_mask.bool()  # (B|1, 1, L, L)
        if self.config.block_size > 0 and (attention_mask is None or attention_mask.dim() == 2):
            bc = block_causal_mask(L, self.config.block_size, input_ids.device)[None, None]
            mask = bc if mask is None else (mask & bc)
        if position_ids is None:
            position_ids = torch.arange(L, device=input_ids.device).expand(B, L)
        if mask is not None and mask.shape[0] == 1 and mask.shape[-2] == 1:
            mask = None if bool(mask.all()) else mask
        x = self.embed(input_ids)  # (B, L, D)
        if self.pos_embed is not None:
            x = x + self.pos_embed(position_ids.clamp(max=self.config.max_len - 1))
        for blk in self.blocks:
            x = blk(x, position_ids, mask)
        return TinyOutput(logits=self.head(self.norm(x)).float())
