"""Hugging Face diffusion LMs behind the policy interface: ``model=hf model.path=<folder or hub id>``.

The named configs use the same builder: ``model=llada_8b_instruct`` / ``llada_1_5``,
``dream_7b_instruct`` / ``diffucoder_7b_instruct``, ``sdar_8b_chat`` / ``sdar_4b_chat`` / ``sdar_1_7b_chat`` /
``trado_8b_instruct`` / ``trado_4b_instruct``. What it does:

- ``model.impl=native`` (the default) never runs code from the checkpoint: a folder whose
  ``model_type`` is one we implement (``llada``, ``Dream``, ``sdar``: ``models/native.py``) builds our
  class from the released weights, any other architecture transformers' own class; a key or type
  mismatch is a one-line error. ``model.impl=remote`` runs the checkpoint's own code (with
  ``model.trust_remote_code=true``) for diffusion LMs we do not implement; code written for
  transformers 4.x that never calls ``post_init()`` gets that call added after ``__init__`` (a shim,
  logged as a warning).

- ``model.path`` is a local folder (loaded with ``local_files_only``: no hub call) or a hub id; a
  missing folder, a folder without ``config.json``, weights or tokenizer, or an id that cannot be
  fetched fails in one line naming the path and what was expected.
- ``model.trust_remote_code`` is passed as configured (with ``impl=remote``) and nothing else turns it
  on: a checkpoint that ships its own code and is loaded without it fails in one line saying so.
- The model class is ``model.auto_class``, or with ``auto``: the class the checkpoint's remote code
  declares (``auto_map``), else ``AutoModelForMaskedLM`` or ``AutoModelForCausalLM``, whichever
  knows the architecture.
- Mask / EOS ids come from ``model.*_token_id``; else the mask id from the model's ``config.json``,
  then the tokenizer; the EOS id from the tokenizer, then ``config.json``; padding falls back to EOS.
- :class:`HFDiffusionLM` adapts the network to what the sampler and estimators call. With
  ``attention=native`` it passes the padding mask through (LLaDA masks nothing else). With
  ``bidirectional`` / ``block_causal`` it builds a 4D mask itself (every real key; block-causal
  across ``block_size`` blocks) and position ids that skip left padding, which turns any decoder
  that honours 4D masks (Llama, Qwen; ``sdpa`` or ``eager`` attention) into a diffusion LM. Boolean
  ``(B, 1, L, L)`` masks from callers (the staircase estimator) are honoured as given.

Training options (dtype, LoRA, activation checkpointing) are applied afterwards by
:func:`~diffusion_rl.models.adapters.prepare_for_training`, for this model as for the embedded one.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.heads import head_outputs, logits_outputs
from diffusion_rl.models.native import NATIVE, NativeDiffusionLM, NativeLM, load_tokenizer
from diffusion_rl.models.policy import DTYPES, MODELS, ModelConfig, PolicyBundle

log = logging.getLogger(__name__)

# model_type -> the builder of an architecture whose policy network is its own, not HFDiffusionLM
# (DiffusionGemma's encoder, canvas and self-conditioning: models/diffusion_gemma.py registers itself);
# called as builder(cfg, source, is_local, from_pretrained kwargs)
ARCHITECTURES: dict[str, Callable[..., PolicyBundle]] = {}

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_EXPECTED = "expected a Hugging Face model folder (config.json, weights, tokenizer files) or a hub id like org/name"


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]


def resolve_path(cfg: ModelConfig) -> tuple[str, bool]:
    """``(source, is_local)``; fails in one line on a missing or malformed local folder."""
    if not cfg.path:
        raise ConfigError("model.path", cfg.path, f"model=hf needs a path: {_EXPECTED}")
    p = Path(cfg.path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise ConfigError("model.path", cfg.path, f"is a file, not a folder: {_EXPECTED}")
        if not (p / "config.json").is_file():
            raise ConfigError("model.path", cfg.path, f"has no config.json: {_EXPECTED}")
        return str(p), True
    if cfg.path.startswith((".", "/", "~")) or not _HUB_ID.match(cfg.path):
        raise ConfigError("model.path", cfg.path, f"no such folder: {_EXPECTED}")
    return cfg.path, False


def _load(what: str, fn, cfg: ModelConfig, *args, **kwargs):
    """Call a ``from_pretrained`` and turn its errors into one-line config errors."""
    try:
        return fn(*args, **kwargs)
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, ImportError) as err:
        msg = str(err)
        if "trust_remote_code" in msg and not cfg.trust_remote_code:
            raise ConfigError(
                "model.trust_remote_code",
                False,
                f"{cfg.path} ships its own modelling code and is not a native architecture "
                f"({', '.join(sorted(NATIVE))}); set model.impl=remote model.trust_remote_code=true if you trust it",
            ) from err
        raise ConfigError(
            "model.path", cfg.path, f"could not load the {what} ({_one_line(err)}): {_EXPECTED}"
        ) from err


def model_class(config: Any, cfg: ModelConfig):
    import transformers
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_MASKED_LM_MAPPING,
    )

    if cfg.auto_class != "auto":
        return getattr(transformers, cfg.auto_class)
    auto_map = getattr(config, "auto_map", None) or {}
    for name in ("AutoModelForMaskedLM", "AutoModelForCausalLM", "AutoModel"):
        if name in auto_map:  # the checkpoint's own code says which class it provides
            return getattr(transformers, name)
    if type(config) in MODEL_FOR_MASKED_LM_MAPPING:
        return transformers.AutoModelForMaskedLM
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return transformers.AutoModelForCausalLM
    raise ConfigError(
        "model.auto_class",
        "auto",
        f"{cfg.path}: {type(config).__name__} has no masked- or causal-LM "
        "class in transformers; set model.auto_class",
    )


def _quantization(cfg: ModelConfig) -> dict[str, Any]:
    if not cfg.load_in_4bit:
        return {}
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(
            "model.load_in_4bit",
            True,
            "needs bitsandbytes: pip install 'diffusion-rl[quant]' (CUDA only)",
        )
    if not torch.cuda.is_available():
        raise ConfigError("model.load_in_4bit", True, "needs a CUDA GPU (bitsandbytes 4-bit)")
    from transformers import BitsAndBytesConfig

    q = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    return {"quantization_config": q, "device_map": {"": torch.cuda.current_device()}}


def _dtype_kwarg() -> str:
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _special_id(cfg_value: int | None, *candidates: Any) -> int | None:
    for v in (cfg_value, *candidates):
        if isinstance(v, (list, tuple)):
            v = v[0] if v else None
        if v is not None:
            return int(v)
    return None


def _token_id(tokenizer: Any, token: str | None, path: str | None) -> int | None:
    """The id of ``token`` (``model.eos_token``) in ``tokenizer``; one line when it has none."""
    if token is None:
        return None
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or (tid == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise ConfigError("model.eos_token", token, f"is not a token of {path}'s tokenizer")
    return int(tid)


def check_model_type(raw: dict[str, Any], src: str) -> None:
    """One line naming a ``config.json``'s ``model_type`` that neither we nor transformers implement."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    kind = raw.get("model_type")
    if kind in NATIVE or kind in CONFIG_MAPPING:
        return
    unknown = f"config.json has model_type {kind!r}: neither a native architecture ({', '.join(sorted(NATIVE))}) nor one transformers knows"
    if "auto_map" in raw:  # it ships its own code
        raise ConfigError("model.trust_remote_code", False,
                          f"{src}: {unknown}; its own code runs only with model.impl=remote model.trust_remote_code=true")
    raise ConfigError("model.path", src, unknown)


