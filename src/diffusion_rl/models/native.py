"""Our own implementations of released diffusion LMs, loaded from the released folders without
running any of their code (``model.impl=native``, the default).

The architectures live in ``llada.py``, ``dream.py`` and ``sdar.py``; each is a
``transformers.PreTrainedModel`` with its own ``PretrainedConfig``, registered here with ``AutoConfig``
/ ``AutoModel`` under the checkpoint's ``model_type`` (:func:`register_native`), so
``AutoModel.from_pretrained(folder)`` (or ``model=hf model.path=folder``) builds our class from the
released ``config.json`` and sharded safetensors -- ``dtype``, ``device_map`` and low-memory loading
are transformers' own -- with ``trust_remote_code=False``. What this file adds:

- :class:`NativeLM`, the shared forward: embeddings, decoder layers (called as
  ``layer(x, cos, sin, mask, past)``), final norm, head, with the padding / 4D-mask / position-id
  handling of :func:`~diffusion_rl.models.layers.attention_inputs` and a key/value cache in the
  embedded model's convention (``forward(input_ids, attention_mask, position_ids, past_key_values,
  use_cache)`` -> ``.logits``, ``.past_key_values`` = one ``(k, v)`` per layer, rotary applied).
- Strict loading: a key the checkpoint has and we do not, one we have and it does not, a shape that
  differs, or a ``config.json`` of another ``model_type`` is a one-line :class:`ConfigError` naming
  it, never a silently random layer.
- :class:`NativeDiffusionLM`, the network the policy interface sees: it hides Dream's shifted
  logits (Dream's output at ``i - 1`` predicts token ``i``), so samplers and likelihood estimators
  read position ``i`` at ``i`` for every model.
- :func:`load_tokenizer`: the folder's tokenizer without remote code; where the folder names a
  tokenizer class that ships as code (Dream's ``DreamTokenizer``, a copy of Qwen2's byte-level BPE),
  the equivalent transformers class is used instead and the log says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import transformers
from torch import nn
from transformers import AutoConfig, PreTrainedConfig, PreTrainedModel

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.heads import HeadOutput, head_outputs
from diffusion_rl.models.layers import KV, attention_inputs, rope_tables

log = logging.getLogger(__name__)

NATIVE: dict[str, type[NativeLM]] = {}  # model_type -> our class (filled by register_native)
_NOTED_ATTENTION: set[tuple[str, str]] = set()  # (class, requested implementation) already logged


class KVCache(list):
    """Per layer ``(k, v)``, each ``(B, H_kv, S, Dh)`` with rotary applied (a plain list otherwise).

    ``next_logits`` (B, V): for a shifted-logits model (Dream), the raw logits of the last cached
    position, which predict the first token after the cache (set by :class:`NativeDiffusionLM`).
    """

    next_logits: torch.Tensor | None = None


@dataclass
class NativeOutput(HeadOutput):
    """``.logits`` (B, L, V) (or at ``keep``), ``.token_logps`` with ``targets``, ``.past_key_values``
    with use_cache=True (cached and new keys/values), ``.hidden`` (B, L, D) with ``output_hidden``."""

    hidden: torch.Tensor | None = None


def unsupported(config: PreTrainedConfig, checks: dict[str, tuple[Any, Any]]) -> None:
    """Fail in one line on a config value our implementation does not cover: ``{field: (value, supported)}``."""
    for name, (value, ok) in checks.items():
        if value != ok:
            raise ConfigError(f"{config.model_type} config.json {name}", value,
                              f"the native implementation supports {ok!r} (as in the released checkpoints)")


def check_block_size(config: PreTrainedConfig, family: str, preset: int) -> None:
    """A block model's ``config.block_size``: set (from the checkpoint or ``model.block_size``), an
    integer >= 1; else one line naming where it should come from (``preset``: the presets' value)."""
    if config.block_size is None:
        raise ConfigError("model.block_size", 0, f"{family}'s released config.json names no block size: set "
                          f"model.block_size (the {family} presets set the released {preset})")
    if not isinstance(config.block_size, int) or config.block_size < 1:
        raise ConfigError(f"{config.model_type} config.json block_size", config.block_size, "must be an integer >= 1")


class NativeLM(PreTrainedModel):
    """Shared forward of the native models; subclasses build the modules under the released names.

    Subclasses provide ``decoder_layers()`` (ModuleList), ``final_norm()``, ``get_input_embeddings()``,
    ``get_output_embeddings()``, set ``head_dim`` and ``rope_theta``, and override the class
    attributes / properties below where they differ.
    """

    supports_kv_cache = True  # the block sampler may cache finished blocks (see models/tiny.py)
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    base_model_prefix = "model"
    logits_shift: ClassVar[int] = 0  # Dream: 1 (its output at i - 1 predicts token i)
    tokenizer_fallback: ClassVar[str | None] = None  # transformers class for a tokenizer shipped as code
    head_dim: int
    rope_theta: float
    rope_dim: int | None = None  # rotary over the first rope_dim channels of a head (LLaDA2: 64 of 128); None: all

    @property
    def block_size(self) -> int:
        """> 0: attention is block-causal over blocks of this many tokens (SDAR)."""
        return 0

    @property
    def kv_cache_any_order(self) -> bool:
        """``sampler.kv_cache=dual`` (KVCacheLM): full attention, explicit positions, no key-order mask."""
        return self.block_size == 0

    @property
    def mask_padding(self) -> bool:
        """Whether a (B, L) padding mask is applied (LLaDA as released: no, it attends over padding)."""
        return True

    def _check_and_adjust_attn_implementation(self, attn_implementation: str | None, is_init_check: bool = False,
                                              allow_all_kernels: bool = False) -> str:
        """Our layers compute attention themselves (``layers.attend``: torch's scaled-dot-product
        attention), whatever the checkpoint asks for: a requested implementation (SDAR-4B / 8B-Chat's
        ``config.json`` carries ``"attn_implementation": "flex_attention"``, for their training code) is
        noted once in the log, not refused."""
        if attn_implementation not in (None, "sdpa"):
            key = (type(self).__name__, str(attn_implementation))
            if key not in _NOTED_ATTENTION:
                _NOTED_ATTENTION.add(key)
                log.info("%s: attn_implementation=%r requested (config.json or model.extra); the native "
                         "implementation computes attention itself with torch's sdpa", *key)
        return "sdpa"

    def decoder_layers(self) -> nn.ModuleList:
        raise NotImplementedError

    def router_parameters(self) -> list[nn.Parameter]:
        """A mixture-of-experts model's router weights (frozen unless ``model.train_router``); none here."""
        return []

    def final_norm(self) -> nn.Module:
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: list[KV] | None = None,
        use_cache: bool = False,
        return_dict: bool | None = None,  # accepted for Hugging Face callers; the output is always an object
        keep: slice | None = None,
        targets: torch.Tensor | None = None,
        select: torch.Tensor | None = None,
        output_hidden: bool = False,
    ) -> NativeOutput:
        """Raw logits (Dream's shifted) at ``keep``, or ``targets``' log-probs (models/heads.py); with
        ``output_hidden`` the final-normed hidden states instead of any head output."""
        B, L = input_ids.shape
        past = 0 if not past_key_values else past_key_values[0][0].shape[-2]
        mask, pos = attention_inputs(attention_mask, position_ids, B, L, past, input_ids.device,
                                     block_size=self.block_size, mask_padding=self.mask_padding)
        cos, sin = rope_tables(pos, self.rope_dim or self.head_dim, self.rope_theta)  # (B, 1, L, Dh) each, fp32
        x = self.get_input_embeddings()(input_ids)  # (B, L, D)
        cache = KVCache()
        for i, layer in enumerate(self.decoder_layers()):
            x, kv = layer(x, cos, sin, mask, None if not past_key_values else past_key_values[i])
            if use_cache:  # else each layer's keys and values are freed as soon as it is done
                cache.append(kv)
        x = self.final_norm()(x)  # (B, L, D)
        kv = cache if use_cache else None
        if output_hidden:
            return NativeOutput(hidden=x, past_key_values=kv)
        out = head_outputs(x, self.get_output_embeddings(), keep, targets, select)
        return NativeOutput(logits=out.logits, token_logps=out.token_logps, past_key_values=kv)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):  # type: ignore[override]
        """``PreTrainedModel.from_pretrained``, then a one-line error on any key or type mismatch."""
        want_info = kwargs.pop("output_loading_info", False)
        src = str(pretrained_model_name_or_path)
        config = kwargs.get("config")
        if isinstance(config, PreTrainedConfig):
            found = config.model_type
        else:
            hub = {k: kwargs[k] for k in ("local_files_only", "revision", "cache_dir", "token") if k in kwargs}
            found = PreTrainedConfig.get_config_dict(config or src, **hub)[0].get("model_type")
        expected = cls.config_class.model_type
        if found != expected:
            raise ConfigError("model.path", src, f"config.json has model_type {found!r}; {cls.__name__} reads {expected!r}")
        model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs)
        check_loading_info(info, cls.__name__, src)
        return (model, info) if want_info else model


