"""Tiny random checkpoints built from the released files: the released ``config.json`` (a byte-for-byte
copy in ``tests/fixtures/released/<model>/``, source in its ``SOURCES.json``) with only the sizes
shrunk, sharded safetensors under the released key names with an index, the released tokenizer
config, special-tokens map and added tokens, and a stand-in vocabulary (the released ``vocab.json`` /
``tokenizer.json`` are megabytes) that holds every special token the tokenizer config lists at its
released id.

``real_ids=False`` renumbers the special tokens right after the regular ones (a vocabulary of a few
hundred, for speed): ids in the config and tokenizer files change, every other field stays as released.

The key names are written here from the released weight indexes and modelling files (docs/methods.md
§9), independently of ``src/diffusion_rl/models``, so a wrong name there fails to load here.

Write one for the user path (``python src/train.py model=sdar_8b_chat model.path=...``)::

    python -m tests.helpers.released_layouts sdar /tmp/tiny-sdar      # any name of RELEASE
"""

from __future__ import annotations

import argparse
import json
import shutil
import string
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "released"
CHARS = [c for c in string.printable if c not in "\x0b\x0c\r"]  # every task's text, one token per character

# ---- which released folder each layout is built from -------------------------------------------------
RELEASE = {
    "llada": "LLaDA-8B-Instruct", "llada_1_5": "LLaDA-1.5", "dream": "Dream-v0-Instruct-7B",
    "sdar": "SDAR-8B-Chat", "sdar_4b": "SDAR-4B-Chat", "sdar_1_7b": "SDAR-1.7B-Chat",
    "llada2": "LLaDA2.0-mini", "llada2_1": "LLaDA2.1-mini",
    # no public copy of these checkpoints' files was found (SOURCES.json): the released files of the
    # model each was trained from stand in
    "diffucoder": "Dream-v0-Instruct-7B", "trado": "SDAR-8B-Chat", "trado_4b": "SDAR-4B-Chat",
}
FAMILY = {a: "llada2" if a.startswith("llada2") else "llada" if a.startswith("llada")
          else "sdar" if a.startswith(("sdar", "trado")) else "dream" for a in RELEASE}