def special_ids(cfg: ModelConfig, config: Any, tokenizer: Any, model: Any) -> tuple[int, int]:
    """The mask and EOS token ids (the run's setting, else the tokenizer's or config's), checked to be
    ids of the model's vocabulary; a tokenizer without a pad token pads with EOS."""
    mask_id = _special_id(
        cfg.mask_token_id, getattr(config, "mask_token_id", None), tokenizer.mask_token_id
    )
    eos_id = _special_id(
        cfg.eos_token_id, _token_id(tokenizer, cfg.eos_token, cfg.path), tokenizer.eos_token_id,
        getattr(config, "eos_token_id", None),
    )
    if mask_id is None:
        raise ConfigError(
            "model.mask_token_id",
            None,
            f"{cfg.path}: neither the tokenizer nor the config names a mask token; set it",
        )
    if eos_id is None:
        raise ConfigError(
            "model.eos_token_id",
            None,
            f"{cfg.path}: neither the tokenizer nor the config names an EOS token; set it",
        )
    embeddings: Any = model.get_input_embeddings()
    vocab = int(embeddings.num_embeddings)
    for key, v in (("mask_token_id", mask_id), ("eos_token_id", eos_id)):
        if not 0 <= v < vocab:
            raise ConfigError(
                f"model.{key}", v, f"must be a token id of {cfg.path} (vocabulary of {vocab})"
            )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = eos_id
    return mask_id, eos_id


