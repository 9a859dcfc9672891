"""SDAR (models/sdar.py) against an independent transcription of its forward (docs/methods.md §9),
on a tiny random checkpoint in the released layout: block-causal attention with left padding, the
staircase estimator's 4D mask with shared positions, the block sampler with and without the cache,
and the block size read from the checkpoint. With ``DIFFUSION_RL_REMOTE_CODE_DIR`` set, also against
the released ``modeling_sdar.py``."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.staircase import staircase_logits, staircase_mask
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig, logits_fn
from diffusion_rl.sampling import RowNoise, SamplerConfig, sample
from diffusion_rl.sampling.block import block_generate
from tests.helpers.common import compose_cfg
from tests.helpers.reference_models import (
    checkpoint_tensors,
    padded_positions,
    qwen_forward,
    released_model,
)
from tests.helpers.released_layouts import write_checkpoint


@pytest.fixture(scope="module", params=["sdar", "trado"])  # trado: sdar's architecture, its preset's layout
def ckpt(request, tmp_path_factory):
    folder = write_checkpoint(request.param, tmp_path_factory.mktemp(request.param), real_ids=False)
    cfg = json.loads((folder / "config.json").read_text())
    # block size 4: the SDAR presets' (the released config.json names none)
    bundle = build_policy(ModelConfig(name="hf", path=str(folder), attention="native", block_size=4))
    bundle.net.eval()
    return folder, cfg, checkpoint_tensors(folder), bundle


def test_block_causal_forward_with_padding_matches_the_transcription(ckpt):
    folder, cfg, sd, bundle = ckpt
    bs = bundle.block_size
    ids = torch.randint(0, cfg["vocab_size"] - 8, (2, 10), generator=torch.Generator().manual_seed(4))
    keep = torch.ones_like(ids)
    keep[0, :3] = 0  # left padding: the first block has one real token
    real = keep.bool()
    with torch.no_grad():
        out = bundle.net(input_ids=ids, attention_mask=keep).logits
    ref = qwen_forward(sd, cfg, ids, allowed=lambda b, i, j: (bool(keep[b, j]) and j // bs <= i // bs) or i == j,
                       positions=padded_positions(keep))
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=1e-5)
    ids2 = ids.clone()
    ids2[:, 8:] = (ids[:, 8:] + 1) % 50  # a later block changes nothing before it
    with torch.no_grad():
        assert torch.equal(bundle.net(input_ids=ids2, attention_mask=keep).logits[:, :8], out[:, :8])


def test_staircase_mask_and_shared_positions_match_the_transcription(ckpt):
    """The training input ``[prompt, clean, noisy]`` through the estimator's own call."""
    folder, cfg, sd, bundle = ckpt
    bs = bundle.block_size
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 200, (2, 4), generator=g)
    pmask = torch.ones_like(prompt)
    pmask[1, :2] = 0
    clean = torch.randint(0, 200, (2, 8), generator=g)
    noisy = torch.where(torch.rand(2, 8, generator=g) < 0.5, bundle.mask_token_id, clean)
    with torch.no_grad():
        out = staircase_logits(logits_fn(bundle.net), prompt, pmask, clean, noisy, bs)  # (2, 8, V)
    ids = torch.cat([prompt, clean, noisy], 1)
    keep = torch.cat([pmask, torch.ones(2, 16, dtype=pmask.dtype)], 1)
    rule = staircase_mask(4, 8, bs)
    pos = padded_positions(keep[:, :12])
    pos = [p + p[4:] for p in pos]  # the noisy copy shares the clean positions
    ref = qwen_forward(sd, cfg, ids, allowed=lambda b, i, j: (bool(rule[i, j]) and bool(keep[b, j])) or i == j,
                       positions=pos)
    torch.testing.assert_close(out, ref[:, 12:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_block_sampler_with_the_cache_gives_the_tokens_without_it(ckpt, temperature):
    folder, cfg, sd, bundle = ckpt
    ids = torch.randint(0, 200, (3, 6), generator=torch.Generator().manual_seed(6))
    keep = torch.ones_like(ids)
    keep[0, :2] = 0
    scfg = SamplerConfig(gen_length=8, steps=8, temperature=temperature)
    outs = [block_generate(bundle.net, ids, keep, scfg, bundle.block_size, bundle.mask_token_id,
                           RowNoise.rows(0, 0, ids.shape[0]), use_cache=c).sequences for c in (True, False)]
    assert torch.equal(outs[0], outs[1])
    assert bundle.net.supports_kv_cache  # so sample (rollouts, evaluation) takes the cached path
    auto = sample(bundle, ids, keep, scfg, RowNoise.rows(0, 0, ids.shape[0]))
    assert torch.equal(auto.sequences, outs[0])


def test_block_size_comes_from_the_preset_unless_the_checkpoint_names_one(ckpt, tmp_path):
    """SDAR's released config.json names no block size: the presets set 4; a config.json that names
    one (JetAstra/SDAR's training copy does) is read, and a preset that disagrees stops in one line."""
    folder, cfg, _, bundle = ckpt
    assert "block_size" not in cfg and bundle.block_size == 4
    for preset in ("sdar_8b_chat", "sdar_4b_chat", "sdar_1_7b_chat", "trado_8b_instruct", "trado_4b_instruct"):
        composed = compose_cfg([f"model={preset}", f"model.path={folder}"], tmp_path, tiny=False).model
        assert composed.block_size == 4
    with pytest.raises(ConfigError) as err:  # no preset, no block size anywhere
        build_policy(ModelConfig(name="hf", path=str(folder), attention="native"))
    assert "\n" not in str(err.value) and str(err.value).startswith("model.block_size")
    dst = tmp_path / "b2"
    shutil.copytree(folder, dst)
    (dst / "config.json").write_text(json.dumps({**cfg, "block_size": 2}))
    assert build_policy(ModelConfig(name="hf", path=str(dst), attention="native")).block_size == 2
    with pytest.raises(ConfigError) as err:
        build_policy(ModelConfig(name="hf", path=str(dst), attention="native", block_size=4))
    assert "\n" not in str(err.value) and str(err.value).startswith("model.block_size=4")
    (dst / "config.json").write_text(json.dumps({**cfg, "block_size": 0}))
    with pytest.raises(ConfigError) as err:  # a bad value in config.json: one line naming the key
        build_policy(ModelConfig(name="hf", path=str(dst), attention="native", block_size=4))
    assert "\n" not in str(err.value) and str(err.value).startswith("sdar config.json block_size=0")


def test_matches_the_released_modelling_code(ckpt, tmp_path):
    folder, cfg, _, bundle = ckpt
    released = released_model("sdar", folder, tmp_path)
    ids = torch.randint(0, 200, (2, 8), generator=torch.Generator().manual_seed(7))
    blk = torch.arange(8) // bundle.block_size
    mask = (blk[None, :] <= blk[:, None])[None, None]  # (1, 1, 8, 8) as the released sampler builds it
    with torch.no_grad():
        ours = bundle.net(input_ids=ids).logits
        theirs = released(input_ids=ids, attention_mask=mask.float(), position_ids=torch.arange(8)[None]).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
