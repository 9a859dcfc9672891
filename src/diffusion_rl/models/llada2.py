"""LLaDA2 (LLaDA2.0-mini, LLaDA2.1-mini): our implementation of the mixture-of-experts block-diffusion
model, loading the released weights.

Facts (docs/methods.md §9, read from the released ``modeling_llada2_moe.py`` /
``configuration_llada2_moe.py`` and ``config.json``; 2.0 and 2.1 share the model code, only their
samplers differ): ``model_type: llada2_moe``; keys ``model.word_embeddings``, per layer
``input_layernorm``, ``attention.{query_key_value, query_layernorm, key_layernorm, dense}``,
``post_attention_layernorm``, ``mlp``; ``model.norm``; untied ``lm_head``; no biases.

- Attention: one fused projection viewed as ``heads + 2 kv_heads`` heads of ``head_dim`` (q, then k,
  then v: grouped-query 16 : 4 in the release); per-head RMSNorm of q and k over all ``head_dim``
  channels **before** RoPE (the released class always applies them; ``use_qk_norm`` is not read);
  **partial** rotary: rotate-half over the first ``head_dim * partial_rotary_factor`` channels (64 of
  128) with frequencies over that width, the rest passed through; cos / sin cast to the activation
  dtype.
- MLP: layers ``< first_k_dense_replace`` are a dense SwiGLU (``gate_proj``, ``up_proj``,
  ``down_proj``, ``intermediate_size``); the others a mixture of experts (:class:`LLaDA2MoE`).
- Routing (:class:`LLaDA2Router`): router logits in fp32, scores ``sigmoid``; the ``expert_bias``
  buffer is added only to *choose*: experts fall in ``n_group`` groups, each group scored by the sum
  of its two best biased scores, the best ``topk_group`` groups kept, the ``num_experts_per_tok``
  best experts among them chosen; their weights are the **unbiased** scores normalised by their sum
  (+1e-20; not normalised with one expert per token) times ``routed_scaling_factor``. The weighted sum
  of the experts is taken in fp32; the shared expert (a SwiGLU of ``moe_intermediate_size *
  num_shared_experts``) is added unweighted. No auxiliary loss.
- Block diffusion: bidirectional inside blocks, causal across them, blocks counted from the first
  input position. The block size (32) and the mask id (``<|mask|>``, 156895) are not in the released
  ``config.json``: the block size comes from the preset (``model.block_size: 32``, the released
  samplers' and dFactory's), the mask id from the tokenizer's mask token.

Released fields the forward does not use, accepted as given: ``score_function`` (always sigmoid),
``norm_topk_prob`` (always normalised), ``router_dtype`` (always fp32), ``rotary_dim`` (the width is
``partial_rotary_factor``'s), ``use_sliding_window`` / ``sliding_window`` / ``max_window_layers`` (never
windowed), ``norm_softmax``, ``moe_router_enable_expert_bias``, ``output_router_logits``,
``using_split_qkv_in_self_attention``, ``use_rmsnorm``, the dropouts (0 in the release). Values the
released code would run differently fail in one line: biases, a head tied to the embeddings, another
activation, ``norm_head``, RoPE scaling.

The router is a ``Linear``-free parameter ``mlp.gate.weight`` and a buffer ``mlp.gate.expert_bias``
that nothing updates (the release balances load by adjusting it outside the loss; RL here does not).
Their weights stay out of training unless ``model.train_router`` asks (``router_parameters``, read by
models/hf.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedConfig
from transformers.modeling_layers import GradientCheckpointingLayer

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.layers import KV, QwenMLP, RMSNorm, apply_rope, attend
from diffusion_rl.models.native import NativeLM, check_block_size, register_native, unsupported


class LLaDA2Config(PreTrainedConfig):
    """The fields of the released ``config.json``; defaults are LLaDA2.0-mini's."""

    model_type = "llada2_moe"

    vocab_size: int = 157184
    hidden_size: int = 2048
    intermediate_size: int = 5120
    num_hidden_layers: int = 20
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int | None = 128
    hidden_act: str = "silu"
    use_qkv_bias: bool = False
    use_bias: bool = False
    use_qk_norm: bool = True  # not in the released config.json; the released class applies the norms always
    norm_head: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 600000.0
    partial_rotary_factor: float = 0.5
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    num_experts: int | None = 256
    num_shared_experts: int | None = 1
    num_experts_per_tok: int = 8
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    moe_intermediate_size: int = 512
    first_k_dense_replace: int = 1
    initializer_range: float = 0.02
    use_cache: bool = False
    block_size: int | None = None  # absent from the released config.json: the preset's 32 (model.block_size)
    mask_token_id: int | None = None  # absent from the released config.json: the tokenizer's <|mask|> (156895)
    pad_token_id: int | None = 156892
    eos_token_id: int | None = None


