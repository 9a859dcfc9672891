"""Every preset loads the released files: a tiny checkpoint built from the released ``config.json``
(byte-for-byte copies in tests/fixtures/released/, sources in its SOURCES.json) with only the sizes
changed, the released tokenizer config and special-tokens map, and safetensors under the released
key names, loaded as a user would (``model=<preset> model.path=<folder>``), then a forward and a short
rollout. A hand transcription of SDAR-8B-Chat's config hid that the released file did not load
(``flex_attention``, no block size, no mask id); these tests read the files themselves.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil

import pytest
import torch

from diffusion_rl.core.config import from_dict
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig, encode_prompts
from diffusion_rl.sampling import RowNoise, SamplerConfig, sample
from tests.helpers.common import compose_cfg
from tests.helpers.released_layouts import (
    BLOCK_SIZE,
    FAMILY,
    FIXTURES,
    PRESET,
    RELEASE,
    TINY,
    write_checkpoint,
)

SOURCES = json.loads((FIXTURES / "SOURCES.json").read_text())


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("released_presets")
    return {arch: write_checkpoint(arch, root / arch) for arch in sorted(set(PRESET.values()))}


def preset_model(preset: str, folder, tmp_path, *extra: str) -> ModelConfig:
    cfg = compose_cfg([f"model={preset}", f"model.path={folder}", "model.dtype=float32", "model.lora_r=0",
                       *extra], tmp_path, tiny=False)
    return from_dict(ModelConfig, cfg.model, "model")


# ---- the fixtures are the released files ----------------------------------------------------------
def test_fixtures_are_the_released_files_as_recorded():
    """Every file in tests/fixtures/released/ has the sha256 its SOURCES.json records (no file edited
    or reformatted), and every recorded file is there."""
    on_disk = {p.relative_to(FIXTURES).as_posix() for p in FIXTURES.rglob("*") if p.is_file()} - {"SOURCES.json"}
    recorded = set()
    for model, entry in SOURCES["models"].items():
        for name, src in entry.get("files", {}).items():
            data = (FIXTURES / model / name).read_bytes()
            assert hashlib.sha256(data).hexdigest() == src["sha256"], f"{model}/{name} differs from {src['path']}"
            assert {"repository", "commit", "path"} <= set(src)
            recorded.add(f"{model}/{name}")
        if not entry.get("files"):
            assert entry["not_found"] and entry["stand_in"] in SOURCES["models"]  # said so, and what stands in
    assert on_disk == recorded
    assert set(RELEASE.values()) <= set(SOURCES["models"])


@pytest.mark.parametrize("arch", sorted(set(PRESET.values())))
def test_the_tiny_config_is_the_released_one_but_for_the_sizes(folders, arch):
    released = json.loads((FIXTURES / RELEASE[arch] / "config.json").read_text())
    written = json.loads((folders[arch] / "config.json").read_text())
    changed = {k for k in released if written[k] != released[k]}
    assert changed <= set(TINY[FAMILY[arch]]) and set(written) == set(released)
    for name in ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "generation_config.json"):
        if (FIXTURES / RELEASE[arch] / name).is_file():
            assert (folders[arch] / name).read_bytes() == (FIXTURES / RELEASE[arch] / name).read_bytes()


# ---- each preset on its released files ------------------------------------------------------------
@pytest.mark.parametrize("preset", sorted(PRESET))
def test_preset_loads_the_released_files_and_rolls_out(folders, preset, tmp_path):
    arch = PRESET[preset]
    folder = folders[arch]
    released = json.loads((folder / "config.json").read_text())
    b = build_policy(preset_model(preset, folder, tmp_path))
    tok = b.tokenizer
    # the mask id: config.json's (LLaDA, Dream), else the tokenizer's (SDAR's <|MASK|>, LLaDA2's <|mask|>)
    assert b.mask_token_id == (released.get("mask_token_id") or tok.mask_token_id)
    assert b.mask_token_id == {"llada": 126336, "dream": 151666, "sdar": 151669, "llada2": 156895}[FAMILY[arch]]
    eos = {"diffucoder_7b_instruct": "<|im_end|>"}.get(preset, "<|endoftext|>")  # DiffuCoder's preset names it
    assert b.eos_token_id == tok.convert_tokens_to_ids(eos)
    assert b.block_size == BLOCK_SIZE[arch]
    ids, mask = encode_prompts(tok, ["12+3=", "7*6="], pad_to_multiple_of=b.block_size)  # (2, P)
    net = b.net.eval()
    with torch.no_grad():
        logits = net(input_ids=ids, attention_mask=mask).logits  # (2, P, V)
        assert logits.shape == (*ids.shape, released["vocab_size"]) and torch.isfinite(logits).all()
        gen = max(8, b.block_size)  # a whole number of the model's blocks
        cfg = SamplerConfig(gen_length=gen, block_length=b.block_size or 4, steps=4, temperature=0.0)
        out = sample(b, ids, mask, cfg, RowNoise.rows(0, 0, 2), net=net)
    assert out.completion.shape == (2, gen) and not (out.completion == b.mask_token_id).any()


def test_sdar_flex_attention_request_is_noted_once_not_refused(folders, tmp_path, caplog):
    """SDAR-4B / 8B-Chat's config.json carries ``"attn_implementation": "flex_attention"``: the model
    loads (our attention is torch's sdpa) and the log says so once."""
    from diffusion_rl.models import native

    assert json.loads((FIXTURES / "SDAR-8B-Chat" / "config.json").read_text())["attn_implementation"] == "flex_attention"
    native._NOTED_ATTENTION.clear()
    with caplog.at_level(logging.INFO, logger="diffusion_rl.models.native"):
        for _ in range(2):
            b = build_policy(preset_model("sdar_8b_chat", folders["sdar"], tmp_path))
    noted = [r for r in caplog.records if "flex_attention" in r.getMessage()]
    assert len(noted) == 1 and "sdpa" in noted[0].getMessage()
    assert b.net.config._attn_implementation == "sdpa"
    assert b.net.config.fuse_cross_entropy is True and b.net.config.use_deepep is False  # accepted, unused


@pytest.mark.parametrize("arch, key, value", [
    ("sdar", "attention_bias", True), ("llada", "block_type", "sequential"), ("sdar", "block_size", -4),
    ("llada2", "use_qkv_bias", True), ("llada2", "n_group", 3), ("llada2", "partial_rotary_factor", 0.0),
])
def test_a_bad_value_in_the_released_config_fails_in_one_line_naming_the_key(folders, tmp_path, arch, key, value):
    dst = tmp_path / "bad"
    shutil.copytree(folders[arch], dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, key: value}))
    preset = next(p for p, a in PRESET.items() if a == arch)
    with pytest.raises(ConfigError) as err:
        build_policy(preset_model(preset, dst, tmp_path))
    msg = str(err.value)
    assert "\n" not in msg and key in msg.split("=")[0] and repr(value) in msg