def check_loading_info(info: dict[str, Any], name: str, src: str) -> None:
    """Raise one line naming the first missing / unexpected / mis-shaped key."""
    for kind, what in (("missing_keys", "missing from the checkpoint"), ("unexpected_keys", "not in " + name),
                       ("mismatched_keys", "of another shape")):
        keys = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get(kind) or ())
        if keys:
            more = f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""
            raise ConfigError("model.path", src, f"weight {keys[0]!r} is {what}{more}: not a released {name} checkpoint")
    if info.get("error_msgs"):
        raise ConfigError("model.path", src, f"{name} weights failed to load: {str(info['error_msgs'][0]).splitlines()[0]}")


def register_native(config_cls: type[PreTrainedConfig], *auto_classes: str):
    """Class decorator: register a native model under its config's ``model_type`` with ``AutoConfig``
    and the named auto classes (those the released ``auto_map`` lists), and in :data:`NATIVE`."""

    def deco(model_cls: type[NativeLM]) -> type[NativeLM]:
        AutoConfig.register(config_cls.model_type, config_cls, exist_ok=True)
        for name in ("AutoModel", *auto_classes):
            getattr(transformers, name).register(config_cls, model_cls, exist_ok=True)
        NATIVE[config_cls.model_type] = model_cls
        return model_cls

    return deco


