"""Dream (Dream-v0-Base / -Instruct-7B, DiffuCoder): our implementation, loading the released weights.

Facts (docs/methods.md §9, checked against the released ``modeling_dream.py``,
``generation_utils.py``,
``tokenization_dream.py`` and ``config.json``): ``model_type: Dream``; Qwen2.5 under Qwen2's key names
(``model.embed_tokens``, ``model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
post_attention_layernorm, mlp.{gate,up,down}_proj}``, ``model.norm``, ``lm_head``); biases on q/k/v
only; RMSNorm eps 1e-6; RoPE theta 1e6 (rotate-half, cos/sin cast to the activation dtype); no causal
mask. Padding, as the released sampler passes it: a boolean 4D mask that is the outer AND of the
padding mask, and ``position_ids = cumsum(mask) - 1`` (here: padded keys masked, positions skip left
padding; padding queries see themselves instead of nothing, which changes only their own outputs).

**Shifted logits**: the model's output at ``i - 1`` predicts the token at ``i`` (the released sampler
does ``cat([logits[:, :1], logits[:, :-1]], 1)``). This class returns the raw output, as the released
one; :class:`~diffusion_rl.models.native.NativeDiffusionLM` (the policy's network) applies the shift,
so samplers and estimators never see it. ``logits_shift = 1`` says so.

The tokenizer ships as code (``tokenization_dream.DreamTokenizer``, Qwen2's byte-level BPE with NFC
normalisation): the same files load with transformers' ``Qwen2Tokenizer``, never running that code.
"""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedConfig

from diffusion_rl.models.layers import QwenDecoderLayer, RMSNorm
from diffusion_rl.models.native import NativeLM, register_native, unsupported


class QwenConfig(PreTrainedConfig):
    """The Qwen2 / Qwen3 ``config.json`` fields Dream and SDAR share; defaults are Dream-v0-Instruct-7B's."""

    vocab_size: int = 152064
    hidden_size: int = 3584
    intermediate_size: int = 18944
    num_hidden_layers: int = 28
    num_attention_heads: int = 28
    num_key_value_heads: int = 4
    hidden_act: str = "silu"
    max_position_embeddings: int = 131072
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    tie_word_embeddings: bool = False
    use_sliding_window: bool = False
    sliding_window: int | None = None
    max_window_layers: int | None = 28
    attention_dropout: float = 0.0
    use_cache: bool = False
    mask_token_id: int | None = 151666
    pad_token_id: int | None = 151643
    bos_token_id: int | None = 151643
    eos_token_id: int | None = 151643


class DreamConfig(QwenConfig):
    """Dream's ``config.json`` (``model_type: Dream``)."""

    model_type = "Dream"


class QwenBody(nn.Module):
    """``embed_tokens``, ``layers``, ``norm``: the ``model.`` part of Qwen-style checkpoints."""

    def __init__(self, config, *, qkv_bias: bool, qk_norm: bool):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(QwenDecoderLayer(config, qkv_bias=qkv_bias, qk_norm=qk_norm)
                                    for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class QwenStyleLM(NativeLM):
    """``model`` = :class:`QwenBody`, ``lm_head``; tied to the embeddings when the config says so."""

    _no_split_modules = ["QwenDecoderLayer"]
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    tokenizer_fallback = "Qwen2Tokenizer"
    qkv_bias = False
    qk_norm = False

    def __init__(self, config):
        super().__init__(config)
        rope = getattr(config, "rope_parameters", None) or {}
        unsupported(config, {"hidden_act": (config.hidden_act, "silu"),
                             "use_sliding_window": (bool(config.use_sliding_window), False),
                             "rope_scaling": (rope.get("rope_type", "default"), "default")})
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.rope_theta = config.rope_theta
        self.model = QwenBody(config, qkv_bias=self.qkv_bias, qk_norm=self.qk_norm)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def decoder_layers(self) -> nn.ModuleList:
        return self.model.layers

    def final_norm(self) -> nn.Module:
        return self.model.norm

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


@register_native(DreamConfig)  # the released auto_map lists AutoModel
class DreamModel(QwenStyleLM):
    """Dream under its released class name; ``forward(...).logits`` are the raw (shifted) outputs."""

    config_class = DreamConfig
    logits_shift = 1
    qkv_bias = True
