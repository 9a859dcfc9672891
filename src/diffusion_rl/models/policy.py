"""The policy interface the rest of the code sees, and the registry of model builders.

Builders register in their own files (``tiny.py``, ``hf.py``); :func:`diffusion_rl.models.build.build_policy`
builds one by name. This file imports none of them.

A :class:`PolicyBundle` holds a network whose call ``net(input_ids=..., attention_mask=...)``
returns an object with ``.logits`` (what the embedded model and Hugging Face diffusion LMs such as
LLaDA both satisfy), its tokenizer, and the special ids the sampler needs. The logits at position
``i`` always predict the token at ``i``: a model trained with shifted logits (Dream) is wrapped by its
builder so that samplers and estimators never see the shift. Nothing downstream knows which network
it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.core.registry import Registry

MODELS: Registry[Callable[[ModelConfig], PolicyBundle]] = Registry("model.name")


# attention and MLP projections of Llama-style models (Llama, Qwen, SDAR); LLaDA's are in its config
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AUTO_CLASSES = ("auto", "AutoModel", "AutoModelForMaskedLM", "AutoModelForCausalLM")
ATTENTION = ("native", "bidirectional", "block_causal")
IMPLS = ("native", "remote")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# the mask id of a uniform-noise model (DiffusionGemma: a noised position holds a random token, there is
# no mask token); PolicyBundle.noise says which kind a model is
NO_MASK = -1


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
    # the attention accepts a boolean (B, 1, L, L) mask and position ids (likelihood=staircase needs
    # it); the embedded model does; a Hugging Face model says so in its config
    custom_attention_mask: bool = True
    learned_positions: bool = True  # learned absolute positions on top of rotary ones
    # Hugging Face models (models/hf.py): a local folder or hub id, special ids (else the config's, then
    # the tokenizer's)
    path: str | None = None
    mask_token_id: int | None = None
    eos_token_id: int | None = None
    # the EOS named by its token, looked up in the tokenizer (a model whose answers end in a chat token
    # its tokenizer_config does not call eos_token: DiffuCoder-Instruct's <|im_end|>); or eos_token_id
    eos_token: str | None = None
    # native: our own classes for LLaDA / Dream / SDAR (models/llada.py, dream.py, sdar.py), transformers'
    # own class for any other architecture; no checkpoint code runs. remote: the checkpoint's own
    # modelling code (needs trust_remote_code), for diffusion LMs we do not implement
    impl: str = "native"
    trust_remote_code: bool = False  # run the checkpoint's own modelling code (impl=remote); never on unless set
    auto_class: str = "auto"  # auto | AutoModel | AutoModelForMaskedLM | AutoModelForCausalLM (not native)
    # native: as the model does it (LLaDA as released attends over padding; Dream masks padding; SDAR is
    # block-causal over its checkpoint's blocks). bidirectional: padding masked, positions skip left
    # padding (LLaDA's padding-aware option; for a non-native decoder, a 4D mask built here).
    # block_causal: blocks of block_size (a non-native decoder; SDAR already is)
    attention: str = "bidirectional"
    extra: dict[str, Any] = field(default_factory=dict)  # more from_pretrained kwargs (attn_implementation, revision)
    # training options, any model (models/adapters.py)
    dtype: str = "float32"  # weights: float32 | bfloat16 | float16 (bf16 compute: trainer.precision=bf16-mixed)
    gradient_checkpointing: bool = False  # recompute each decoder layer's activations in backward
    lora_r: int = 0  # LoRA rank through peft; 0 = full fine-tuning
    lora_alpha: int = 64
    lora_dropout: float = 0.05
    # module names (suffix match) or one regular expression (full match) for LoRA
    lora_targets: list[str] | str = field(default_factory=lambda: list(LORA_TARGETS))
    load_in_4bit: bool = False  # 4-bit NF4 base weights (bitsandbytes, CUDA), LoRA on top
    # a mixture-of-experts model's router weights (LLaDA2's mlp.gate.weight) train too; off, they stay as
    # released under full fine-tuning as under LoRA (the expert_bias buffer never trains)
    train_router: bool = False

    def validate(self) -> None:
        for key in ("d_model", "n_layers", "n_heads", "max_len"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key}", getattr(self, key), "must be >= 1")
        if self.d_model % self.n_heads:
            raise ConfigError("model.d_model", self.d_model, f"must be divisible by model.n_heads={self.n_heads}")
        if self.block_size < 0:
            raise ConfigError("model.block_size", self.block_size, "must be >= 0 (0 = full attention)")
        choices = {"auto_class": AUTO_CLASSES, "attention": ATTENTION, "dtype": tuple(DTYPES), "impl": IMPLS}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ConfigError(f"model.{key}", getattr(self, key), f"allowed: {', '.join(allowed)}")
        if self.trust_remote_code and self.impl != "remote":
            raise ConfigError("model.trust_remote_code", True,
                              "runs the checkpoint's own modelling code: only with model.impl=remote")
        if self.attention == "block_causal" and self.block_size < 1:
            raise ConfigError("model.block_size", self.block_size, "must be >= 1 with model.attention=block_causal")
        if self.lora_r < 0:
            raise ConfigError("model.lora_r", self.lora_r, "must be >= 0 (0 = full fine-tuning)")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError("model.lora_dropout", self.lora_dropout, "must be in [0, 1)")
        if self.lora_alpha <= 0:
            raise ConfigError("model.lora_alpha", self.lora_alpha, "must be > 0")
        if not self.lora_targets:
            raise ConfigError("model.lora_targets", self.lora_targets, "must name at least one module")
        if self.eos_token is not None and self.eos_token_id is not None:
            raise ConfigError("model.eos_token", self.eos_token,
                              f"set model.eos_token or model.eos_token_id={self.eos_token_id}, not both")
        if self.load_in_4bit and self.lora_r == 0:
            raise ConfigError("model.load_in_4bit", True, "needs LoRA (model.lora_r > 0): 4-bit weights are not trained")




@dataclass
class PolicyBundle:
    net: nn.Module
    tokenizer: Any
    mask_token_id: int
    eos_token_id: int
    pad_token_id: int
    block_size: int = 0
    custom_attention_mask: bool = True  # see ModelConfig.custom_attention_mask
    # mask: noised positions hold mask_token_id (LLaDA, Dream, SDAR, LLaDA2, the embedded model); uniform:
    # they hold random tokens and mask_token_id is NO_MASK (DiffusionGemma, models/diffusion_gemma.py)
    noise: str = "mask"


KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v), each (B, H, S, Dh), rotary applied


class KVCacheLM(Protocol):
    """The key/value cache convention the samplers rely on (the embedded model follows it; the native
    LLaDA / Dream / SDAR classes are meant to).

    ``net(input_ids=, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False)``
    returns ``.logits`` and, with ``use_cache=True``, ``.past_key_values``: a :data:`KVCache` over the
    cached and the new tokens, positions already applied. Passing a cache back makes the new tokens
    attend to the cached keys and to themselves; a 2D ``attention_mask`` then covers the cached keys
    followed by the new tokens, ``(B, S + L)``. The cache is never modified in place.

    - ``supports_kv_cache``: the convention holds for a contiguous prefix of the sequence (the block
      sampler's finished blocks; ``sampler.kv_cache=prefix``).
    - ``kv_cache_any_order`` (the one extension ``sampler.kv_cache=dual`` needs): the cached keys may be
      any concatenation, along the sequence axis, of slices of caches the model returned (the prefix
      and the suffix around the block being decoded); the model takes explicit ``position_ids`` for
      the new tokens and applies no mask of its own that depends on the index order of keys (a
      full-attention model: attention is invariant to the order of its keys). Nothing is replaced in
      place: the block's own keys are recomputed from its current tokens at every step.

    A model with shifted logits (Dream: position ``i - 1`` predicts token ``i``) must also return the
    logits of the new tokens in that sense and set ``logits_shift = 1``; its cache carries
    ``next_logits``, the prediction for the first new token. The cached samplers then also run the
    token before the block, so the block's first logits are computed. Positions of the new tokens
    are ``cumsum(attention_mask) - 1`` unless the model sets ``mask_padding = False`` (LLaDA as
    released: padding is attended and counted).
    """

    supports_kv_cache: bool
    kv_cache_any_order: bool

    def __call__(self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None, past_key_values: KVCache | None = None,
                 use_cache: bool = False) -> Any: ...


def check_cache_support(net: nn.Module, cache: str) -> None:
    """Fail in one line when ``sampler.kv_cache=prefix|dual`` asks more of ``net`` than it offers."""
    if cache == "none":
        return
    if not getattr(net, "supports_kv_cache", False):
        raise ConfigError("sampler.kv_cache", cache, f"{type(net).__name__} has no key/value cache: use sampler.kv_cache=none")
    if cache == "dual" and not getattr(net, "kv_cache_any_order", False):
        raise ConfigError("sampler.kv_cache", cache,
                          f"{type(net).__name__} cannot take a prefix + suffix cache (KVCacheLM.kv_cache_any_order): "
                          "use sampler.kv_cache=prefix or none")
    if getattr(getattr(net, "config", None), "block_size", 0):
        raise ConfigError("sampler.kv_cache", cache,
                          "a block model's sampler already caches finished blocks exactly: use sampler.kv_cache=none")


# what the sampler, the estimators and the objectives call: a PolicyForward or any callable
# (ids, attention_mask[, position_ids][, keep]) -> logits (B, T, V)
Forward = Callable[..., torch.Tensor]


class PolicyForward:
    """A network as the sampler and the likelihood estimators call it (fp32 outputs).

    - ``forward(ids, attn[, position_ids], keep=None) -> logits (B, R, V)``: every position, or the
      slice ``keep`` only (the sampler's block);
    - ``forward.token_logps(ids, attn, targets, start, select=None, position_ids=None) -> (B, L)``: the
      log-probability of ``targets`` at positions ``start .. start + L``, computed only at ``select``
      (others 0), through the chunked fused head of ``models/heads.py``: no (B, T, V) tensor.

    Every policy network of the project takes ``keep`` / ``targets`` / ``select`` (``models/heads.py``);
    :func:`diffusion_rl.likelihood.base.forward_logps` is the estimators' way in.
    """

    def __init__(self, net: nn.Module):
        self.net = net

    def run(self, **kwargs: Any) -> Any:
        """One call of the network (subclasses wrap it, e.g. with the adapters switched off)."""
        return self.net(**kwargs)

    def __call__(self, ids: torch.Tensor, attn: torch.Tensor | None, position_ids: torch.Tensor | None = None,
                 keep: slice | None = None) -> torch.Tensor:
        kw: dict[str, Any] = {"input_ids": ids, "attention_mask": attn}
        if position_ids is not None:
            kw["position_ids"] = position_ids
        if keep is not None:
            kw["keep"] = keep
        return self.run(**kw).logits.float()

    def token_logps(self, ids: torch.Tensor, attn: torch.Tensor | None, targets: torch.Tensor, start: int,
                    select: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        kw: dict[str, Any] = {"input_ids": ids, "attention_mask": attn, "keep": slice(start, start + targets.shape[1]),
                              "targets": targets, "select": select}
        if position_ids is not None:
            kw["position_ids"] = position_ids
        return self.run(**kw).token_logps


def logits_fn(net: nn.Module) -> PolicyForward:
    """``net`` as the estimators and samplers call it (:class:`PolicyForward`)."""
    return PolicyForward(net)


@contextmanager
def dropout_disabled(net: nn.Module) -> Iterator[None]:
    """Dropout off inside the block, the rest of the network's mode untouched (activation checkpointing
    of Hugging Face layers runs only in training mode): the old and the new policy's log-probs are then
    the same function of the weights, so their ratio is exactly 1 at theta = theta_old."""
    drops = [m for m in net.modules() if isinstance(m, nn.Dropout) and m.training]
    for m in drops:
        m.eval()
    try:
        yield
    finally:
        for m in drops:
            m.train()


def encode_prompts(tokenizer, prompts: list[str], device: torch.device | str = "cpu",
                   pad_to_multiple_of: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask, (B, P) each.

    ``pad_to_multiple_of = block_size`` (block models) makes ``P`` whole blocks, so that blocks counted
    from the first position start the completion on a block boundary.
    """
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(prompts, padding=True, add_special_tokens=False, return_tensors="pt",
                        pad_to_multiple_of=pad_to_multiple_of or None)
    finally:
        tokenizer.padding_side = old_side
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def decode_completions(tokenizer, completion: torch.Tensor, eos_id: int) -> list[str]:
    """Text of each completion up to (excluding) its first EOS; special tokens dropped."""
    texts = []
    for row in completion.tolist():
        if eos_id in row:
            row = row[: row.index(eos_id)]
        texts.append(tokenizer.decode(row, skip_special_tokens=True))
    return texts
