"""The native models (models/native.py, layers.py) on tiny checkpoints in the released layouts:
loading through ``AutoModel`` without remote code, strict keys and model types, the policy network,
the key/value cache, and the training options (LoRA, activation checkpointing, bf16, FSDP units).

Each architecture's own forward is checked against an independent transcription in
``tests/unit/models/test_llada.py``, ``test_dream.py`` and ``test_sdar.py``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.build import build_policy, discover_models
from diffusion_rl.models.native import NATIVE, NativeDiffusionLM
from diffusion_rl.models.policy import ModelConfig
from tests.helpers.released_layouts import BLOCK_SIZE, released_weights, write_checkpoint

ARCHS = ("llada", "dream", "sdar", "diffucoder", "trado", "llada2")  # diffucoder, trado: Dream's and SDAR's
CLASSES = {"llada": "LLaDAModelLM", "dream": "DreamModel", "sdar": "SDARForCausalLM", "diffucoder": "DreamModel",
           "trado": "SDARForCausalLM", "llada2": "LLaDA2MoeModelLM"}
PRESETS = {"llada": "llada_8b_instruct", "dream": "dream_7b_instruct", "sdar": "sdar_8b_chat",
           "diffucoder": "diffucoder_7b_instruct", "trado": "trado_8b_instruct", "llada2": "llada2_mini"}
ATTENTION = dict.fromkeys(ARCHS, "native")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("released")
    return {a: write_checkpoint(a, root / a, real_ids=False) for a in ARCHS}


def ids_batch(vocab: int, B: int = 2, L: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab - 8, (B, L), generator=torch.Generator().manual_seed(seed))


def load(folder: Path, **kwargs):
    discover_models()  # importing the architectures registers them with AutoConfig / AutoModel
    kwargs.setdefault("dtype", torch.float32)  # else config.json's (bfloat16, as released)
    kind = json.loads((folder / "config.json").read_text())["model_type"]
    if kind in ("sdar", "llada2_moe"):  # the preset's: the released config.json names none
        kwargs.setdefault("block_size", BLOCK_SIZE["sdar" if kind == "sdar" else "llada2"])
    return AutoModel.from_pretrained(folder, trust_remote_code=False, **kwargs)


# ---- loading ------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_released_folder_loads_our_class_without_running_its_code(folders, arch):
    folder = folders[arch]
    (folder / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")  # auto_map points elsewhere
    m = load(folder)
    assert type(m).__name__ == CLASSES[arch] and type(m).__module__.startswith("diffusion_rl.models.")
    released = set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"])
    assert set(m.state_dict()) == released  # the released key names, nothing more or less
    assert m.config.model_type == json.loads((folder / "config.json").read_text())["model_type"]


@pytest.mark.parametrize("arch", ARCHS)
def test_weights_saved_by_our_class_load_back_with_identical_logits(folders, arch, tmp_path):
    m = load(folders[arch]).eval()
    m.save_pretrained(tmp_path / "saved", max_shard_size="20KB")  # several shards and an index
    assert len(list((tmp_path / "saved").glob("*.safetensors"))) > 1
    back = load(tmp_path / "saved").eval()
    ids = ids_batch(m.config.vocab_size)
    with torch.no_grad():  # the same tensors; a loaded tensor's memory alignment can move a CPU matmul's last bit
        torch.testing.assert_close(back(ids).logits, m(ids).logits, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_dtype_device_map_and_low_memory_loading(folders, arch):
    m = load(folders[arch], dtype=torch.bfloat16, device_map="cpu")
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in m.parameters()} == {"cpu"}
    ref = load(folders[arch]).eval()
    w = released_weights(arch, json.loads((folders[arch] / "config.json").read_text()))
    name = next(iter(w))
    assert torch.equal(m.state_dict()[name], w[name].to(torch.bfloat16))  # read from the file, not initialised
    ids = ids_batch(ref.config.vocab_size)
    with torch.no_grad():  # bf16 weights and activations stay close to fp32
        torch.testing.assert_close(m.eval()(ids).logits.float(), ref(ids).logits, atol=0.1, rtol=0.1)


def _rename_first_key(folder: Path, tmp_path: Path) -> tuple[Path, str, str]:
    dst = tmp_path / "renamed"
    shutil.copytree(folder, dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    old = sorted(index["weight_map"])[3]
    new = old.replace("weight", "weights")
    file = dst / index["weight_map"][old]
    part = load_file(str(file))
    part[new] = part.pop(old)
    save_file(part, str(file), metadata={"format": "pt"})
    index["weight_map"][new] = index["weight_map"].pop(old)
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst, old, new


@pytest.mark.parametrize("arch", ARCHS)
def test_a_renamed_key_fails_in_one_line_naming_it(folders, arch, tmp_path):
    dst, old, new = _rename_first_key(folders[arch], tmp_path)
    with pytest.raises(ConfigError) as err:
        load(dst)
    msg = str(err.value)
    assert "\n" not in msg and repr(old) in msg and "missing" in msg  # the key we expect and did not get
    with pytest.raises(ConfigError) as err:  # the same through the builder
        build_policy(ModelConfig(name="hf", path=str(dst), attention=ATTENTION[arch], block_size=BLOCK_SIZE[arch]))
    assert "\n" not in str(err.value) and repr(old) in str(err.value)


@pytest.mark.parametrize("arch", ARCHS)
def test_an_extra_key_fails_in_one_line_naming_it(folders, arch, tmp_path):
    dst = tmp_path / "extra"
    shutil.copytree(folders[arch], dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    file = dst / sorted(set(index["weight_map"].values()))[0]
    part = load_file(str(file))
    part["model.rotary_emb.inv_freq"] = torch.ones(4)
    save_file(part, str(file), metadata={"format": "pt"})
    index["weight_map"]["model.rotary_emb.inv_freq"] = file.name
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError) as err:
        load(dst)
    assert "\n" not in str(err.value) and "'model.rotary_emb.inv_freq'" in str(err.value)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_wrong_model_type_fails_in_one_line(folders, arch, tmp_path):
    dst = tmp_path / "wrong"
    shutil.copytree(folders[arch], dst)
    cfg = json.loads((dst / "config.json").read_text())
    other = {"llada": "Dream", "dream": "sdar", "sdar": "llada", "diffucoder": "sdar", "trado": "llada",
             "llada2": "llada"}[arch]
    cls = NATIVE[cfg["model_type"]]
    (dst / "config.json").write_text(json.dumps({**cfg, "model_type": other}))
    with pytest.raises(ConfigError) as err:  # our class, handed another architecture's folder
        cls.from_pretrained(dst)
    assert "\n" not in str(err.value) and repr(other) in str(err.value)
    (dst / "config.json").write_text(json.dumps({**cfg, "model_type": "llada_v9"}))
    with pytest.raises(ConfigError) as err:  # a type nobody implements, through the builder
        build_policy(ModelConfig(name="hf", path=str(dst)))
    assert "\n" not in str(err.value) and "'llada_v9'" in str(err.value)


def test_a_config_value_we_do_not_implement_fails_in_one_line(folders, tmp_path):
    dst = tmp_path / "seq"
    shutil.copytree(folders["llada"], dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "block_type": "sequential"}))
    with pytest.raises(ConfigError) as err:
        load(dst)
    assert "\n" not in str(err.value) and "block_type" in str(err.value) and "'sequential'" in str(err.value)


def test_trust_remote_code_needs_impl_remote():
    with pytest.raises(ConfigError, match="model.impl=remote"):
        ModelConfig(name="hf", path="x", trust_remote_code=True).validate()
    with pytest.raises(ConfigError, match="model.impl"):
        ModelConfig(name="hf", path="x", impl="other").validate()


# ---- the policy network ------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_bundle_reads_the_special_ids_and_blocks_of_the_checkpoint(folders, arch):
    b = build_policy(ModelConfig(name="hf", path=str(folders[arch]), attention=ATTENTION[arch], block_size=BLOCK_SIZE[arch]))
    cfg = json.loads((folders[arch] / "config.json").read_text())
    assert isinstance(b.net, NativeDiffusionLM) and b.custom_attention_mask
    # SDAR's and LLaDA2's config.json name no mask id: their tokenizer's (<|MASK|>, <|mask|>); LLaDA's names none
    assert b.mask_token_id == cfg.get("mask_token_id", b.tokenizer.mask_token_id)
    assert b.tokenizer.mask_token_id == (None if arch == "llada" else b.mask_token_id)
    assert b.block_size == BLOCK_SIZE[arch]
    assert b.eos_token_id == b.tokenizer.eos_token_id


@pytest.mark.parametrize("arch, attention, block_size", [
    ("llada", "block_causal", 4), ("dream", "block_causal", 4), ("sdar", "bidirectional", 4), ("sdar", "native", 0),
])
def test_attention_and_block_size_must_match_the_checkpoint(folders, arch, attention, block_size):
    with pytest.raises(ConfigError) as err:
        build_policy(ModelConfig(name="hf", path=str(folders[arch]), attention=attention, block_size=block_size))
    assert "\n" not in str(err.value) and str(err.value).startswith(("model.attention", "model.block_size"))


def test_dream_tokenizer_loads_without_its_code_and_says_so(folders, caplog):
    with caplog.at_level(logging.WARNING, logger="diffusion_rl.models.native"):
        b = build_policy(ModelConfig(name="hf", path=str(folders["dream"])))
    assert type(b.tokenizer).__name__ == "Qwen2Tokenizer"
    assert any("DreamTokenizer" in r.getMessage() or "Qwen2Tokenizer" in r.getMessage() for r in caplog.records)
    text = "12 + 3 = 15\n"
    ids = b.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert b.tokenizer.decode(ids) == text and b.tokenizer.decode([b.mask_token_id]) == "<|mask|>"


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_cache_gives_the_logits_of_the_full_forward(folders, arch):
    """Keys/values of a prefix, cached, then the rest: equal to one forward in which the prefix does
    not see the rest (exact for the finished blocks of a block model; a prefix cache's approximation
    for a bidirectional one). Left padding in one row (not for LLaDA, which attends over it)."""
    b = build_policy(ModelConfig(name="hf", path=str(folders[arch]), attention=ATTENTION[arch], block_size=BLOCK_SIZE[arch]))
    net = b.net.eval()
    P = max(8, b.block_size)  # the prefix ends at a block boundary
    L = P + 4
    ids = ids_batch(net.config.vocab_size, L=L, seed=3)
    keep = torch.ones_like(ids)
    if arch != "llada":
        keep[0, :2] = 0
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    rule = (j // b.block_size <= i // b.block_size) if b.block_size else ((j < P) | (i >= P))  # (L, L)
    allowed = (rule[None] & keep.bool()[:, None, :]) | (i == j)  # (B, L, L)
    pos = (keep.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        full = net(input_ids=ids, attention_mask=allowed[:, None], position_ids=pos).logits
        pre = net(input_ids=ids[:, :P], attention_mask=keep[:, :P], use_cache=True)
        rest = net(input_ids=ids[:, P:], attention_mask=keep, past_key_values=pre.past_key_values).logits
    torch.testing.assert_close(rest, full[:, P:], atol=1e-5, rtol=1e-5)
    assert len(pre.past_key_values) == len(net.model.decoder_layers()) and pre.past_key_values[0][0].shape[-2] == P


# ---- training options ------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_activation_checkpointing_gives_the_same_gradients(folders, arch):
    grads = {}
    for ckpt in (False, True):
        torch.manual_seed(0)
        b = build_policy(ModelConfig(name="hf", path=str(folders[arch]), attention=ATTENTION[arch],
                                     block_size=BLOCK_SIZE[arch], gradient_checkpointing=ckpt))
        net = b.net.train()
        ids = ids_batch(net.config.vocab_size)
        net(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
        grads[ckpt] = {n: p.grad.clone() for n, p in net.named_parameters() if p.requires_grad}
        if ckpt:
            assert all(layer.gradient_checkpointing for layer in net.model.decoder_layers())
    for n, g in grads[False].items():
        torch.testing.assert_close(grads[True][n], g, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_targets_the_native_projections_and_fsdp_shards_decoder_layers(folders, arch, tmp_path):
    """Which modules LoRA and FSDP2 units take (tests/e2e/test_fsdp.py trains through them)."""
    pytest.importorskip("peft")
    from diffusion_rl.core.config import from_dict
    from diffusion_rl.training.strategy import decoder_layer_classes
    from tests.helpers.common import compose_cfg

    preset = PRESETS[arch]
    m = from_dict(ModelConfig, compose_cfg([f"model={preset}", f"model.path={folders[arch]}"], tmp_path,
                                           tiny=False).model, "model")
    m.dtype, m.lora_r = "float32", 4
    b = build_policy(m)
    lora = {n.rsplit(".lora_A", 1)[0].rsplit(".", 1)[-1] for n, _ in b.net.named_parameters() if ".lora_A" in n}
    expect = {"llada": {"q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out"},
              "llada2": {"query_key_value", "dense", "gate_proj", "up_proj", "down_proj"}}.get(
        arch, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
    assert lora == expect
    # LLaDA2: the dense layer and the shared experts, not the routed ones; never the routers
    assert not any(".experts." in n or ".gate.lora" in n for n, _ in b.net.named_parameters() if "lora_" in n)
    head = "model.transformer.ff_out" if arch == "llada" else "lm_head"
    assert not any(head + ".lora" in n for n, _ in b.net.named_parameters())  # the output head stays frozen
    assert all("lora_" in n for n, p in b.net.named_parameters() if p.requires_grad)
    assert {c.__name__ for c in decoder_layer_classes(b.net)} == {"llada": {"LLaDABlock"}, "llada2": {"LLaDA2DecoderLayer"}}.get(
        arch, {"QwenDecoderLayer"})


# ---- the presets of the models TraceRL and coupled-GRPO were published on ------------------------
def test_diffucoder_preset_ends_completions_at_im_end(folders, tmp_path):
    """DiffuCoder-Instruct ends an answer with <|im_end|> (its config.json says 151643): the preset names
    the EOS by its token, so the id comes from the checkpoint's own tokenizer."""
    from diffusion_rl.core.config import from_dict
    from tests.helpers.common import compose_cfg

    m = from_dict(ModelConfig, compose_cfg(["model=diffucoder_7b_instruct", f"model.path={folders['diffucoder']}"],
                                           tmp_path, tiny=False).model, "model")
    assert m.path.endswith("diffucoder") and m.eos_token == "<|im_end|>" and m.lora_r == 128  # Dream's preset
    m.dtype, m.lora_r = "float32", 0
    b = build_policy(m)
    cfg = json.loads((folders["diffucoder"] / "config.json").read_text())
    assert b.eos_token_id == b.tokenizer.convert_tokens_to_ids("<|im_end|>") != cfg["eos_token_id"]
    assert b.mask_token_id == cfg["mask_token_id"] and b.block_size == 0
    with pytest.raises(ConfigError) as err:
        build_policy(ModelConfig(name="hf", path=str(folders["diffucoder"]), eos_token="<|no_such|>"))
    assert str(err.value).startswith("model.eos_token") and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="not both"):
        ModelConfig(name="hf", path="x", eos_token="<|im_end|>", eos_token_id=3).validate()


