"""Test-only transcriptions of the LLaDA, Dream, SDAR and LLaDA2 forwards from docs/methods.md §9, written
as plainly as possible and sharing no code with ``src/diffusion_rl/models``: loops over sequences,
heads and positions, the norm / rotary / softmax / SiLU formulas spelled out, weights read by their
released names. Slow, fp32, for tiny models only.

Attention is given as ``allowed(b, i, j) -> bool`` (query ``i`` may attend key ``j`` in row ``b``) and
positions as a list of lists, so each test states the masking rule it expects in its own words.
"""

from __future__ import annotations

import contextlib
import math

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


def rotate(vec: torch.Tensor, pos: int, theta: float, width: int | None = None) -> torch.Tensor:
    """Rotate-half RoPE of one head vector: channel ``i`` pairs with ``i + W/2`` at frequency
    ``theta^(-2i/W)``; only the first ``width`` (W, default all) channels turn, the rest pass (LLaDA2)."""
    dh = width or vec.shape[0]
    half = dh // 2
    out = vec.clone()
    for i in range(half):
        angle = pos / theta ** (2 * i / dh)
        c, s = math.cos(angle), math.sin(angle)
        out[i] = vec[i] * c - vec[i + half] * s
        out[i + half] = vec[i + half] * c + vec[i] * s
    return out


def attention(q, k, v, heads: int, kv_heads: int, allowed, positions, theta: float, q_norm=None, k_norm=None,
              rope_width: int | None = None):
    """q (B, L, heads*Dh), k / v (B, L, kv_heads*Dh) -> (B, L, heads*Dh), one query at a time."""
    B, L, _ = q.shape
    dh = q.shape[-1] // heads
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(heads):
            g = h // (heads // kv_heads)  # the key/value head this query head reads
            keys, values = [], []
            for j in range(L):
                kj = k[b, j, g * dh:(g + 1) * dh]
                if k_norm is not None:
                    kj = k_norm(kj)
                keys.append(rotate(kj, positions[b][j], theta, rope_width))
                values.append(v[b, j, g * dh:(g + 1) * dh])
            for i in range(L):
                qi = q[b, i, h * dh:(h + 1) * dh]
                if q_norm is not None:
                    qi = q_norm(qi)
                qi = rotate(qi, positions[b][i], theta, rope_width)
                js = [j for j in range(L) if allowed(b, i, j)]
                scores = torch.stack([(qi * keys[j]).sum() / math.sqrt(dh) for j in js])
                w = torch.exp(scores - scores.max())
                w = w / w.sum()
                out[b, i, h * dh:(h + 1) * dh] = sum(w[n] * values[j] for n, j in enumerate(js))
    return out


def silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + torch.exp(-x))


def llada_forward(sd: dict, cfg: dict, ids: torch.Tensor, allowed, positions) -> torch.Tensor:
    """LLaDA: ``h = x + attn_out(attn(attn_norm(x)))``; ``x = h + ff_out(silu(ff_proj(n)) * up_proj(n))``."""
    heads = cfg["n_heads"]
    kv_heads = cfg["n_kv_heads"] or heads
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    x = sd["model.transformer.wte.weight"][ids]
    for layer in range(cfg["n_layers"]):
        p = f"model.transformer.blocks.{layer}."
        n = rms_norm(x, sd[p + "attn_norm.weight"], eps)
        q, k, v = (n @ sd[p + name + ".weight"].T for name in ("q_proj", "k_proj", "v_proj"))
        h = x + attention(q, k, v, heads, kv_heads, allowed, positions, theta) @ sd[p + "attn_out.weight"].T
        n = rms_norm(h, sd[p + "ff_norm.weight"], eps)
        x = h + (silu(n @ sd[p + "ff_proj.weight"].T) * (n @ sd[p + "up_proj.weight"].T)) @ sd[p + "ff_out.weight"].T
    return rms_norm(x, sd["model.transformer.ln_f.weight"], eps) @ sd["model.transformer.ff_out.weight"].T


