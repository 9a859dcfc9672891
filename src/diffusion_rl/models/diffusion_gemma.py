"""DiffusionGemma behind the policy interface: transformers' own ``DiffusionGemmaForBlockDiffusion``
(native since transformers 5.11), no network code of ours.

``model=diffusion_gemma`` loads the released folder (``google/diffusiongemma-26B-A4B-it``) through the
``hf`` builder, which hands a ``model_type: diffusion_gemma`` folder to :func:`build_released` here;
``model=diffusion_gemma_tiny`` builds a random model of the same architecture in-process (only the sizes
differ from the released config.json; the embedded character tokenizer) for tests and the CPU testbed.

What differs from every other model of the project (docs/real_models.md "DiffusionGemma"):

- *Uniform-state noise.* There is no mask token: a noised position holds a random vocabulary token.
  The bundle says so (``PolicyBundle.noise = "uniform"``, ``mask_token_id = NO_MASK``); samplers,
  estimators and objectives that read masked positions refuse such a model at start-up.
- *Encoder and decoder.* A causal encoder (Gemma 4 with its MoE layers) fills a key/value cache with
  the context (prompt and finished canvases); a bidirectional decoder with the *same* weights denoises
  one canvas of ``canvas_length`` tokens (256 released) that attends to that cache and to itself, its
  input embeddings summed with a self-conditioning signal: the previous denoising step's
  temperature-scaled prediction as an expected embedding, ``softmax(logits / T) @ E * sqrt(H)``, through
  a gated MLP (zeros at a canvas's first step). Logits are soft-capped at 30 (``tanh``).

:class:`DiffusionGemmaLM` is the one call every sampler, estimator and objective makes, so LoRA,
activation checkpointing and FSDP wrap it as any other network::

    net(input_ids=context, attention_mask=mask, canvas=canvas, self_conditioning=signal, cache=cache,
        soft_temperature=T)                      -> .logits (B, C, V) fp32, .soft (B, C, H), .cache
    net(..., targets=x, select=m, temperature=t) -> .token_logps (B, C) log softmax(logits / t)[x] at m

``input_ids`` are the context tokens not in ``cache`` yet (all of them without a cache); positions and
masks follow transformers' ``generate``: positions count every column (left padding too), padding keys
are masked. ``self_conditioning`` (B, C, H) is injected where the decoder would compute it from logits
(a forward pre-hook on its ``self_conditioning`` module, for the duration of the call): a recorded
signal replays a denoising step exactly. ``soft_temperature`` returns the signal of this call's
logits for the next step, computed inside the call (an FSDP root's embedding is gathered only there).
With ``targets`` the head runs only at ``select`` (the head, soft cap and temperature of transformers'
forward, in chunks: 256 positions of fp32 logits at the 262,144-token vocabulary are 268 MB per row).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.heads import token_logps_chunked
from diffusion_rl.models.hf import ARCHITECTURES, _load
from diffusion_rl.models.policy import MODELS, NO_MASK, ModelConfig, PolicyBundle
from diffusion_rl.models.tokenizer import CharTokenizer

log = logging.getLogger(__name__)

MODEL_TYPE = "diffusion_gemma"
# The tiny model: the sizes, and only those, differ from the released config.json
# (tests/fixtures/released/DiffusionGemma-26B-A4B-it/config.json; tests/unit/models/test_diffusion_gemma.py
# checks the other fields). From model.d_model / n_layers / n_heads, in the released proportions: the
# dense MLP 3/4 of the width and each expert 1/4 (2112 and 704 of 2816), half as many key/value heads as
# query heads on sliding layers (8 of 16) and one on full layers (2), full layers' heads twice as wide
# (512 against 256); 4 experts of which 2 route each token (128 and 8 released).
TINY_VISION = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
               "num_key_value_heads": 2, "head_dim": 8, "global_head_dim": 8, "position_embedding_size": 64}
# the released config.json's values of the fields that are not sizes (the tiny builder takes them)
RELEASED_TEXT = {"hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6,
                 "sliding_window": 1024, "use_bidirectional_attention": "vision", "tie_word_embeddings": True,
                 "attention_bias": False, "attention_dropout": 0.0,
                 "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                                        "rope_type": "proportional"},
                                     "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}}


@dataclass
class CanvasOutput:
    """One call of :class:`DiffusionGemmaLM`."""

    logits: torch.Tensor | None = None  # (B, C, V) fp32, soft-capped, temperature 1
    token_logps: torch.Tensor | None = None  # (B, C) fp32 with targets: log softmax(logits / t)[target], 0 off select
    soft: torch.Tensor | None = None  # (B, C, H) the next step's self-conditioning signal (soft_temperature)
    cache: Any = None  # the key/value cache holding the context


class DiffusionGemmaLM(nn.Module):
    """transformers' ``DiffusionGemmaForBlockDiffusion`` as the policy network (see the module docstring)."""

    noise = "uniform"
    supports_kv_cache = False  # the masked-diffusion samplers' cache convention (KVCacheLM) does not apply

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model: Any = model  # transformers' DiffusionGemmaForBlockDiffusion (its attributes are dynamic)

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def canvas_length(self) -> int:
        return int(self.model.config.canvas_length)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.text_config.vocab_size)

    def new_cache(self) -> Any:
        """An empty key/value cache for the encoder (sliding-window layers keep their window only)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config.get_text_config(decoder=True))

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None, *,
                canvas: torch.Tensor, self_conditioning: torch.Tensor | None = None, cache: Any = None,
                soft_temperature: torch.Tensor | float | None = None, targets: torch.Tensor | None = None,
                select: torch.Tensor | None = None, temperature: torch.Tensor | float | None = None) -> CanvasOutput:
        """Encode ``input_ids`` (B, S) into ``cache`` (a new one if None) and denoise ``canvas`` (B, C).

        ``attention_mask`` (B, past + S) covers the cached and the new context (1 = real token; None:
        all real). ``soft_temperature`` (float or (B,)): also return the self-conditioning signal of
        ``logits / T``. ``targets`` / ``select`` (B, C) and ``temperature`` (float or (B,)): return the
        log-probabilities of ``targets`` at ``select`` under ``softmax(logits / temperature)`` instead of
        the logits."""
        B, C = canvas.shape
        cache = self.new_cache() if cache is None else cache
        past = int(cache.get_seq_length())
        S = 0 if input_ids is None else input_ids.shape[1]
        if past + S == 0:
            raise ValueError("DiffusionGemma denoises a canvas after a context: give input_ids or a filled cache")
        device = canvas.device
        mask = torch.ones(B, past + S, dtype=torch.bool, device=device) if attention_mask is None else attention_mask.bool()
        if mask.shape != (B, past + S):
            raise ValueError(f"attention_mask {tuple(mask.shape)} must cover the cached and new context ({B}, {past + S})")
        kw: dict[str, Any] = {
            "input_ids": input_ids if S else None, "attention_mask": mask, "cache": cache,
            "position_ids": torch.arange(past, past + S, device=device)[None],
            "decoder_input_ids": canvas,
            "decoder_attention_mask": torch.cat([mask, torch.ones(B, C, dtype=torch.bool, device=device)], 1),
            "decoder_position_ids": torch.arange(past + S, past + S + C, device=device)[None],
        }
        with self._conditioned(self_conditioning):
            if targets is None:
                logits = self.model(**kw).logits.float()  # (B, C, V) transformers' own head and soft cap
                soft = None if soft_temperature is None else self.soft_embedding(logits, soft_temperature)
                return CanvasOutput(logits=logits, soft=soft, cache=cache)
            hidden = self.model.model(**kw).last_hidden_state  # (B, C, H)
        return CanvasOutput(token_logps=self._token_logps(hidden, targets, select, temperature), cache=cache)

    @contextmanager
    def _conditioned(self, signal: torch.Tensor | None) -> Iterator[None]:
        """The decoder's self-conditioning input replaced by ``signal`` (B, C, H) for one call; None:
        transformers' own zeros (no previous step)."""
        if signal is None:
            yield
            return

        def swap(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            return (args[0], signal.to(args[0].dtype))

        handle = self.model.model.decoder.self_conditioning.register_forward_pre_hook(swap)
        try:
            yield
        finally:
            handle.remove()

    def soft_embedding(self, logits: torch.Tensor, temperature: torch.Tensor | float) -> torch.Tensor:
        """The self-conditioning signal of ``logits / temperature`` (B, C, V) -> (B, C, H), as transformers'
        decoder computes it from ``self_conditioning_logits`` (cast to the embedding dtype, softmax in
        fp32, expected embedding times ``sqrt(H)``)."""
        emb = self.model.model.decoder.embed_tokens
        w = emb.weight
        t = temperature
        if isinstance(t, torch.Tensor):
            t = t.to(logits) if t.dim() == 0 else t.to(logits)[:, None, None]  # a scalar, or one per row
        probs = (logits / t).to(w.dtype).softmax(-1, dtype=torch.float32).to(w.dtype)
        return torch.matmul(probs, w) * emb.embed_scale.to(w.dtype)

    def _token_logps(self, hidden: torch.Tensor, targets: torch.Tensor, select: torch.Tensor | None,
                     temperature: torch.Tensor | float | None) -> torch.Tensor:
        """log softmax(softcap(head(hidden)) / t)[targets] at ``select``, one chunked pass per distinct t."""
        B = hidden.shape[0]
        sel = torch.ones_like(targets, dtype=torch.bool) if select is None else select.bool()
        t = torch.ones(B) if temperature is None else torch.as_tensor(temperature, dtype=torch.float32).expand(B)
        t = t.float().cpu()
        out = hidden.new_zeros(targets.shape, dtype=torch.float32)
        for value in t.unique().tolist():
            rows = (t == value).to(sel.device)[:, None]
            head = _TemperedHead(self.model.lm_head, float(self.model.final_logit_softcapping), value)
            out = out + token_logps_chunked(head, hidden, targets, sel & rows)
        return out

    def router_parameters(self) -> list[nn.Parameter]:
        """The routers' weights (projection, input scale, per-expert scale): frozen unless model.train_router."""
        return [p for name, p in self.named_parameters() if ".router." in name]

    def vision_parameters(self) -> list[nn.Parameter]:
        """The vision tower and its projection: text-only RL never runs them, so they never train."""
        return [p for name, p in self.named_parameters() if ".vision_tower." in name or ".embed_vision." in name]

    def tie_adapters(self) -> None:
        """After LoRA (``models/adapters.py``): every encoder layer's adapters become its decoder twin's.
        The released model ties the encoder's weights to the decoder's (one tensor each); peft wraps the two
        modules apart, so without this the two halves would train different adapters."""
        encoder = self.model.model.encoder.language_model.layers
        decoder = self.model.model.decoder.layers
        for enc_layer, dec_layer in zip(encoder, decoder):
            dec_modules = dict(dec_layer.named_modules())
            for name, enc in enc_layer.named_modules():
                dec = dec_modules.get(name)
                if dec is None or not hasattr(enc, "lora_A"):
                    continue
                for part in ("lora_A", "lora_B", "lora_dropout", "lora_embedding_A", "lora_embedding_B"):
                    if hasattr(dec, part):
                        setattr(enc, part, getattr(dec, part))


class _TemperedHead(nn.Module):
    """transformers' head and soft cap, divided by a temperature: ``tanh(head(h) / cap) * cap / t`` in fp32."""

    def __init__(self, head: nn.Module, cap: float, temperature: float):
        super().__init__()
        self.head, self.cap, self.temperature = head, cap, temperature
        self.out_features = getattr(head, "out_features", None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden).float()
        return torch.tanh(logits / self.cap) * self.cap / self.temperature


def check_model_options(cfg: ModelConfig, canvas_length: int) -> None:
    """What the ModelConfig may set for DiffusionGemma: its attention is its own; ``model.block_size`` is the
    canvas (0: the checkpoint's)."""
    if cfg.attention not in ("native", "bidirectional"):
        raise ConfigError("model.attention", cfg.attention,
                          "DiffusionGemma has its own attention (causal encoder, bidirectional decoder): native")
    if cfg.block_size not in (0, canvas_length):
        raise ConfigError("model.block_size", cfg.block_size,
                          f"DiffusionGemma's block is its canvas, canvas_length={canvas_length} in config.json (or 0)")
    if cfg.load_in_4bit:
        raise ConfigError("model.load_in_4bit", True, "not supported for DiffusionGemma (its experts are fused 3D tensors)")


def bundle_of(model: nn.Module, tokenizer: Any, cfg: ModelConfig) -> PolicyBundle:
    """The policy over a DiffusionGemma model: routers frozen unless asked, the vision tower frozen."""
    net = DiffusionGemmaLM(model)
    frozen = net.vision_parameters() + ([] if cfg.train_router else net.router_parameters())
    for p in frozen:
        p.requires_grad_(False)
    eos = cfg.eos_token_id
    if eos is None and cfg.eos_token is not None:
        eos = tokenizer.convert_tokens_to_ids(cfg.eos_token)
        if eos is None or eos == tokenizer.unk_token_id:
            raise ConfigError("model.eos_token", cfg.eos_token, "is not a token of the model's tokenizer")
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None or not 0 <= int(eos) < net.vocab_size:
        raise ConfigError("model.eos_token_id", eos, f"must be a token id of the vocabulary ({net.vocab_size})")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = int(eos)
    return PolicyBundle(net, tokenizer, NO_MASK, int(eos), int(tokenizer.pad_token_id), 0, False, noise="uniform")


def tiny_text(hidden: int, layers: int, heads: int) -> dict[str, Any]:
    """The sizes of a tiny text config (see ``TINY_VISION``'s comment); layer types in the released 5:1
    pattern, the last layer full."""
    head_dim = hidden // heads
    return {"hidden_size": hidden, "intermediate_size": 3 * hidden // 4, "moe_intermediate_size": max(hidden // 4, 1),
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": max(heads // 2, 1),
            "num_global_key_value_heads": 1, "head_dim": head_dim, "global_head_dim": 2 * head_dim,
            "num_experts": 4, "top_k_experts": 2, "max_position_embeddings": 4096,
            "layer_types": ["full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention"
                            for i in range(layers)]}


def tiny_config(vocab_size: int, hidden: int, layers: int, heads: int, canvas_length: int, pad_id: int, eos_id: int,
                bos_id: int) -> Any:
    """transformers' ``DiffusionGemmaConfig`` with the released fields and tiny sizes."""
    from transformers import DiffusionGemmaConfig

    text = {**RELEASED_TEXT, **tiny_text(hidden, layers, heads), "vocab_size": vocab_size,
            "pad_token_id": pad_id, "eos_token_id": eos_id, "bos_token_id": bos_id}
    return DiffusionGemmaConfig(text_config=text, vision_config={"model_type": "gemma4_vision", **TINY_VISION},
                                canvas_length=canvas_length, tie_word_embeddings=True,
                                eos_token_id=eos_id)  # type: ignore[call-arg]  # a PreTrainedConfig field


@MODELS.register("diffusion_gemma_tiny")
def build_tiny(cfg: ModelConfig) -> PolicyBundle:
    """A random DiffusionGemma of the released architecture at tiny sizes (``model.d_model`` wide,
    ``model.n_layers`` deep, ``model.n_heads`` heads, ``model.block_size`` tokens a canvas), with the
    embedded character tokenizer."""
    from transformers import DiffusionGemmaForBlockDiffusion

    if cfg.block_size < 1:
        raise ConfigError("model.block_size", cfg.block_size, "the tiny DiffusionGemma's canvas length: must be >= 1")
    check_model_options(cfg, cfg.block_size)
    tok = CharTokenizer()
    config = tiny_config(tok.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.block_size, tok.pad_token_id,
                         tok.eos_token_id, tok.bos_token_id)
    config._attn_implementation = "sdpa"
    model = DiffusionGemmaForBlockDiffusion(config)
    return bundle_of(model.eval(), tok, cfg)


def build_released(cfg: ModelConfig, src: str, local: bool, kwargs: dict[str, Any]) -> PolicyBundle:
    """A released DiffusionGemma folder (or hub id) through transformers' class, called by the ``hf``
    builder for ``model_type: diffusion_gemma``; ``kwargs`` are its ``from_pretrained`` arguments."""
    from transformers import AutoTokenizer, DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    config = _load("config", DiffusionGemmaConfig.from_pretrained, cfg, src, local_files_only=local)
    check_model_options(cfg, int(config.canvas_length))
    tokenizer = _load("tokenizer", AutoTokenizer.from_pretrained, cfg, src, local_files_only=local)
    if torch.get_default_device().type == "meta":  # build_policy(meta=True): the structure only
        model = DiffusionGemmaForBlockDiffusion(config)
    else:
        model = _load("weights", DiffusionGemmaForBlockDiffusion.from_pretrained, cfg, src, config=config,
                      local_files_only=local, **kwargs)
    model.config.use_cache = False
    return bundle_of(model.eval(), tokenizer, cfg)


ARCHITECTURES[MODEL_TYPE] = build_released  # model=hf (and its presets) on a diffusion_gemma folder


__all__ = ["CanvasOutput", "DiffusionGemmaLM", "build_released", "build_tiny", "tiny_config"]