PRESET = {  # model=<preset> -> the layout its test loads
    "llada_8b_instruct": "llada", "llada_1_5": "llada_1_5", "dream_7b_instruct": "dream",
    "diffucoder_7b_instruct": "diffucoder", "sdar_8b_chat": "sdar", "sdar_4b_chat": "sdar_4b",
    "sdar_1_7b_chat": "sdar_1_7b", "trado_8b_instruct": "trado", "trado_4b_instruct": "trado_4b",
    "llada2_mini": "llada2", "llada2_1_mini": "llada2_1",
}
# model.block_size for a layout loaded without its preset: the SDAR presets' 4 and the LLaDA2 presets' 32
# (neither released config.json names one; conf/model/sdar_8b_chat.yaml, llada2_mini.yaml say where from)
BLOCK_SIZE = {a: {"sdar": 4, "llada2": 32}.get(FAMILY[a], 0) for a in RELEASE}
TINY = {  # the sizes, and only those, differ from the released config.json; grouped-query attention kept
    "llada": {"d_model": 32, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2, "mlp_hidden_size": 48},
    "dream": {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "intermediate_size": 48, "max_window_layers": 2},
    "sdar": {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "num_hidden_layers": 2, "intermediate_size": 48, "max_window_layers": 2},
    # one dense layer then two mixture-of-experts layers: 8 experts in 4 groups, 2 groups kept, 2 per token
    "llada2": {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "num_hidden_layers": 3, "intermediate_size": 48, "moe_intermediate_size": 16, "num_experts": 8,
               "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "rotary_dim": 8},
}
VOCAB = {"llada": ("vocab_size", "embedding_size"), "dream": ("vocab_size",), "sdar": ("vocab_size",),
         "llada2": ("vocab_size",)}
# LLaDA2's tokenizer_config.json lists no added tokens and its tokenizer.json is not in a public copy: the
# special tokens its special_tokens_map.json and chat template name, at stand-in ids, except the two
# docs/methods.md §9 gives (<|endoftext|> 156892 = EOS = pad, <|mask|> 156895)
LLADA2_SPECIALS = {156891: "<|startoftext|>", 156892: "<|endoftext|>", 156893: "[CLS]", 156894: "[gMASK]",
                   156895: "<|mask|>", 156896: "<|role_end|>"}
ID_FIELDS = ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id")
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def fixture(arch: str, name: str) -> dict:
    return json.loads((FIXTURES / RELEASE[arch] / name).read_text())


def specials(arch: str) -> dict[int, str]:
    """Released id -> token of every added token the released tokenizer config lists."""
    if FAMILY[arch] == "llada2":
        return dict(LLADA2_SPECIALS)
    added = fixture(arch, "tokenizer_config.json")["added_tokens_decoder"]
    return {int(i): t["content"] for i, t in added.items()}


def n_regular(arch: str) -> int:
    """Regular tokens before the fillers: characters (LLaDA's word-level stand-in) or the 256 byte symbols."""
    return len(CHARS) if FAMILY[arch] in ("llada", "llada2") else 256


def small_ids(arch: str) -> dict[int, int]:
    """Released special id -> its id in the small vocabulary (right after the regular tokens)."""
    return {rid: n_regular(arch) + i for i, rid in enumerate(sorted(specials(arch)))}


def released_config(arch: str, real_ids: bool = True) -> dict:
    """The released ``config.json`` with tiny sizes; ``real_ids=False`` also shrinks the vocabulary to
    the regular tokens plus the special ones (renumbered right after them)."""
    cfg = {**fixture(arch, "config.json"), **TINY[FAMILY[arch]]}
    if not real_ids:
        ids = small_ids(arch)
        for key in VOCAB[FAMILY[arch]]:
            cfg[key] = n_regular(arch) + len(ids)
        for key in ID_FIELDS:
            if cfg.get(key) is not None:
                cfg[key] = ids[cfg[key]]
    return cfg


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
    elif arch == "llada2":
        shapes.update(llada2_shapes(cfg))
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
        if name.endswith("expert_bias"):  # fp32 as released; large enough to change which experts are chosen
            out[name] = 0.2 * torch.randn(shape, generator=g)
        elif name.endswith("mlp.gate.weight"):  # router scores spread over (0, 1), not all near 0.5
            out[name] = 0.3 * torch.randn(shape, generator=g)
        elif "experts." in name:  # the experts' share of the output large enough that routing shows in logits
            out[name] = 0.2 * torch.randn(shape, generator=g)
        elif len(shape) == 1 and "norm" in name:
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            out[name] = 0.02 * torch.randn(shape, generator=g) if "bias" not in name else 0.1 * torch.randn(shape, generator=g)
    out = {k: v * 10 if k.endswith(("wte.weight", "embed_tokens.weight", "word_embeddings.weight")) else v
           for k, v in out.items()}  # unit-ish activations
    return out


def llada2_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """LLaDA2's released key names (model.safetensors.index.json) and shapes."""
    d, V, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    h, kv, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_experts"]
    m, moe_m = cfg["intermediate_size"], cfg["moe_intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {"model.word_embeddings.weight": (V, d)}

    def swiglu(prefix: str, width: int) -> None:
        shapes.update({prefix + "gate_proj.weight": (width, d), prefix + "up_proj.weight": (width, d),
                       prefix + "down_proj.weight": (d, width)})

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "attention.query_key_value.weight": ((h + 2 * kv) * hd, d),
                       p + "attention.query_layernorm.weight": (hd,), p + "attention.key_layernorm.weight": (hd,),
                       p + "attention.dense.weight": (d, h * hd)})
        if i < cfg["first_k_dense_replace"]:
            swiglu(p + "mlp.", m)
            continue
        shapes.update({p + "mlp.gate.weight": (E, d), p + "mlp.gate.expert_bias": (E,)})
        for e in range(E):
            swiglu(p + f"mlp.experts.{e}.", moe_m)
        swiglu(p + "mlp.shared_experts.", moe_m * cfg["num_shared_experts"])
    shapes.update({"model.norm.weight": (d,), "lm_head.weight": (V, d)})
    return shapes


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
    """The released tokenizer files (ids renumbered with ``real_ids=False``) and a stand-in vocabulary:
    LLaDA's ``tokenizer.json`` (fast, word-level over characters), Qwen2's byte-level BPE files
    (``vocab.json``, ``merges.txt``) for Dream and SDAR. Ids between the specials are fillers."""
    new = (lambda i: i) if real_ids else small_ids(arch).__getitem__
    for name in TOKENIZER_FILES:
        src = FIXTURES / RELEASE[arch] / name
        if not src.is_file():
            continue
        if real_ids:
            shutil.copyfile(src, folder / name)
            continue
        data = json.loads(src.read_text())
        if name == "tokenizer_config.json" and "added_tokens_decoder" in data:
            data["added_tokens_decoder"] = {str(new(int(i))): t for i, t in data["added_tokens_decoder"].items()}
        elif name == "added_tokens.json":
            data = {t: new(i) for t, i in data.items()}
        (folder / name).write_text(json.dumps(data, indent=1))
    tokens = {new(i): t for i, t in specials(arch).items()}
    first, last = min(tokens), max(tokens)
    if FAMILY[arch] in ("llada", "llada2"):
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

        vocab = {c: i for i, c in enumerate(CHARS)}
        vocab.update({f"<|filler_{i}|>": i for i in range(len(CHARS), last + 1) if i not in tokens})
        vocab.update({t: i for i, t in tokens.items()})
        tk = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
        tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tk.decoder = decoders.Fuse()
        tk.add_special_tokens([tokens[i] for i in sorted(tokens)])
        tk.save(str(folder / "tokenizer.json"))
        return
    from tokenizers import pre_tokenizers

    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 byte-level symbols
    bpe = {c: i for i, c in enumerate(byte_chars)}
    bpe.update({f"<|filler_{i}|>": i for i in range(len(bpe), first)})
    (folder / "vocab.json").write_text(json.dumps(bpe, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n")


def write_checkpoint(arch: str, folder: Path | str, real_ids: bool = True, seed: int = 0,
                     overrides: dict | None = None) -> Path:
    """A tiny random checkpoint of ``arch`` (a key of :data:`RELEASE`) from its released files."""
    if real_ids and n_regular(arch) >= min(specials(arch)):
        raise AssertionError("characters overlap the released special ids")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {**released_config(arch, real_ids), **(overrides or {})}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    if (FIXTURES / RELEASE[arch] / "generation_config.json").is_file() and real_ids:
        shutil.copyfile(FIXTURES / RELEASE[arch] / "generation_config.json", folder / "generation_config.json")
    write_weights(folder, released_weights(arch, cfg, seed))
    write_tokenizer(arch, folder, real_ids)
    return folder


# ---- DiffusionGemma: transformers' own class, so its save_pretrained writes the layout it loads ----------
DIFFUSION_GEMMA = "DiffusionGemma-26B-A4B-it"
# the sizes, and only those, differ from the released config.json (the vocabulary is the stand-in
# tokenizer's: 4 specials at Gemma's ids 0-3, then the characters)
DIFFUSION_GEMMA_TINY = {
    "text_config": {"hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "num_global_key_value_heads": 1,
                    "head_dim": 8, "global_head_dim": 16, "num_experts": 4, "top_k_experts": 2,
                    "layer_types": ["sliding_attention", "full_attention"]},
    "vision_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                      "num_key_value_heads": 2, "head_dim": 8, "global_head_dim": 8, "position_embedding_size": 64},
    "canvas_length": 16,
}
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]  # Gemma's ids 0, 1, 2, 3


def diffusion_gemma_config() -> dict:
    """The released ``config.json`` with tiny sizes and the stand-in vocabulary."""
    cfg = json.loads((FIXTURES / DIFFUSION_GEMMA / "config.json").read_text())
    vocab = len(GEMMA_SPECIALS) + len(CHARS)
    cfg["text_config"] = {**cfg["text_config"], **DIFFUSION_GEMMA_TINY["text_config"], "vocab_size": vocab}
    cfg["vision_config"] = {**cfg["vision_config"], **DIFFUSION_GEMMA_TINY["vision_config"]}
    cfg["canvas_length"] = DIFFUSION_GEMMA_TINY["canvas_length"]
    return cfg


def write_diffusion_gemma(folder: Path | str, seed: int = 0, scale: float = 1.0) -> Path:
    """A tiny random DiffusionGemma checkpoint from the released config.json (transformers' class saves it:
    no weight name of ours is involved) and a stand-in character tokenizer with Gemma's specials at their
    ids. ``scale`` multiplies the embeddings (tied to the head): larger makes a confident model whose
    sampler accepts several tokens a step and stops early."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        DiffusionGemmaConfig,
        DiffusionGemmaForBlockDiffusion,
        PreTrainedTokenizerFast,
    )

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig.from_dict(diffusion_gemma_config()))
    with torch.no_grad():
        model.model.decoder.embed_tokens.weight.mul_(scale)
    model.save_pretrained(folder)
    # transformers writes its own serialisation (per_layer_config for global_head_dim and
    # num_global_key_value_heads) and a default generation_config.json: the released keys instead, and no
    # generation config (none was found to copy)
    (folder / "config.json").write_text(json.dumps(diffusion_gemma_config(), indent=1))
    (folder / "generation_config.json").unlink(missing_ok=True)
    vocab = {t: i for i, t in enumerate(GEMMA_SPECIALS + CHARS)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                            unk_token="<unk>", padding_side="left").save_pretrained(folder)
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arch", choices=sorted(RELEASE) + ["diffusion_gemma"])
    parser.add_argument("folder")
    parser.add_argument("--small-vocab", action="store_true", help="renumber the special tokens after the characters")
    args = parser.parse_args()
    if args.arch == "diffusion_gemma":
        print(f"wrote a tiny DiffusionGemma checkpoint to {write_diffusion_gemma(args.folder)}")
        raise SystemExit
    path = write_checkpoint(args.arch, args.folder, real_ids=not args.small_vocab)
    print(f"wrote a tiny {args.arch} checkpoint built from {RELEASE[args.arch]}'s released files to {path}")
