"""LLaDA (models/llada.py) against an independent transcription of its forward (docs/methods.md §9),
on a tiny random checkpoint in the released layout: as released (padding attended, positions count
it) and with the padding-aware option. With ``DIFFUSION_RL_REMOTE_CODE_DIR`` set, also against the
released ``modeling_llada.py`` (skipped otherwise)."""

from __future__ import annotations

import json

import pytest
import torch

from diffusion_rl.models.build import build_policy, discover_models
from diffusion_rl.models.llada import LLaDAModelLM
from diffusion_rl.models.policy import ModelConfig, logits_fn
from tests.helpers.reference_models import (
    auto_registries_restored,
    checkpoint_tensors,
    llada_forward,
    padded_positions,
    released_model,
)
from tests.helpers.released_layouts import write_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder = write_checkpoint("llada", tmp_path_factory.mktemp("llada"), real_ids=False)
    return folder, json.loads((folder / "config.json").read_text()), checkpoint_tensors(folder)


def batch(vocab: int):
    ids = torch.randint(0, vocab, (2, 7), generator=torch.Generator().manual_seed(1))
    keep = torch.ones_like(ids)
    keep[0, :3] = 0  # left padding
    return ids, keep


def model(folder):
    from transformers import AutoModel

    discover_models()
    return AutoModel.from_pretrained(folder, dtype=torch.float32).eval()


def test_released_forward_attends_over_padding_like_the_transcription(ckpt):
    folder, cfg, sd = ckpt
    m = model(folder)
    ids, keep = batch(cfg["vocab_size"])
    B, L = ids.shape
    with torch.no_grad():
        out = m(ids, attention_mask=keep).logits
        ref = llada_forward(sd, cfg, ids, allowed=lambda b, i, j: True, positions=[list(range(L))] * B)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert torch.equal(out, m(ids).logits)  # the padding mask changes nothing, as released


def test_padding_aware_option_masks_padding_and_skips_it_in_positions(ckpt):
    folder, cfg, sd = ckpt
    m = model(folder)
    m.config.mask_padding = True
    ids, keep = batch(cfg["vocab_size"])
    real = keep.bool()
    with torch.no_grad():
        out = m(ids, attention_mask=keep).logits
        ref = llada_forward(sd, cfg, ids, allowed=lambda b, i, j: bool(keep[b, j]) or i == j,
                            positions=padded_positions(keep))
        torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[0, 3:], m(ids[:1, 3:]).logits[0], atol=1e-5, rtol=1e-5)  # = unpadded
        m.config.mask_padding = False
        assert not torch.allclose(m(ids, attention_mask=keep).logits[0, 3:], out[0, 3:], atol=1e-4)


def test_model_attention_chooses_the_padding_rule(ckpt):
    folder, cfg, _ = ckpt
    ids, keep = batch(cfg["vocab_size"])
    outs = {}
    for attention in ("native", "bidirectional"):
        b = build_policy(ModelConfig(name="hf", path=str(folder), attention=attention))
        with torch.no_grad():
            outs[attention] = logits_fn(b.net.eval())(ids, keep)
        assert b.net.model.config.mask_padding == (attention == "bidirectional")
    assert torch.allclose(outs["native"][1], outs["bidirectional"][1], atol=1e-6)  # no padding: same
    assert not torch.allclose(outs["native"][0, 3:], outs["bidirectional"][0, 3:], atol=1e-4)


def test_matches_the_released_modelling_code(ckpt, tmp_path):
    folder, cfg, _ = ckpt
    released = released_model("llada", folder, tmp_path)
    ids, keep = batch(cfg["vocab_size"])
    with torch.no_grad():
        ours = model(folder)(ids, attention_mask=keep).logits
        torch.testing.assert_close(ours, released(input_ids=ids, attention_mask=keep).logits, atol=1e-5, rtol=1e-5)
    with auto_registries_restored():  # and through model.impl=remote, its post_init shim included
        remote = build_policy(ModelConfig(name="hf", path=str(tmp_path / "released_llada"), impl="remote",
                                          trust_remote_code=True, attention="native"))
    mro = type(remote.net.model).__mro__  # their class (under the shim), not ours
    assert mro[1].__module__.startswith("transformers_modules") and not any(c is LLaDAModelLM for c in mro)
    with torch.no_grad():
        torch.testing.assert_close(logits_fn(remote.net.eval())(ids, keep), ours, atol=1e-5, rtol=1e-5)
