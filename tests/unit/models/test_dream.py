"""Dream (models/dream.py) against an independent transcription of its forward (docs/methods.md §9),
on a tiny random checkpoint in the released layout, and its shifted logits hidden from the policy
interface. With ``DIFFUSION_RL_REMOTE_CODE_DIR`` set, also against the released
``modeling_dream.py``."""

from __future__ import annotations

import json

import pytest
import torch

from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig, logits_fn
from diffusion_rl.sampling import SamplerConfig, generate
from tests.helpers.reference_models import (
    checkpoint_tensors,
    padded_positions,
    qwen_forward,
    released_model,
)
from tests.helpers.released_layouts import write_checkpoint


@pytest.fixture(scope="module", params=["dream", "diffucoder"])  # diffucoder: dream's architecture, its preset's layout
def ckpt(request, tmp_path_factory):
    folder = write_checkpoint(request.param, tmp_path_factory.mktemp(request.param), real_ids=False)
    cfg = json.loads((folder / "config.json").read_text())
    bundle = build_policy(ModelConfig(name="hf", path=str(folder)))
    bundle.net.eval()
    return folder, cfg, checkpoint_tensors(folder), bundle


def batch(vocab: int, L: int = 7):
    ids = torch.randint(0, vocab - 8, (2, L), generator=torch.Generator().manual_seed(2))
    keep = torch.ones_like(ids)
    keep[0, :2] = 0  # left padding
    return ids, keep


def raw_reference(sd, cfg, ids, keep):
    """The released semantics: outer-AND padding mask, positions cumsum(mask) - 1; raw (shifted) logits."""
    return qwen_forward(sd, cfg, ids, allowed=lambda b, i, j: bool(keep[b, j]) or i == j,
                        positions=padded_positions(keep))


def test_raw_forward_matches_the_transcription(ckpt):
    folder, cfg, sd, bundle = ckpt
    ids, keep = batch(cfg["vocab_size"])
    real = keep.bool()
    with torch.no_grad():
        raw = bundle.net.model(ids, attention_mask=keep).logits
        torch.testing.assert_close(raw[real], raw_reference(sd, cfg, ids, keep)[real], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(raw[0, 2:], bundle.net.model(ids[:1, 2:]).logits[0], atol=1e-5, rtol=1e-5)


def test_policy_logits_at_i_are_the_models_output_at_i_minus_1(ckpt):
    """Fails if the shift is dropped (or applied twice): position i must be predicted from i - 1."""
    folder, cfg, sd, bundle = ckpt
    ids, keep = batch(cfg["vocab_size"])
    with torch.no_grad():
        policy = logits_fn(bundle.net)(ids, keep)  # what samplers and estimators read
        ref = raw_reference(sd, cfg, ids, keep)
    torch.testing.assert_close(policy[1, 1:], ref[1, :-1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(policy[0, 3:], ref[0, 2:-1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(policy[:, 0], ref[:, 0], atol=1e-5, rtol=1e-5)  # as the released sampler
    assert not torch.allclose(policy[1, 1:], ref[1, 1:], atol=1e-3)


def test_sampler_fills_the_first_mask_from_the_last_prompt_token(ckpt):
    folder, cfg, sd, bundle = ckpt
    ids, keep = batch(cfg["vocab_size"], L=5)
    scfg = SamplerConfig(gen_length=4, steps=4, block_length=4, temperature=0.0)
    out = generate(logits_fn(bundle.net), ids, keep, scfg, bundle.mask_token_id)
    full = torch.cat([ids, torch.full((2, 4), bundle.mask_token_id)], 1)
    fkeep = torch.cat([keep, torch.ones(2, 4, dtype=keep.dtype)], 1)
    raw = raw_reference(sd, cfg, full, fkeep)  # (2, 9, V): raw[:, i] predicts position i + 1
    pred = raw[:, 4:8]  # the predictions of the completion positions 5..8, from positions 4..7
    first = pred.softmax(-1).max(-1).values.argmax(-1)  # the most confident position commits first
    for r in range(2):
        p = int(first[r])
        assert int(out.completion[r, p]) == int(pred[r, p].argmax())


def test_cache_carries_the_prediction_of_the_first_new_token(ckpt):
    """The cache returned with use_cache=True holds the raw logits of its last position (they predict
    the first new token); a cache without them is refused. (That cached and full forwards agree is
    tests/unit/models/test_native.py's prefix-cache test, Dream included.)"""
    folder, cfg, sd, bundle = ckpt
    net = bundle.net
    ids, keep = batch(cfg["vocab_size"], L=9)
    with torch.no_grad():
        pre = net(input_ids=ids[:, :5], attention_mask=keep[:, :5], use_cache=True)
        raw = net.model(ids[:, :5], attention_mask=keep[:, :5]).logits
        torch.testing.assert_close(pre.past_key_values.next_logits, raw[:, -1])
        rest = net(input_ids=ids[:, 5:], attention_mask=keep, past_key_values=pre.past_key_values).logits
        torch.testing.assert_close(rest[:, 0], raw[:, -1])
        with pytest.raises(ValueError, match="next_logits"):
            net(input_ids=ids[:, 5:], attention_mask=keep, past_key_values=list(pre.past_key_values))


def test_matches_the_released_modelling_code(ckpt, tmp_path):
    folder, cfg, _, bundle = ckpt
    released = released_model("dream", folder, tmp_path)
    ids = batch(cfg["vocab_size"])[0]
    with torch.no_grad():
        torch.testing.assert_close(bundle.net.model(ids).logits, released(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
