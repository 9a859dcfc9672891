"""LLaDA (LLaDA-8B-Base / -Instruct, LLaDA-1.5): our implementation, loading the released weights.

Facts (docs/methods.md §9, checked against the released ``modeling_llada.py`` /
``configuration_llada.py`` and
``config.json``): ``model_type: llada``; a bidirectional Llama-style encoder under OLMo-style names
``model.transformer.{wte, blocks.{i}.{attn_norm, q_proj, k_proj, v_proj, attn_out, ff_norm, ff_proj,
up_proj, ff_out}, ln_f, ff_out}``; no biases; RMSNorm (eps ``rms_norm_eps``, normalised in fp32, cast
back, then scaled); rotate-half RoPE with ``rope_theta`` 500000 applied to q and k in fp32
(``rope_full_precision``); block ``h = x + attn_out(attn(attn_norm(x)))``, ``out = h +
ff_out(silu(ff_proj(n)) * up_proj(n))``, ``n = ff_norm(h)`` (SiLU gates ``ff_proj``); untied head
``transformer.ff_out`` over ``embedding_size`` logits; mask token 126336.

The released forward ignores any attention mask: every token attends over padding too and positions
are ``0 .. L-1`` whatever the padding (that is how the model was trained). That is the default here
(``config.mask_padding = False``, our field); ``model.attention=bidirectional`` sets it True: padded
keys masked, positions skipping left padding. Boolean 4D masks and explicit position ids are always
honoured (the released code has no such path; our estimators only pass them where asked to).

Config values the released checkpoints do not use (other block types, LayerNorm, ALiBi, q/k norms,
tied or scaled logits, block groups) fail in one line rather than running something else.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedConfig
from transformers.modeling_layers import GradientCheckpointingLayer

from diffusion_rl.models.layers import KV, RMSNorm, apply_rope, attend
from diffusion_rl.models.native import NativeLM, register_native, unsupported


class LLaDAConfig(PreTrainedConfig):
    """The fields of the released ``config.json`` that the forward reads; defaults are LLaDA-8B's.

    Other released fields (``init_fn``, ``precision``, dropouts, ...) are kept as given.
    """

    model_type = "llada"

    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int | None = 32
    multi_query_attention: bool | None = None
    n_layers: int = 32
    mlp_ratio: int = 4
    mlp_hidden_size: int | None = 12288
    vocab_size: int = 126464
    embedding_size: int | None = 126464
    max_sequence_length: int = 4096
    rms_norm_eps: float = 1e-5
    rope: bool = True
    rope_theta: float = 500000.0
    rope_full_precision: bool = True
    include_bias: bool = False
    include_qkv_bias: bool = False
    weight_tying: bool = False
    activation_type: str = "silu"
    block_type: str = "llama"
    layer_norm_type: str = "rms"
    layer_norm_with_affine: bool = True
    bias_for_layer_norm: bool | None = False
    attention_layer_norm: bool = False
    alibi: bool = False
    scale_logits: bool = False
    input_emb_norm: bool = False
    block_group_size: int = 1
    init_std: float = 0.02
    mask_token_id: int | None = 126336
    eos_token_id: int | None = 126081
    pad_token_id: int | None = 126081
    use_cache: bool = False
    mask_padding: bool = False  # ours: False = the released forward (attends over padding)


class LLaDABlock(GradientCheckpointingLayer):
    """One LLaDA "llama" block under the released names; ``block(x, cos, sin, mask, past)``."""

    _can_checkpoint_with_cache = True  # reads the cache, writes nothing in place

    def __init__(self, config: LLaDAConfig):
        super().__init__()
        d = config.d_model
        self.heads = config.n_heads
        self.kv_heads = 1 if config.multi_query_attention else (config.n_kv_heads or config.n_heads)
        self.head_dim = d // config.n_heads
        self.full_precision = config.rope_full_precision
        hidden = config.mlp_hidden_size or config.mlp_ratio * d
        bias = config.include_qkv_bias
        self.attn_norm = RMSNorm(d, config.rms_norm_eps)
        self.q_proj = nn.Linear(d, d, bias=bias)
        self.k_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=bias)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_norm = RMSNorm(d, config.rms_norm_eps)
        self.ff_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.ff_out = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                past: KV | None = None) -> tuple[torch.Tensor, KV]:
        B, L, D = x.shape
        n = self.attn_norm(x)
        q = self.q_proj(n).view(B, L, self.heads, self.head_dim).transpose(1, 2)  # (B, H, L, Dh)
        k = self.k_proj(n).view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, H_kv, L, Dh)
        v = self.v_proj(n).view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin, self.full_precision), apply_rope(k, cos, sin, self.full_precision)
        att, kv = attend(q, k, v, mask, past)  # (B, L, D)
        h = x + self.attn_out(att)
        n = self.ff_norm(h)
        return h + self.ff_out(F.silu(self.ff_proj(n)) * self.up_proj(n)), kv


class LLaDAModel(nn.Module):
    """Holds ``transformer`` = {wte, blocks, ln_f, ff_out}, the released module tree."""

    def __init__(self, config: LLaDAConfig):
        super().__init__()
        vocab = config.embedding_size or config.vocab_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, config.d_model),
            blocks=nn.ModuleList(LLaDABlock(config) for _ in range(config.n_layers)),
            ln_f=RMSNorm(config.d_model, config.rms_norm_eps),
            ff_out=nn.Linear(config.d_model, vocab, bias=False),
        ))


@register_native(LLaDAConfig, "AutoModelForCausalLM")  # the released auto_map lists AutoModel and this
class LLaDAModelLM(NativeLM):
    """LLaDA under its released class name; ``forward(...).logits`` (B, L, embedding_size)."""

    config_class = LLaDAConfig
    _no_split_modules = ["LLaDABlock"]
    tokenizer_fallback = "PreTrainedTokenizerFast"

    def __init__(self, config: LLaDAConfig):
        super().__init__(config)
        unsupported(config, {
            "block_type": (config.block_type, "llama"), "layer_norm_type": (config.layer_norm_type, "rms"),
            "activation_type": (config.activation_type, "silu"), "rope": (config.rope, True),
            "alibi": (config.alibi, False), "attention_layer_norm": (config.attention_layer_norm, False),
            "include_bias": (config.include_bias, False), "weight_tying": (config.weight_tying, False),
            "scale_logits": (config.scale_logits, False), "input_emb_norm": (config.input_emb_norm, False),
            "block_group_size": (config.block_group_size, 1),
            "layer_norm_with_affine": (config.layer_norm_with_affine, True),
            "bias_for_layer_norm": (bool(config.bias_for_layer_norm), False),
        })
        self.head_dim = config.d_model // config.n_heads
        self.rope_theta = config.rope_theta
        self.model = LLaDAModel(config)
        self.post_init()

    @property
    def mask_padding(self) -> bool:
        return bool(self.config.mask_padding)

    def decoder_layers(self) -> nn.ModuleList:
        return self.model.transformer.blocks  # type: ignore[return-value]

    def final_norm(self) -> nn.Module:
        return self.model.transformer.ln_f

    def get_input_embeddings(self) -> nn.Module:
        return self.model.transformer.wte

    def get_output_embeddings(self) -> nn.Module:
        return self.model.transformer.ff_out
