"""The embedded diffusion LM: a small Llama-style transformer without a causal mask.

RMSNorm, rotary positions, SwiGLU and SDPA attention, like LLaDA at a scale that trains on two CPU
cores. ``block_size > 0`` makes attention block-causal (bidirectional inside a block, causal across
blocks) for SDAR-style block diffusion; blocks are counted from the first position of the input, so
a caller that wants the completion to start a block left-pads the prompt to whole blocks. The call
signature matches a Hugging Face model:
``model(input_ids=..., attention_mask=..., position_ids=...).logits``; ``attention_mask`` is either
a ``(B, L)`` padding mask or a boolean ``(B|1, 1, L, L)`` "may attend" mask.

Key/value cache (block diffusion sampling): ``use_cache=True`` returns ``past_key_values``, one
``(k, v)`` pair per layer, each ``(B, H, S, Dh)`` with rotary positions already applied; passing them
back as ``past_key_values`` makes the new ``input_ids`` (B, L) attend to the cached ``S`` keys and to
themselves, as if the whole ``S + L`` sequence had been fed (exact where the cached tokens never
attend to the new ones, i.e. for finished blocks of a block-causal model). With a cache, a 2D
``attention_mask`` covers the cached and the new tokens, ``(B, S + L)``, and a 4D one is
``(B|1, 1, L, S + L)``, as in Hugging Face models. The cache is never modified in place. Without
``block_size`` the cached keys may come in any order (a prefix and a suffix around the new tokens:
``sampler.kv_cache=dual``) when ``position_ids`` of the new tokens are passed (``KVCacheLM`` in
``policy.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from diffusion_rl.models.heads import HeadOutput, head_outputs
from diffusion_rl.models.policy import MODELS, KVCache, ModelConfig, PolicyBundle
from diffusion_rl.models.tokenizer import CharTokenizer


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
    # small embeddings: at unit scale the model sits at chance (docs/methods.md §8)
    init_std: float = 0.02
    learned_positions: bool = False  # add learned absolute position embeddings to rotary ones


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).type_as(x) * self.weight


def rotary_table(pos: torch.Tensor, head_dim: int, base: float) -> torch.Tensor:
    """Unit complex numbers ``exp(i * pos * base^(-2j/D))``, (B, 1, L, D/2) complex64: computed once
    per forward and shared by every layer's queries and keys."""
    freqs = base ** (-torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim)  # (D/2,)
    ang = pos.float()[:, None, :, None] * freqs  # (B, 1, L, D/2)
    return torch.polar(torch.ones_like(ang), ang)


def rotary(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of channels ``(x[2j], x[2j+1])`` of ``x`` (B, H, L, D) by the angles of ``table``
    (:func:`rotary_table`): one complex multiply, in fp32, cast back to ``x``'s dtype."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))  # (B, H, L, D/2)
    return torch.view_as_real(pairs * table).flatten(-2).type_as(x)


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        d, hidden = cfg.d_model, int(cfg.ffn_mult * cfg.d_model) // 8 * 8
        self.n_heads = cfg.n_heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, mask: torch.Tensor | None,
                past: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """-> (new x (B, L, D), this layer's keys/values over cached + new tokens (B, H, S + L, Dh))."""
        B, L, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, L, 3, self.n_heads, D // self.n_heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, L, Dh)
        q, k = rotary(q, rope), rotary(k, rope)  # rope: rotary_table(...) of the new tokens' positions
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)  # (B, H, S + L, Dh)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, L, Dh)
        x = x + self.proj(att.transpose(1, 2).reshape(B, L, D))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up), (k, v)


def block_causal_mask(length: int, block_size: int, device=None, past: int = 0) -> torch.Tensor:
    """Boolean (L - past, L): query i (at index past + i) may attend key j iff block(j) <= block(i)."""
    blk = torch.arange(length, device=device) // block_size
    return blk[None, :] <= blk[past:, None]


class TinyDiffusionLM(nn.Module):
    """Bidirectional (or block-causal) transformer mapping ids (B, L) to logits (B, L, V)."""

    supports_kv_cache = True  # the block sampler may cache finished blocks (see the module docstring)
    kv_cache_any_order = True  # sampler.kv_cache=dual: cached keys in any order, explicit positions (KVCacheLM)

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
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        keep: slice | None = None,
        targets: torch.Tensor | None = None,
        select: torch.Tensor | None = None,
    ) -> HeadOutput:
        """``.logits`` (B, L, V) fp32, or at ``keep`` only, or ``.token_logps`` of ``targets`` (models/heads.py)."""
        B, L = input_ids.shape
        past = 0 if past_key_values is None else past_key_values[0][0].shape[-2]
        S = past + L  # keys: cached then new
        dev = input_ids.device
        mask = None
        if attention_mask is not None and attention_mask.dim() == 2:
            real = attention_mask.bool()  # (B, S) padding mask over cached and new tokens
            if real.shape[-1] != S:
                raise ValueError(f"2D attention_mask covers {real.shape[-1]} tokens; expected cached + new = {S}")
            if position_ids is None:
                position_ids = (real.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
            mask = real[:, None, None, :]  # (B, 1, 1, S)
        elif attention_mask is not None:
            mask = attention_mask.bool()  # (B|1, 1, L, S)
        if self.config.block_size > 0 and (attention_mask is None or attention_mask.dim() == 2):
            bc = block_causal_mask(S, self.config.block_size, dev, past)[None, None]  # (1, 1, L, S)
            mask = bc if mask is None else (mask & bc)
            if attention_mask is not None:  # a query always sees itself: a block of padding alone
                mask = mask | (torch.arange(S, device=dev) == torch.arange(past, S, device=dev)[:, None])  # has no key
        if position_ids is None:
            position_ids = torch.arange(past, S, device=dev).expand(B, L)
        if mask is not None and mask.shape[0] == 1 and mask.shape[-2] == 1:
            mask = None if bool(mask.all()) else mask
        x = self.embed(input_ids)  # (B, L, D)
        if self.pos_embed is not None:
            x = x + self.pos_embed(position_ids.clamp(max=self.config.max_len - 1))
        rope = rotary_table(position_ids, self.config.d_model // self.config.n_heads, self.config.rope_base)
        cache: KVCache = []
        for i, blk in enumerate(self.blocks):
            x, kv = blk(x, rope, mask, None if past_key_values is None else past_key_values[i])
            if use_cache:  # else each layer's keys and values are freed as soon as it is done
                cache.append(kv)
        out = head_outputs(self.norm(x), self.head, keep, targets, select)
        out.logits = None if out.logits is None else out.logits.float()
        out.past_key_values = cache if use_cache else None
        return out


@MODELS.register("tiny")
def build_tiny(cfg: ModelConfig) -> PolicyBundle:
    tok = CharTokenizer()
    net = TinyDiffusionLM(
        TinyConfig(
            vocab_size=tok.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
            ffn_mult=cfg.ffn_mult, max_len=cfg.max_len, block_size=cfg.block_size,
            learned_positions=cfg.learned_positions,
        )
    )
    return PolicyBundle(net, tok, tok.mask_token_id, tok.eos_token_id, tok.pad_token_id, cfg.block_size,
                        cfg.custom_attention_mask)
