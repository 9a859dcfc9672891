"""Tiny random checkpoints in the released layouts of LLaDA, Dream and SDAR, written without our
model classes: ``config.json`` with the released fields (sizes shrunk), sharded safetensors under the
released key names with an index, and a tokenizer in the released format whose special tokens sit at
the released ids (``real_ids=True``: the vocabulary is padded with filler tokens up to them).

The key names and config fields are transcribed from the released ``config.json``,
``model.safetensors.index.json`` and modelling files (docs/methods.md §9); they are independent of
``src/diffusion_rl/models`` on purpose, so a wrong name there fails to load here.

Write one for the user path (``python src/train.py model=llada_8b_instruct model.path=...``)::

    python -m tests.released_layouts llada /tmp/tiny-llada      # or dream, sdar, diffucoder, trado
"""

from __future__ import annotations

import argparse
import json
import string
from pathlib import Path

import torch

CHARS = [c for c in string.printable if c not in "\x0b\x0c\r"]  # every task's text, one token per character

# ---- config.json as released (the 8B / 7B values), and the fields shrunk for a tiny model --------------
LLADA = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                 "AutoModel": "modeling_llada.LLaDAModelLM"},
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 4096,
    "embedding_dropout": 0.0, "embedding_size": 126464, "eos_token_id": 126081, "flash_attention": False,
    "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
    "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
    "layer_norm_with_affine": True, "mask_token_id": 126336, "max_sequence_length": 4096, "mlp_hidden_size": 12288,
    "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None, "n_heads": 32, "n_kv_heads": 32,
    "n_layers": 32, "pad_token_id": 126081, "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05,
    "rope": True, "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
    "transformers_version": "4.46.3", "use_cache": False, "vocab_size": 126464,
    "weight_tying": False,
}
DREAM = {
    "architectures": ["DreamModel"], "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
    "initializer_range": 0.02, "intermediate_size": 18944, "mask_token_id": 151666,
    "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "Dream", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "pad_token_id": 151643, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.46.2", "use_cache": True, "use_mrope": False,
    "use_sliding_window": False, "vocab_size": 152064,
}
SDAR = {
    "architectures": ["SDARForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                 "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
    "block_size": 4, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288, "mask_token_id": 151669,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "sdar", "num_attention_heads": 32,
    "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.52.4", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
# DiffuCoder-7B-Instruct (apple/DiffuCoder-7B-Instruct, config.json at commit 69c039a): Dream's fields and
# values but these two. Its tokenizer files (added_tokens.json, tokenizer_config.json) were not found in a
# public copy: the specials below are Dream's Qwen2.5 ones (<|im_end|> included, the EOS its training code
# names), not DiffuCoder's <|dlm_pad|>, whose id is unknown
DIFFUCODER = {**DREAM, "transformers_version": "4.51.3", "use_cache": False}
# TraDo-4B/8B-Instruct (Gen-Verse/TraDo-*): model_type sdar, block size 4 (dLLM-RL's rl_trado.yaml,
# trado_eval.yaml); their config.json was not found in a public copy, so SDAR-8B-Chat's fields stand in
TRADO = dict(SDAR)
RELEASED = {"llada": LLADA, "dream": DREAM, "sdar": SDAR, "diffucoder": DIFFUCODER, "trado": TRADO}
FAMILY = {"llada": "llada", "dream": "dream", "sdar": "sdar", "diffucoder": "dream", "trado": "sdar"}
TINY = {  # grouped-query attention wherever the architecture has it
    "llada": {"d_model": 32, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2, "mlp_hidden_size": 48,
              "max_sequence_length": 512},
    "dream": {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "intermediate_size": 48, "max_window_layers": 2, "max_position_embeddings": 512},
    "sdar": {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "num_hidden_layers": 2, "intermediate_size": 48, "max_window_layers": 2, "max_position_embeddings": 512},
}
TINY.update(diffucoder=TINY["dream"], trado=TINY["sdar"])
VOCAB = {"llada": ("vocab_size", "embedding_size"), "dream": ("vocab_size",), "sdar": ("vocab_size",),
         "diffucoder": ("vocab_size",), "trado": ("vocab_size",)}

# ---- special tokens at the released ids ------------------------------------------------------------------
SPECIALS = {
    "llada": {126080: "<|startoftext|>", 126081: "<|endoftext|>", 126336: "<|mdm_mask|>",
              126346: "<|start_header_id|>", 126347: "<|end_header_id|>", 126348: "<|eot_id|>"},
    "dream": {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>", 151665: "<|beginoftext|>",
              151666: "<|mask|>"},
    "sdar": {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>", 151669: "<|MASK|>"},
}
ROLES = {  # which special is which, as in each tokenizer_config.json
    "llada": {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},  # mask: config.json
    "dream": {"bos_token": "<|beginoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
              "mask_token": "<|mask|>"},
    "sdar": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "mask_token": "<|MASK|>"},
}
SPECIALS.update(diffucoder=SPECIALS["dream"], trado=SPECIALS["sdar"])
ROLES.update(diffucoder=ROLES["dream"], trado=ROLES["sdar"])


def released_config(arch: str, real_ids: bool = True) -> dict:
    """The released ``config.json`` with tiny sizes; ``real_ids=False`` also shrinks the vocabulary to
    the characters plus the special tokens (renumbered right after them)."""
    cfg = {**RELEASED[arch], **TINY[arch]}
    if not real_ids:
        ids = small_ids(arch)
        for key in VOCAB[arch]:
            cfg[key] = n_regular(arch) + len(SPECIALS[arch])
        for key in ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"):
            if cfg.get(key) is not None:
                cfg[key] = ids[cfg[key]]
    return cfg


def n_regular(arch: str) -> int:
    """Regular tokens before the fillers: characters (LLaDA's word-level stand-in) or the 256 byte symbols."""
    return len(CHARS) if FAMILY[arch] == "llada" else 256


def small_ids(arch: str) -> dict[int, int]:
    """Released special id -> its id in the small vocabulary (right after the regular tokens)."""
    return {rid: n_regular(arch) + i for i, rid in enumerate(sorted(SPECIALS[arch]))}


def released_weights(arch: str, cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random fp32 tensors under the released key names and shapes (norm weights near 1)."""
    g = torch.Generator().manual_seed(seed)
    shapes: dict[str, tuple[int, ...]] = {}
    arch = FAMILY[arch]
    if arch == "llada":
        d, h, n = cfg["d_model"], cfg["mlp_hidden_size"], cfg["n_heads"]
        kv = (cfg["n_kv_heads"] or n) * (d // n)
        V = cfg["embedding_size"] or cfg["vocab_size"]
        shapes["model.transformer.wte.weight"] = (V, d)
        for i in range(cfg["n_layers"]):
            p = f"model.transformer.blocks.{i}."
            shapes.update({p + "attn_norm.weight": (d,), p + "q_proj.weight": (d, d), p + "k_proj.weight": (kv, d),
                           p + "v_proj.weight": (kv, d), p + "attn_out.weight": (d, d), p + "ff_norm.weight": (d,),
                           p + "ff_proj.weight": (h, d), p + "up_proj.weight": (h, d), p + "ff_out.weight": (d, h)})
        shapes["model.transformer.ln_f.weight"] = (d,)
        shapes["model.transformer.ff_out.weight"] = (V, d)
    else:
        d, m, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
        hd = cfg.get("head_dim") or d // cfg["num_attention_heads"]
        q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
        shapes["model.embed_tokens.weight"] = (V, d)
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            shapes.update({p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
                           p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
                           p + "mlp.gate_proj.weight": (m, d), p + "mlp.up_proj.weight": (m, d),
                           p + "mlp.down_proj.weight": (d, m), p + "input_layernorm.weight": (d,),
                           p + "post_attention_layernorm.weight": (d,)})
            if arch == "dream":  # Qwen2: biases on q, k, v only
                shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                               p + "self_attn.v_proj.bias": (kv,)})
            else:  # Qwen3: per-head RMSNorm of q and k
                shapes.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
        shapes["model.norm.weight"] = (d,)
        if not cfg.get("tie_word_embeddings"):
            shapes["lm_head.weight"] = (V, d)
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1 and "norm" in name:
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            out[name] = 0.02 * torch.randn(shape, generator=g) if "bias" not in name else 0.1 * torch.randn(shape, generator=g)
    out = {k: v * 10 if k.endswith(("wte.weight", "embed_tokens.weight")) else v for k, v in out.items()}  # unit-ish activations
    return out


def write_weights(folder: Path, weights: dict[str, torch.Tensor], shards: int = 2) -> None:
    """Sharded safetensors with a ``model.safetensors.index.json``, as the released folders have."""
    from safetensors.torch import save_file

    names = sorted(weights)
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: weights[n].contiguous() for n in names[s * per:(s + 1) * per]}
        save_file(part, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    total = sum(t.numel() * t.element_size() for t in weights.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": weight_map}, indent=2))


def write_tokenizer(arch: str, folder: Path, real_ids: bool = True) -> None:
    """LLaDA: ``tokenizer.json`` (fast, word-level over characters); Dream / SDAR: Qwen2's byte-level BPE
    files (``vocab.json``, ``merges.txt``) with the specials in ``tokenizer_config.json``; Dream's config
    names its shipped-as-code ``DreamTokenizer``, as released."""
    specials = SPECIALS[arch] if real_ids else {small_ids(arch)[k]: v for k, v in SPECIALS[arch].items()}
    first = min(specials)
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for i, t in sorted(specials.items())}
    config = {**ROLES[arch], "added_tokens_decoder": added, "model_max_length": 4096, "clean_up_tokenization_spaces": False}
    arch = FAMILY[arch]
    if arch == "llada":
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        vocab = {c: i for i, c in enumerate(CHARS)}
        vocab.update({f"<|reserved_{i}|>": i for i in range(len(CHARS), first)})
        vocab.update({t: i for i, t in specials.items()})
        vocab.update({f"<|reserved_{i}|>": i for i in range(first, max(specials) + 1) if i not in specials})
        tk = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
        tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tk.decoder = decoders.Fuse()
        tk.add_special_tokens(list(specials.values()))
        PreTrainedTokenizerFast(tokenizer_object=tk, **ROLES[arch]).save_pretrained(folder)
        tc = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**tc, "tokenizer_class": "PreTrainedTokenizerFast"}))
        return
    from tokenizers import pre_tokenizers

    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 byte-level symbols
    bpe = {c: i for i, c in enumerate(byte_chars)}
    bpe.update({f"<|filler_{i}|>": i for i in range(len(bpe), first)})
    (folder / "vocab.json").write_text(json.dumps(bpe, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    # ids between the specials (Qwen's other added tokens) keep their places
    for i in range(first, max(specials) + 1):
        added.setdefault(str(i), {**added[str(first)], "content": f"<|reserved_{i}|>"})
    config["added_tokens_decoder"] = dict(sorted(added.items(), key=lambda kv: int(kv[0])))
    if arch == "dream":
        config.update(tokenizer_class="DreamTokenizer", auto_map={"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]})
    else:
        config["tokenizer_class"] = "Qwen2Tokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def write_checkpoint(arch: str, folder: Path | str, real_ids: bool = True, seed: int = 0,
                     overrides: dict | None = None) -> Path:
    """A tiny random checkpoint of ``arch`` (llada | dream | sdar | diffucoder | trado) in its released layout."""
    if real_ids and n_regular(arch) >= min(SPECIALS[arch]):
        raise AssertionError("characters overlap the released special ids")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {**released_config(arch, real_ids), **(overrides or {})}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    write_weights(folder, released_weights(arch, cfg, seed))
    write_tokenizer(arch, folder, real_ids)
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arch", choices=sorted(RELEASED))
    parser.add_argument("folder")
    parser.add_argument("--small-vocab", action="store_true", help="renumber the special tokens after the characters")
    args = parser.parse_args()
    path = write_checkpoint(args.arch, args.folder, real_ids=not args.small_vocab)
    print(f"wrote a tiny {args.arch} checkpoint in the released layout to {path}")