def qwen_forward(sd: dict, cfg: dict, ids: torch.Tensor, allowed, positions) -> torch.Tensor:
    """Dream (Qwen2: q/k/v biases) and SDAR (Qwen3: per-head q_norm / k_norm before RoPE). Raw logits:
    Dream's output at ``i`` is its prediction for ``i + 1``."""
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    x = sd["model.embed_tokens.weight"][ids]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        n = rms_norm(x, sd[p + "input_layernorm.weight"], eps)
        qkv = []
        for name in ("q_proj", "k_proj", "v_proj"):
            y = n @ sd[p + f"self_attn.{name}.weight"].T
            if p + f"self_attn.{name}.bias" in sd:
                y = y + sd[p + f"self_attn.{name}.bias"]
            qkv.append(y)
        norms = {}
        if p + "self_attn.q_norm.weight" in sd:
            for side in ("q", "k"):
                w = sd[p + f"self_attn.{side}_norm.weight"]
                norms[side] = lambda t, w=w: rms_norm(t, w, eps)
        a = attention(*qkv, heads, kv_heads, allowed, positions, theta, norms.get("q"), norms.get("k"))
        h = x + a @ sd[p + "self_attn.o_proj.weight"].T
        n = rms_norm(h, sd[p + "post_attention_layernorm.weight"], eps)
        mlp = silu(n @ sd[p + "mlp.gate_proj.weight"].T) * (n @ sd[p + "mlp.up_proj.weight"].T)
        x = h + mlp @ sd[p + "mlp.down_proj.weight"].T
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return rms_norm(x, sd["model.norm.weight"], eps) @ head.T


def llada2_route(scores: list[float], bias: list[float], cfg: dict, rule: str = "released") -> dict[int, float]:
    """One token's experts and weights from its sigmoid scores, as the released router does: the bias
    only chooses; groups ranked by their two best biased scores; the weights are the chosen unbiased
    scores over their sum, times routed_scaling_factor. ``rule`` names a wrong variant (for tests that
    show a routing mistake is caught): ``biased_weights``, ``no_groups``, ``unnormalised``."""
    E, G = len(scores), cfg["n_group"]
    per = E // G
    biased = [s + b for s, b in zip(scores, bias)]
    groups = list(range(G))
    if rule != "no_groups":
        rank = sorted(range(G), key=lambda g: -sum(sorted(biased[g * per:(g + 1) * per])[-2:]))
        groups = rank[:cfg["topk_group"]]
    candidates = [e for g in groups for e in range(g * per, (g + 1) * per)]
    chosen = sorted(candidates, key=lambda e: -biased[e])[:cfg["num_experts_per_tok"]]
    raw = {e: (biased if rule == "biased_weights" else scores)[e] for e in chosen}
    total = sum(raw.values()) if rule != "unnormalised" else 1.0
    return {e: w / total * cfg["routed_scaling_factor"] for e, w in raw.items()}


def llada2_forward(sd: dict, cfg: dict, ids: torch.Tensor, allowed, positions, rule: str = "released") -> torch.Tensor:
    """LLaDA2: fused q/k/v heads, per-head RMSNorm of q and k before a rotary over the first
    ``head_dim * partial_rotary_factor`` channels; a dense SwiGLU in the first ``first_k_dense_replace``
    layers, then routed experts (:func:`llada2_route`, one token at a time) plus the shared expert."""
    heads, kv_heads, dh = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta, width = cfg["rms_norm_eps"], cfg["rope_theta"], int(cfg["head_dim"] * cfg["partial_rotary_factor"])

    def swiglu(prefix: str, t: torch.Tensor) -> torch.Tensor:
        return (silu(t @ sd[prefix + "gate_proj.weight"].T) * (t @ sd[prefix + "up_proj.weight"].T)) @ sd[prefix + "down_proj.weight"].T

    x = sd["model.word_embeddings.weight"][ids]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        n = rms_norm(x, sd[p + "input_layernorm.weight"], eps)
        fused = n @ sd[p + "attention.query_key_value.weight"].T  # (B, L, (heads + 2 kv_heads) * dh)
        q, k, v = fused.split([heads * dh, kv_heads * dh, kv_heads * dh], dim=-1)
        qn, kn = sd[p + "attention.query_layernorm.weight"], sd[p + "attention.key_layernorm.weight"]
        a = attention(q, k, v, heads, kv_heads, allowed, positions, theta, lambda t, w=qn: rms_norm(t, w, eps),
                      lambda t, w=kn: rms_norm(t, w, eps), rope_width=width)
        h = x + a @ sd[p + "attention.dense.weight"].T
        n = rms_norm(h, sd[p + "post_attention_layernorm.weight"], eps)
        if layer < cfg["first_k_dense_replace"]:
            x = h + swiglu(p + "mlp.", n)
            continue
        out = swiglu(p + "mlp.shared_experts.", n)
        bias = sd[p + "mlp.gate.expert_bias"].tolist()
        for b in range(n.shape[0]):
            for i in range(n.shape[1]):
                scores = (1 / (1 + torch.exp(-(sd[p + "mlp.gate.weight"] @ n[b, i])))).tolist()
                for e, w in llada2_route(scores, bias, cfg, rule).items():
                    out[b, i] = out[b, i] + w * swiglu(p + f"mlp.experts.{e}.", n[b, i])
        x = h + out
    return rms_norm(x, sd["model.norm.weight"], eps) @ sd["lm_head.weight"].T