def test_trado_presets_are_sdar_with_the_checkpoints_blocks(folders, tmp_path):
    from tests.helpers.common import compose_cfg

    for preset, repo in (("trado_8b_instruct", "Gen-Verse/TraDo-8B-Instruct"),
                         ("trado_4b_instruct", "Gen-Verse/TraDo-4B-Instruct")):
        m = compose_cfg([f"model={preset}"], tmp_path, tiny=False).model
        assert m.path == repo and m.attention == "native" and m.block_size == 4 and m.lora_r == 128
    b = build_policy(ModelConfig(name="hf", path=str(folders["trado"]), attention="native", block_size=4))
    # SDAR's released tokenizer_config.json names <|endoftext|> its EOS (its generation_config also lists <|im_end|>)
    assert b.block_size == 4 and b.eos_token_id == b.tokenizer.convert_tokens_to_ids("<|endoftext|>")


def test_an_sdar_layout_with_a_tied_head_loads(tmp_path):
    """Whether TraDo-4B ties its head (Qwen3-4B does) is not known from a public copy: a tied SDAR
    checkpoint (no lm_head in its index) loads, its head being the embeddings."""
    folder = write_checkpoint("trado", tmp_path / "tied", real_ids=False, overrides={"tie_word_embeddings": True})
    assert "lm_head.weight" not in json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    m = load(folder).eval()
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    w = released_weights("trado", json.loads((folder / "config.json").read_text()))
    assert torch.equal(m.model.embed_tokens.weight, w["model.embed_tokens.weight"])  # the file's, not initialised
    with torch.no_grad():
        assert torch.isfinite(m(ids_batch(m.config.vocab_size)).logits).all()
