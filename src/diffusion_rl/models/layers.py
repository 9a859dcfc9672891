"""Pieces the native LLaDA, Dream and SDAR models share: rotary positions, attention over a
key/value cache, the masks and positions of one forward, and the Qwen-style decoder layer.

Written once here, used by ``llada.py``, ``dream.py`` and ``sdar.py`` (docs/methods.md §9 lists the
facts):

- RoPE is the rotate-half variant with ``inv_freq = 1 / theta ** (2i / head_dim)``; the angles are
  computed in fp32 from explicit position ids (so left padding, block models and caches all go
  through one code path). LLaDA applies the rotation in fp32 (``rope_full_precision``); the Qwen
  family casts cos / sin to the activation dtype first. Both are offered; in fp32 they agree.
- :func:`attend` is SDPA over ``[cache ; new]`` keys with grouped-query heads; it returns this
  layer's keys/values (rotary applied, kv heads not repeated) for the caller to cache. The cache
  convention is the embedded model's (``models/tiny.py``): ``past_key_values`` is one ``(k, v)``
  pair per layer, each ``(B, H_kv, S, Dh)``, never modified in place.
- :func:`attention_inputs` turns what the policy interface passes (a ``(B, S)`` padding mask, a
  boolean ``(B|1, 1, L, S)`` "may attend" mask or nothing; position ids or not) into the boolean
  mask and position ids of one forward, bidirectional or block-causal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from diffusion_rl.models.tiny import RMSNorm, block_causal_mask

__all__ = ["RMSNorm", "rope_tables", "apply_rope", "attend", "attention_inputs", "QwenDecoderLayer"]

KV = tuple[torch.Tensor, torch.Tensor]


def rope_tables(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(cos, sin)``, each ``(B, 1, L, Dh)``, of the rotate-half RoPE at ``position_ids`` (B, L)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32)
                               / head_dim)  # (Dh/2,)
    ang = position_ids.float()[:, None, :, None] * inv_freq  # (B, 1, L, Dh/2)
    ang = torch.cat([ang, ang], dim=-1)  # (B, 1, L, Dh)
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, full_precision: bool) -> torch.Tensor:
    """Rotate ``x`` (B, H, L, Dh): in fp32 then cast back (LLaDA), or in ``x``'s dtype (Qwen family)."""
    dtype = x.dtype
    if full_precision:
        x = x.float()
    else:
        cos, sin = cos.to(dtype), sin.to(dtype)
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)  # rotate half
    return (x * cos + rotated * sin).to(dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           past: KV | None) -> tuple[torch.Tensor, KV]:
    """Attention of queries (B, H, L, Dh) over cached + new keys/values (B, H_kv, ., Dh).

    -> output (B, L, H * Dh) and this layer's keys/values over cached + new tokens (B, H_kv, S, Dh).
    ``mask``: boolean (B|1, 1, L, S), True = may attend, or None (every key).
    """
    if past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, H_kv, S, Dh)
    B, H, L, Dh = q.shape
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != H)  # (B, H, L, Dh)
    return out.transpose(1, 2).reshape(B, L, H * Dh), (k, v)


def attention_inputs(attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
                     batch: int, length: int, past: int, device: torch.device, *, block_size: int = 0,
                     mask_padding: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The boolean mask (B|1, 1, L, S) or None and the position ids (B, L) of one forward.

    ``L`` new tokens follow ``past`` cached ones (``S = past + L`` keys). ``attention_mask``:

    - ``(B, S)`` padding mask (1 = real token): padded keys are masked and positions skip left
      padding (``cumsum - 1``), unless ``mask_padding`` is False (LLaDA as released: padding is
      attended and positions count it).
    - boolean ``(B|1, 1, L, S)``: used as given ("may attend"); positions are the caller's or
      ``past .. S - 1``.
    - None: every key, positions ``past .. S - 1``.

    ``block_size > 0`` adds the block-causal mask (blocks counted from the first cached position)
    unless the caller gave a 4D mask. Wherever a padding mask is applied a query also sees itself,
    so no row is empty (a block of padding alone has no other key): padding outputs change, real
    ones do not.
    """
    S = past + length
    mask: torch.Tensor | None = None
    if attention_mask is not None and attention_mask.dim() == 4:
        if attention_mask.dtype != torch.bool:
            raise ValueError(f"a 4D attention_mask must be boolean (True = may attend), got {attention_mask.dtype}")
        if tuple(attention_mask.shape[-2:]) != (length, S):
            raise ValueError(f"4D attention_mask covers {tuple(attention_mask.shape[-2:])}; expected ({length}, {S})")
        mask = attention_mask
    else:
        padded = attention_mask is not None and mask_padding
        if attention_mask is not None and attention_mask.shape[-1] != S:
            raise ValueError(f"2D attention_mask covers {attention_mask.shape[-1]} tokens; expected cached + new = {S}")
        if padded:
            keep = attention_mask.bool()  # type: ignore[union-attr]  # (B, S)
            if position_ids is None:
                position_ids = (keep.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # (B, L)
            if not bool(keep.all()):
                mask = keep[:, None, None, :]  # (B, 1, 1, S)
        if block_size > 0:
            causal = block_causal_mask(S, block_size, device, past)[None, None]  # (1, 1, L, S)
            mask = causal if mask is None else mask & causal
        if padded and mask is not None:
            mask = mask | (torch.arange(S, device=device) == torch.arange(past, S, device=device)[:, None])
    if position_ids is None:
        position_ids = torch.arange(past, S, device=device).expand(batch, length)
    return mask, position_ids


class QwenAttention(nn.Module):
    """Qwen2 / Qwen3 self-attention under their key names: ``q_proj, k_proj, v_proj, o_proj``
    (q/k/v biases for Qwen2 = Dream) and, for Qwen3 = SDAR, per-head ``q_norm``/``k_norm`` before RoPE."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, *, qkv_bias: bool,
                 qk_norm: bool, eps: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                past: KV | None) -> tuple[torch.Tensor, KV]:
        B, L, _ = x.shape
        q = self.q_proj(x).view(B, L, self.heads, self.head_dim)  # (B, L, H, Dh)
        k = self.k_proj(x).view(B, L, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, H_kv, L, Dh)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin, full_precision=False)  # (B, H, L, Dh)
        k = apply_rope(k.transpose(1, 2), cos, sin, full_precision=False)  # (B, H_kv, L, Dh)
        out, kv = attend(q, k, v, mask, past)
        return self.o_proj(out), kv


class QwenMLP(nn.Module):
    """SwiGLU under Qwen's names: ``down_proj(silu(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class QwenDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm decoder layer (Dream = Qwen2, SDAR = Qwen3): ``input_layernorm``, ``self_attn``,
    ``post_attention_layernorm``, ``mlp``. Called as ``layer(x, cos, sin, mask, past)``."""

    _can_checkpoint_with_cache = True  # it reads the cache and returns new keys; nothing is written in place

    def __init__(self, config, *, qkv_bias: bool, qk_norm: bool):
        super().__init__()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.self_attn = QwenAttention(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                                       head_dim, qkv_bias=qkv_bias, qk_norm=qk_norm, eps=config.rms_norm_eps)
        self.mlp = QwenMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                past: KV | None = None) -> tuple[torch.Tensor, KV]:
        h, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, past)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), kv