def padded_positions(keep: torch.Tensor) -> list[list[int]]:
    """Positions that skip left padding: the n-th real token of a row is at n (padding at 0)."""
    rows = []
    for row in keep.tolist():
        count, pos = 0, []
        for real in row:
            pos.append(count if real else 0)
            count += int(real)
        rows.append(pos)
    return rows


def checkpoint_tensors(folder) -> dict[str, torch.Tensor]:
    """Every tensor of a sharded safetensors checkpoint, by its stored name."""
    from pathlib import Path

    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


def released_model(arch: str, folder, tmp_path):
    """The released modelling code of ``arch`` run on the checkpoint in ``folder`` (fp32), when
    ``DIFFUSION_RL_REMOTE_CODE_DIR/<arch>/`` holds the released ``*.py`` files (and, for Dream,
    ``generation_config.json``); else the test is skipped.

    The code is copied next to a copy of the checkpoint and loaded with ``trust_remote_code=True``,
    through the same ``post_init`` shim ``model.impl=remote`` uses, with a ``"default"`` RoPE entry
    put back for the duration (transformers 5 dropped it; 4.x-era code looks it up). Code that still
    cannot load under the installed transformers skips the test with the reason.
    """
    import json
    import os
    import shutil
    from pathlib import Path

    import pytest

    root = os.environ.get("DIFFUSION_RL_REMOTE_CODE_DIR")
    if not root:
        pytest.skip("set DIFFUSION_RL_REMOTE_CODE_DIR to a folder with llada/, dream/, sdar/ holding the released *.py files")
    code = Path(root) / arch
    if not list(code.glob("modeling_*.py")):
        pytest.skip(f"no released modelling file in {code}")
    dst = Path(tmp_path) / f"released_{arch}"
    shutil.copytree(folder, dst)
    for f in [*code.glob("*.py"), *code.glob("generation_config.json")]:  # Dream's code reads the latter
        shutil.copy(f, dst / f.name)
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    from diffusion_rl.models.hf import post_init_shim

    name = "AutoModelForCausalLM" if arch in ("sdar", "llada2") else "AutoModel"
    try:
        with auto_registries_restored(), rope_default_restored():
            auto_map = json.loads((dst / "config.json").read_text())["auto_map"]
            config = get_class_from_dynamic_module(auto_map["AutoConfig"], str(dst)).from_pretrained(dst)
            config.use_cache = False  # transformers 5 no longer keeps it on configs; 4.x-era code reads it
            cls = post_init_shim(get_class_from_dynamic_module(auto_map[name], str(dst)))
            model = cls(config).float()  # built and filled by hand: from_pretrained also runs their generation code
        missing, unexpected = model.load_state_dict(checkpoint_tensors(dst), strict=False)
        if [k for k in missing if "rotary" not in k] or unexpected:
            raise AssertionError(f"released {arch} class: missing {missing[:3]}, unexpected {unexpected[:3]}")
        return model.eval()
    except Exception as err:  # noqa: BLE001 - any failure of third-party code under this transformers
        pytest.skip(f"the released {arch} code does not load here: {type(err).__name__}: {str(err).splitlines()[0][:200]}")


@contextlib.contextmanager
def auto_registries_restored():
    """Released code registers its classes under our model_type when imported: put ours back after."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    mappings = [CONFIG_MAPPING] + [getattr(transformers, n)._model_mapping for n in ("AutoModel", "AutoModelForCausalLM")]
    saved = [dict(m._extra_content) for m in mappings]
    try:
        yield
    finally:
        for m, content in zip(mappings, saved):
            m._extra_content.clear()
            m._extra_content.update(content)


@contextlib.contextmanager
def rope_default_restored():
    """The ``"default"`` RoPE initialiser 4.x-era code looks up (transformers 5 dropped it), meanwhile."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    added = "default" not in ROPE_INIT_FUNCTIONS
    if added:
        def default_rope(config, device=None, **_):
            dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            inv = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float().to(device) / dim)
            return inv, 1.0

        ROPE_INIT_FUNCTIONS["default"] = default_rope
    try:
        yield
    finally:
        if added:
            del ROPE_INIT_FUNCTIONS["default"]