@MODELS.register("hf")
def build_hf(cfg: ModelConfig) -> PolicyBundle:
    from transformers import AutoConfig, AutoTokenizer, PreTrainedConfig

    src, local = resolve_path(cfg)
    remote = cfg.impl == "remote" and cfg.trust_remote_code
    common = {"trust_remote_code": remote, "local_files_only": local}
    native = None
    if cfg.impl == "native":
        raw = _load("config", PreTrainedConfig.get_config_dict, cfg, src, local_files_only=local)[0]
        check_model_type(raw, src)
        builder = ARCHITECTURES.get(raw.get("model_type"))
        if builder is not None:
            return builder(cfg, src, local, {_dtype_kwarg(): DTYPES[cfg.dtype], **cfg.extra})
        native = NATIVE.get(raw.get("model_type"))
    # our config class directly: released code imported in this process may have re-registered the type
    load_config = AutoConfig.from_pretrained if native is None else native.config_class.from_pretrained  # type: ignore[union-attr]
    config = _load("config", load_config, cfg, src, **common)
    kwargs = {_dtype_kwarg(): DTYPES[cfg.dtype], **_quantization(cfg), **cfg.extra}
    # build_policy(meta=True): the network's structure on the meta device, no weight read (an FSDP
    # process that receives its shards from the first one)
    meta = torch.get_default_device().type == "meta"
    if native is not None:
        if cfg.block_size and getattr(config, "block_size", 0) is None:  # SDAR without it in config.json
            config.block_size = cfg.block_size
        tokenizer = _load("tokenizer", load_tokenizer, cfg, src, native, local_files_only=local)
        model = native(config) if meta else _load("weights", native.from_pretrained, cfg, src, config=config,
                                                  local_files_only=local, **kwargs)
    else:
        tokenizer = _load("tokenizer", AutoTokenizer.from_pretrained, cfg, src, **common)
        own = remote_classes(config, cfg, src, local) if remote else None
        if own is not None:  # the checkpoint's own code, even where we have a class for its model_type
            config = _load("config", own[0].from_pretrained, cfg, src, local_files_only=local)
        cls = own[1] if own is not None else model_class(config, cfg)
        model = cls.from_config(config) if meta else load_weights(cls, src, config, cfg, common, kwargs)
    # no Hugging Face cache objects (ours are plain lists, models/native.py); set even where the config
    # lacks the field: transformers 5 moved it to the generation config, 4.x-era remote code still reads it
    model.config.use_cache = False

    mask_id, eos_id = special_ids(cfg, config, tokenizer, model)
    if isinstance(model, NativeLM):
        if not cfg.train_router:
            for p in model.router_parameters():
                p.requires_grad_(False)
        net, block_size = native_net(model, cfg)
        return PolicyBundle(net, tokenizer, mask_id, eos_id, int(tokenizer.pad_token_id), block_size, True)
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if cfg.attention != "native" and impl not in ("sdpa", "eager"):
        raise ConfigError(
            "model.extra.attn_implementation",
            impl,
            f"model.attention={cfg.attention} passes a 4D mask: use sdpa or eager",
        )
    net = HFDiffusionLM(model, cfg.attention, cfg.block_size, boolean_mask=impl == "sdpa")
    custom = cfg.custom_attention_mask if cfg.attention == "native" else True
    return PolicyBundle(
        net, tokenizer, mask_id, eos_id, int(tokenizer.pad_token_id), cfg.block_size, custom
    )