class LLaDA2Attention(nn.Module):
    """Fused ``query_key_value``, per-head ``query_layernorm`` / ``key_layernorm``, partial rotary, ``dense``."""

    def __init__(self, config: LLaDA2Config, head_dim: int, rope_dim: int):
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.rope_dim = head_dim, rope_dim
        width = (self.heads + 2 * self.kv_heads) * head_dim
        self.query_key_value = nn.Linear(config.hidden_size, width, bias=False)
        self.query_layernorm = RMSNorm(head_dim, config.rms_norm_eps)
        self.key_layernorm = RMSNorm(head_dim, config.rms_norm_eps)
        self.dense = nn.Linear(self.heads * head_dim, config.hidden_size, bias=False)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary on the first ``rope_dim`` channels of ``x`` (B, H, L, Dh); the rest unchanged."""
        head, tail = x[..., :self.rope_dim], x[..., self.rope_dim:]
        return torch.cat([apply_rope(head, cos, sin, full_precision=False), tail], dim=-1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                past: KV | None) -> tuple[torch.Tensor, KV]:
        B, L, _ = x.shape
        qkv = self.query_key_value(x).view(B, L, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.transpose(1, 2).split([self.heads, self.kv_heads, self.kv_heads], dim=1)  # (B, ., L, Dh)
        q = self.rotate(self.query_layernorm(q), cos, sin)
        k = self.rotate(self.key_layernorm(k), cos, sin)
        out, kv = attend(q, k, v.contiguous(), mask, past)
        return self.dense(out), kv


class LLaDA2Router(nn.Module):
    """``mlp.gate``: ``weight`` (E, D) and the ``expert_bias`` buffer (E,), fp32 routing (see the module doc)."""

    def __init__(self, config: LLaDA2Config):
        super().__init__()
        E = int(config.num_experts or 0)
        self.top_k, self.groups, self.top_groups = config.num_experts_per_tok, config.n_group, config.topk_group
        self.scale = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(E, config.hidden_size))
        self.expert_bias: torch.Tensor
        self.register_buffer("expert_bias", torch.zeros(E))
        nn.init.normal_(self.weight, std=config.initializer_range)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` (N, D) -> chosen experts (N, k) and their fp32 weights (N, k)."""
        scores = torch.sigmoid(F.linear(x.float(), self.weight.float()))  # (N, E)
        choose = (scores + self.expert_bias.float()).detach()  # the bias picks experts, never weighs them
        N, E = choose.shape
        per_group = choose.view(N, self.groups, E // self.groups)
        group_score = per_group.topk(2, dim=-1).values.sum(-1)  # (N, G): each group's two best
        kept = torch.zeros_like(group_score, dtype=torch.bool)
        kept.scatter_(1, group_score.topk(self.top_groups, dim=-1).indices, True)
        choose = choose.masked_fill(~kept.repeat_interleave(E // self.groups, dim=1), float("-inf"))
        experts = choose.topk(self.top_k, dim=-1).indices  # (N, k)
        w = scores.gather(1, experts)  # (N, k) unbiased
        if self.top_k > 1:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return experts, w * self.scale


class LLaDA2MoE(nn.Module):
    """``gate`` (:class:`LLaDA2Router`), ``experts.{i}`` and ``shared_experts`` (SwiGLU each)."""

    def __init__(self, config: LLaDA2Config):
        super().__init__()
        self.gate = LLaDA2Router(config)
        self.experts = nn.ModuleList(QwenMLP(config.hidden_size, config.moe_intermediate_size)
                                     for _ in range(int(config.num_experts or 0)))
        shared = config.num_shared_experts
        self.shared_experts = QwenMLP(config.hidden_size, config.moe_intermediate_size * shared) if shared else None
        self.last_load: torch.Tensor | None = None  # (E,) tokens routed to each expert by the last forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        flat = x.reshape(-1, D)  # (N, D)
        experts, weights = self.gate(flat)  # (N, k) each
        out = torch.zeros(flat.shape[0], D, dtype=torch.float32, device=x.device)
        order = experts.flatten().argsort(stable=True)  # token-slots grouped by expert, in token order: deterministic
        counts = torch.bincount(experts.flatten(), minlength=len(self.experts))
        self.last_load = counts.detach()
        rows = order // experts.shape[1]  # the token of each slot
        slot_w = weights.flatten()[order]  # its weight
        start = 0
        for e, n in enumerate(counts.tolist()):
            # every expert runs (on no tokens where none routed to it) while training, so each
            # parameter has a gradient, zero where unused: data-parallel reductions see them all
            if n == 0 and not torch.is_grad_enabled():
                continue
            idx = rows[start:start + n]
            y = self.experts[e](flat[idx])  # (n, D)
            out = out.index_add(0, idx, y.float() * slot_w[start:start + n, None])
            start += n
        y = out.to(x.dtype).view(B, L, D)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y


class LLaDA2DecoderLayer(GradientCheckpointingLayer):
    """``input_layernorm``, ``attention``, ``post_attention_layernorm``, ``mlp`` (dense or experts)."""

    _can_checkpoint_with_cache = True  # reads the cache, writes nothing in place

    def __init__(self, config: LLaDA2Config, index: int, head_dim: int, rope_dim: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = LLaDA2Attention(config, head_dim, rope_dim)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        moe = config.num_experts is not None and index >= config.first_k_dense_replace
        self.mlp = LLaDA2MoE(config) if moe else QwenMLP(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                past: KV | None = None) -> tuple[torch.Tensor, KV]:
        h, kv = self.attention(self.input_layernorm(x), cos, sin, mask, past)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class LLaDA2Body(nn.Module):
    """``word_embeddings``, ``layers``, ``norm``: the ``model.`` part of the checkpoint."""

    def __init__(self, config: LLaDA2Config, head_dim: int, rope_dim: int):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(LLaDA2DecoderLayer(config, i, head_dim, rope_dim)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


@register_native(LLaDA2Config, "AutoModelForCausalLM")  # the released auto_map lists AutoModel and this
class LLaDA2MoeModelLM(NativeLM):
    """LLaDA2 under its released class name; block-causal over ``config.block_size``."""

    config_class = LLaDA2Config
    _no_split_modules = ["LLaDA2DecoderLayer"]
    tokenizer_fallback = "PreTrainedTokenizerFast"

    def __init__(self, config: LLaDA2Config):
        rope = getattr(config, "rope_parameters", None) or {}
        unsupported(config, {
            "hidden_act": (config.hidden_act, "silu"), "use_qkv_bias": (bool(config.use_qkv_bias), False),
            "use_bias": (bool(config.use_bias), False), "norm_head": (bool(config.norm_head), False),
            "tie_word_embeddings": (bool(config.tie_word_embeddings), False),
            "rope_scaling": (rope.get("rope_type", "default"), "default"),
        })
        check_block_size(config, "LLaDA2", 32)
        experts, groups = int(config.num_experts or 0), config.n_group
        if experts and (experts % groups or not 1 <= config.topk_group <= groups
                        or config.num_experts_per_tok > experts // groups * config.topk_group
                        or experts // groups < 2):
            raise ConfigError("llada2_moe config.json n_group", groups,
                              f"num_experts={experts} must split into n_group groups of >= 2 holding "
                              f"num_experts_per_tok={config.num_experts_per_tok} in topk_group={config.topk_group}")
        super().__init__(config)
        self.head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
        self.rope_dim = int(self.head_dim * config.partial_rotary_factor)
        if self.rope_dim % 2 or not 0 < self.rope_dim <= self.head_dim:
            raise ConfigError("llada2_moe config.json partial_rotary_factor", config.partial_rotary_factor,
                              f"must give an even rotary width in (0, head_dim={self.head_dim}]")
        self.rope_theta = config.rope_theta
        self.model = LLaDA2Body(config, self.head_dim, self.rope_dim)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @property
    def block_size(self) -> int:
        return int(self.config.block_size)

    def decoder_layers(self) -> nn.ModuleList:
        return self.model.layers

    def final_norm(self) -> nn.Module:
        return self.model.norm

    def get_input_embeddings(self) -> nn.Module:
        return self.model.word_embeddings

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def router_parameters(self) -> list[nn.Parameter]:
        return [m.weight for m in self.modules() if isinstance(m, LLaDA2Router)]

    def router_load(self) -> torch.Tensor | None:
        """(MoE layers, experts): tokens each expert received in the last forward, or None before one."""
        loads = [m.last_load for m in self.modules() if isinstance(m, LLaDA2MoE) and m.last_load is not None]
        return torch.stack(loads) if loads else None



def router_metrics(net: nn.Module) -> dict[str, float]:
    """``moe/load_max_over_mean``: over the MoE layers, the busiest expert's tokens over the mean in the
    last forward (1 = perfectly balanced); ``moe/idle_expert_frac``: the share of (layer, expert) pairs
    that received no token. Empty for a network without routers; this process's tokens only."""
    loads = [m.last_load for m in net.modules() if isinstance(m, LLaDA2MoE) and m.last_load is not None]
    if not loads:
        return {}
    load = torch.stack(loads).float()  # (layers, experts)
    ratio = load.max(1).values / load.mean(1).clamp(min=1e-9)
    return {"moe/load_max_over_mean": float(ratio.max()), "moe/idle_expert_frac": float((load == 0).float().mean())}
