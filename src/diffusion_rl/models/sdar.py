"""SDAR (SDAR-1.7B / 4B / 8B-Chat, TraDo): our implementation, loading the released weights.

Facts (docs/methods.md §9, checked against the released ``modeling_sdar.py`` /
``configuration_sdar.py`` and
``generate.py``): ``model_type: sdar``; Qwen3 under Qwen3's key names (as Dream's plus per-head
``self_attn.q_norm`` / ``k_norm``, RMSNorm over ``head_dim`` before RoPE); ``head_dim`` from the
config; no biases (``attention_bias: false``); RMSNorm eps 1e-6; RoPE theta 1e6; no logit shift; the
head is tied to the embeddings only if ``tie_word_embeddings`` says so.

Block diffusion: attention is bidirectional inside a block of ``block_size`` tokens and causal across
blocks, blocks counted from the first input position (the released sampler passes exactly that mask
over ``[prompt ; generation]`` and caches the keys/values of finished blocks). The released
``config.json`` files name neither ``block_size`` nor ``mask_token_id`` (only JetAstra/SDAR's training
copy adds them): the block size comes from the preset (``model.block_size: 4``) unless a checkpoint's
``config.json`` names one, the mask id from the tokenizer's ``<|MASK|>``. The other released fields our
forward does not use (``attn_implementation: flex_attention``, ``fuse_cross_entropy``, ``debug``,
``ep_size``, ``micro_forward``, ``skip_checkpoint``, ``use_deepep``) are accepted; the attention request
is noted in the log (models/native.py). Training inputs ``[noisy ; clean]`` with shared positions come
as a boolean 4D mask from our staircase estimator (docs/methods.md §3).
"""

from __future__ import annotations

from diffusion_rl.models.dream import QwenConfig, QwenStyleLM
from diffusion_rl.models.native import check_block_size, register_native, unsupported


class SDARConfig(QwenConfig):
    """The fields of the released ``config.json``; defaults are SDAR-8B-Chat's (Qwen3-8B shape)."""

    model_type = "sdar"

    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    max_position_embeddings: int = 40960
    max_window_layers: int | None = 36
    attention_bias: bool = False
    block_size: int | None = None  # absent from the released config.json: the preset's 4 (model.block_size)
    mask_token_id: int | None = None  # absent from the released config.json: the tokenizer's <|MASK|> (151669)
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None


@register_native(SDARConfig, "AutoModelForCausalLM")  # the released auto_map lists AutoModel and this
class SDARForCausalLM(QwenStyleLM):
    """SDAR under its released class name; block-causal over ``config.block_size``."""

    config_class = SDARConfig
    qk_norm = True

    def __init__(self, config: SDARConfig):
        unsupported(config, {"attention_bias": (config.attention_bias, False)})
        check_block_size(config, "SDAR", 4)
        super().__init__(config)

    @property
    def block_size(self) -> int:
        return int(self.config.block_size)