def native_net(model: NativeLM, cfg: ModelConfig) -> tuple[nn.Module, int]:
    """The policy network over a native model and its block size, after checking ``model.attention``
    and ``model.block_size`` against the checkpoint (its blocks are its own)."""
    name, block = type(model).__name__, model.block_size
    allowed = ("native", "block_causal") if block else ("native", "bidirectional")
    if cfg.attention not in allowed:
        why = f"block-causal over blocks of {block}" if block else "bidirectional"
        raise ConfigError("model.attention", cfg.attention, f"{name} is {why}: allowed {', '.join(allowed)}")
    if cfg.block_size not in (0, block):
        what = f"its config.json says block_size={block}" if block else "it is not a block diffusion model"
        raise ConfigError("model.block_size", cfg.block_size, f"{name}'s blocks are the checkpoint's: {what}")
    if hasattr(model.config, "mask_padding"):  # LLaDA: the released forward attends over padding
        model.config.mask_padding = cfg.attention == "bidirectional"
    return NativeDiffusionLM(model), block


def remote_classes(config: Any, cfg: ModelConfig, src: str, local: bool) -> tuple[Any, Any] | None:
    """The config and model classes the checkpoint's ``auto_map`` names (``model.auto_class``, else
    the first of masked-LM, causal-LM, base model it lists), or None if it ships no code. Taken from
    the map itself: transformers 5 prefers a registered class (ours, for llada / Dream / sdar) even
    with ``trust_remote_code``."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    auto_map = getattr(config, "auto_map", None) or {}
    names = [cfg.auto_class] if cfg.auto_class != "auto" else ["AutoModelForMaskedLM", "AutoModelForCausalLM", "AutoModel"]
    name = next((n for n in names if n in auto_map), None)
    if name is None or "AutoConfig" not in auto_map:
        return None
    get = lambda ref: get_class_from_dynamic_module(ref, src, local_files_only=local)  # noqa: E731
    return get(auto_map["AutoConfig"]), get(auto_map[name])


def load_weights(cls, src: str, config: Any, cfg: ModelConfig, common: dict[str, Any], kwargs: dict[str, Any]):
    """``cls.from_pretrained``; remote code that never calls ``post_init()`` (written for
    transformers 4.x) is loaded again through a subclass that calls it after ``__init__``."""
    try:
        return _load("weights", cls.from_pretrained, cfg, src, config=config, **common, **kwargs)
    except AttributeError as err:
        if not (common["trust_remote_code"] and "all_tied_weights_keys" in str(err)):
            raise
    import transformers

    log.warning("model.impl=remote: %s does not call post_init(), which transformers %s needs; loading it "
                "through a subclass that calls it after __init__", cls.__name__, transformers.__version__)
    return _load("weights", post_init_shim(cls).from_pretrained, cfg, src, config=config, **common, **kwargs)


def post_init_shim(remote_cls: Any) -> Any:
    """``remote_cls`` with ``post_init()`` after ``__init__`` and a ``tie_weights`` that takes the
    arguments transformers 5 passes (4.x-era code defines ``tie_weights(self)``)."""

    class Shimmed(remote_cls):  # type: ignore[valid-type, misc]
        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            if not hasattr(self, "all_tied_weights_keys"):
                self.post_init()

        def tie_weights(self, *args, **kwargs):
            try:
                return super().tie_weights(*args, **kwargs)
            except TypeError:  # the 4.x signature
                return super().tie_weights()

    Shimmed.__name__ = Shimmed.__qualname__ = remote_cls.__name__
    return Shimmed


class HFDiffusionLM(nn.Module):
    """``net(input_ids=, attention_mask=, position_ids=) -> .logits`` over a Hugging Face model.

    attention_mask: ``(B, L)`` padding mask (1 = real token), a boolean ``(B|1, 1, L, L)`` "may
    attend" mask, or None. ``keep`` / ``targets`` / ``select`` (models/heads.py) run the model's body
    (``base_model``) and its output head (``get_output_embeddings()``) apart, so the head is applied
    only where asked; whether ``head(body(x))`` is the model's own output (a model may scale or cap
    its logits after the head) is checked once, on the first such call, against a full forward of one
    row, and where it is not the full logits are computed and then sliced (with a warning).
    """

    supports_kv_cache = False  # the block sampler reruns the prefix (no Hugging Face cache here)

    def __init__(
        self,
        model: nn.Module,
        attention: str = "bidirectional",
        block_size: int = 0,
        boolean_mask: bool = True,
    ):
        super().__init__()
        self.model = model
        self.attention, self.block_size, self.boolean_mask = attention, block_size, boolean_mask
        self._split_ok: bool | None = None  # checked on the first call with keep / targets

    @property
    def config(self):
        return self.model.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, keep: slice | None = None,
                targets: torch.Tensor | None = None, select: torch.Tensor | None = None, **kwargs: Any):
        inputs = {"input_ids": input_ids, **self.model_inputs(input_ids, attention_mask, position_ids), **kwargs}
        if keep is None and targets is None:
            return self.model(**inputs)
        split = self.body_and_head(inputs)
        if split is None:  # the full logits, then the positions asked for
            logits = self.model(**inputs).logits  # (B, L, V)
            return logits_outputs(logits, keep, targets, select)
        body, head = split
        return head_outputs(body(**inputs).last_hidden_state, head, keep, targets, select)

    def body_and_head(self, inputs: dict[str, Any]) -> tuple[nn.Module, nn.Module] | None:
        """The model's body and output head when ``head(body(x))`` are its logits (checked once)."""
        body = getattr(self.model, getattr(self.model, "base_model_prefix", "") or "", None)
        get_head: Any = getattr(self.model, "get_output_embeddings", None)
        head = get_head() if callable(get_head) else None
        if body is None or head is None or body is self.model or self._split_ok is False:
            return None
        if self._split_ok is None:
            one = {k: (v[:1] if isinstance(v, torch.Tensor) and v.shape[:1] == inputs["input_ids"].shape[:1] else v)
                   for k, v in inputs.items()}
            with torch.no_grad():
                full = self.model(**one).logits
                hidden = getattr(body(**one), "last_hidden_state", None)
                self._split_ok = hidden is not None and torch.allclose(head(hidden).float(), full.float(),
                                                                      rtol=1e-3, atol=1e-3)
            if not self._split_ok:
                log.warning("%s: its logits are not head(body(x)); computing every position's logits and "
                            "slicing them (more memory)", type(self.model).__name__)
                return None
        return body, head

    def model_inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     position_ids: torch.Tensor | None) -> dict[str, Any]:
        """``attention_mask`` / ``position_ids`` as the wrapped model takes them (``model.attention``)."""
        if self.attention == "native":
            return {"attention_mask": attention_mask, **({} if position_ids is None else {"position_ids": position_ids})}
        B, L = input_ids.shape
        device = input_ids.device
        if attention_mask is None or attention_mask.dim() == 2:
            keep = (
                torch.ones(B, L, dtype=torch.bool, device=device)
                if attention_mask is None
                else attention_mask.bool()
            )
            if position_ids is None:
                position_ids = (keep.long().cumsum(-1) - 1).clamp(min=0)  # (B, L) skip left padding
            allowed = keep[:, None, None, :].expand(B, 1, L, L)  # (B, 1, L, L) every real key
            if self.attention == "block_causal":
                blk = torch.arange(L, device=device) // self.block_size
                allowed = allowed & (blk[None, :] <= blk[:, None])[None, None]
        else:
            allowed = attention_mask.bool().expand(B, 1, L, L)
        if position_ids is None:
            position_ids = torch.arange(L, device=device).expand(B, L)
        # a query with no key left (a padding block) attends to itself: no all-masked softmax row
        allowed = allowed | torch.eye(L, dtype=torch.bool, device=device)[None, None]
        if self.boolean_mask:  # sdpa takes "may attend" booleans whatever the compute dtype
            mask = allowed
        else:  # eager attention adds the mask to its scores
            dtype = next(self.model.parameters()).dtype
            dtype = dtype if dtype.is_floating_point else torch.float32
            mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
                ~allowed, torch.finfo(dtype).min
            )
        return {"attention_mask": mask, "position_ids": position_ids}