class NativeDiffusionLM(nn.Module):
    """The policy's network over a native model: logits at ``i`` predict token ``i`` for every model.

    Dream's raw output at ``i - 1`` predicts ``i``: this shifts it right by one (position 0 keeps its
    own logits, as Dream's released sampler does). With a cache, the first new token is predicted by
    the last cached one, whose logits the cache returned by ``use_cache=True`` carries
    (:attr:`KVCache.next_logits`); a cache without them is refused for Dream.
    """

    supports_kv_cache = True

    def __init__(self, model: NativeLM):
        super().__init__()
        self.model = model
        self.shift = model.logits_shift

    @property
    def config(self):
        return self.model.config

    # the KVCacheLM facts of the wrapped model (sampling/cache.py reads them)
    @property
    def logits_shift(self) -> int:
        return self.shift

    @property
    def kv_cache_any_order(self) -> bool:
        return self.model.kv_cache_any_order

    @property
    def mask_padding(self) -> bool:
        return self.model.mask_padding

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: list[KV] | None = None,
                use_cache: bool = False, keep: slice | None = None, targets: torch.Tensor | None = None,
                select: torch.Tensor | None = None) -> NativeOutput:
        """Unshifted outputs; ``keep`` / ``targets`` / ``select`` as in models/heads.py."""
        kw = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
              "past_key_values": past_key_values, "use_cache": use_cache}
        if not self.shift:
            return self.model(**kw, keep=keep, targets=targets, select=select)
        if past_key_values:  # a cached step: the first new token is predicted by the last cached one
            out = self.model(**kw)
            logits = self._shift_cached(out.logits, past_key_values)  # (B, L, V)
            if out.past_key_values is not None:
                out.past_key_values.next_logits = out.logits[:, -1]
            if targets is not None:
                raise ValueError("token log-probs are scored without a key/value cache")
            return NativeOutput(logits=logits if keep is None else logits[:, keep], past_key_values=out.past_key_values)
        out = self.model(**kw, output_hidden=True)
        raw = out.hidden  # (B, L, D): raw[:, i] predicts token i + 1
        assert raw is not None
        head = self.model.get_output_embeddings()
        if out.past_key_values is not None:
            out.past_key_values.next_logits = head(raw[:, -1])  # (B, V) what the cache predicts next
        shifted = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)  # position 0 keeps its own, as Dream's sampler
        res = head_outputs(shifted, head, keep, targets, select)
        return NativeOutput(logits=res.logits, token_logps=res.token_logps, past_key_values=out.past_key_values)

    @staticmethod
    def _shift_cached(raw: torch.Tensor, past: list[KV]) -> torch.Tensor:
        """Raw logits (B, L, V) of the new tokens of a cached call, shifted: the first is the cache's."""
        first = getattr(past, "next_logits", None)
        if first is None:
            raise ValueError("Dream predicts the first new token from the last cached one: pass the cache "
                             "returned by use_cache=True (KVCache with next_logits)")
        return torch.cat([first[:, None].to(raw.dtype), raw[:, :-1]], dim=1)


def load_tokenizer(src: str, model_cls: type[NativeLM], **kwargs: Any):
    """The folder's tokenizer without remote code (``kwargs`` go to ``from_pretrained``)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(src, trust_remote_code=False, **kwargs)
    except (ValueError, OSError, KeyError, AttributeError) as err:
        fallback = model_cls.tokenizer_fallback
        if fallback is None:
            raise
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        log.warning("%s: tokenizer not loadable without its own code (%s); loading the files with transformers' %s "
                    "instead (the released class is a copy of it; its code is not run)", src, first, fallback)
        return getattr(transformers, fallback).from_pretrained(src, **kwargs)
