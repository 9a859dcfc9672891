"""LLaDA2 (models/llada2.py) against an independent transcription of its forward (docs/methods.md §9),
on a tiny random checkpoint built from the released LLaDA2.0-mini ``config.json``: block-causal
attention with left padding, the staircase estimator's input, the router token by token (and a test
that a wrong routing rule is caught), the block sampler with and without the cache, the frozen router
and its ``expert_bias`` buffer through training and checkpoints. With ``DIFFUSION_RL_REMOTE_CODE_DIR``
set (``llada2/`` holding the released ``modeling_llada2_moe.py`` and ``configuration_llada2_moe.py``),
also against the released code."""

from __future__ import annotations

import json

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.staircase import staircase_logits, staircase_mask
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.llada2 import LLaDA2MoE, LLaDA2Router, router_metrics
from diffusion_rl.models.policy import ModelConfig, logits_fn
from diffusion_rl.sampling import RowNoise, SamplerConfig
from diffusion_rl.sampling.block import block_generate
from tests.helpers.common import compose_cfg
from tests.helpers.reference_models import (
    checkpoint_tensors,
    llada2_forward,
    llada2_route,
    padded_positions,
    released_model,
)
from tests.helpers.released_layouts import FIXTURES, write_checkpoint

BS = 8  # a small block for the forward tests (the presets' 32 is read in test_the_presets_set_block_32)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder = write_checkpoint("llada2", tmp_path_factory.mktemp("llada2"), real_ids=False)
    cfg = json.loads((folder / "config.json").read_text())
    bundle = build_policy(ModelConfig(name="hf", path=str(folder), attention="native", block_size=BS))
    bundle.net.eval()
    return folder, cfg, checkpoint_tensors(folder), bundle


def test_block_causal_forward_with_padding_matches_the_transcription(ckpt):
    folder, cfg, sd, bundle = ckpt
    ids = torch.randint(0, cfg["vocab_size"] - 8, (2, 20), generator=torch.Generator().manual_seed(4))
    keep = torch.ones_like(ids)
    keep[0, :3] = 0  # left padding in the first block
    real = keep.bool()
    with torch.no_grad():
        out = bundle.net(input_ids=ids, attention_mask=keep).logits
    ref = llada2_forward(sd, cfg, ids, allowed=lambda b, i, j: (bool(keep[b, j]) and j // BS <= i // BS) or i == j,
                         positions=padded_positions(keep))
    assert (out[real] - ref[real]).abs().max() <= 1e-4
    ids2 = ids.clone()
    ids2[:, 16:] = (ids[:, 16:] + 1) % 50  # a later block changes nothing before it
    with torch.no_grad():  # equal up to rounding: the experts' batches of tokens change with the later block
        later = bundle.net(input_ids=ids2, attention_mask=keep).logits
    torch.testing.assert_close(later[:, :16], out[:, :16], atol=1e-6, rtol=1e-6)
    assert (later[:, 16:] - out[:, 16:]).abs().max() > 1e-3


def test_staircase_input_matches_the_transcription(ckpt):
    """``[prompt, clean, noisy]`` with shared positions (dFactory's ``[x_t ; x_0]`` training input)."""
    folder, cfg, sd, bundle = ckpt
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 90, (2, 8), generator=g)
    pmask = torch.ones_like(prompt)
    pmask[1, :2] = 0
    clean = torch.randint(0, 90, (2, 16), generator=g)
    noisy = torch.where(torch.rand(2, 16, generator=g) < 0.5, bundle.mask_token_id, clean)
    with torch.no_grad():
        out = staircase_logits(logits_fn(bundle.net), prompt, pmask, clean, noisy, BS)  # (2, 16, V)
    ids = torch.cat([prompt, clean, noisy], 1)
    keep = torch.cat([pmask, torch.ones(2, 32, dtype=pmask.dtype)], 1)
    rule = staircase_mask(8, 16, BS)
    pos = [p + p[8:] for p in padded_positions(keep[:, :24])]  # the noisy copy shares the clean positions
    ref = llada2_forward(sd, cfg, ids, allowed=lambda b, i, j: (bool(rule[i, j]) and bool(keep[b, j])) or i == j,
                         positions=pos)
    assert (out - ref[:, 24:]).abs().max() <= 1e-4


def test_the_router_chooses_and_weighs_as_released_token_by_token(ckpt):
    """Every token's chosen experts and weights equal the transcription's; the bias changes which
    experts some tokens get (so the rule that it only chooses is exercised)."""
    _, cfg, _, bundle = ckpt
    moe = next(m for m in bundle.net.modules() if isinstance(m, LLaDA2MoE))
    gate = moe.gate
    x = torch.randn(64, cfg["hidden_size"], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        experts, weights = gate(x)
        scores = torch.sigmoid(x @ gate.weight.T)
    bias = gate.expert_bias.tolist()
    moved = 0
    for t in range(x.shape[0]):
        ref = llada2_route(scores[t].tolist(), bias, cfg)
        ours = dict(zip(experts[t].tolist(), weights[t].tolist()))
        assert set(ours) == set(ref)
        for e, w in ref.items():
            assert abs(ours[e] - w) < 1e-6
        moved += set(ref) != set(llada2_route(scores[t].tolist(), [0.0] * len(bias), cfg))
    assert moved > 0


@pytest.mark.parametrize("rule", ["biased_weights", "no_groups", "unnormalised"])
def test_a_wrong_routing_rule_changes_the_logits(ckpt, rule):
    """The transcription with one routing rule wrong is far from our logits (and the right one is
    within 1e-4): the parity test above would catch that mistake in our router."""
    folder, cfg, sd, bundle = ckpt
    ids = torch.randint(0, cfg["vocab_size"] - 8, (1, 16), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        out = bundle.net(input_ids=ids).logits
    allowed = lambda b, i, j: j // BS <= i // BS  # noqa: E731
    pos = [list(range(16))]
    assert (out - llada2_forward(sd, cfg, ids, allowed, pos)).abs().max() <= 1e-4
    assert (out - llada2_forward(sd, cfg, ids, allowed, pos, rule=rule)).abs().max() > 1e-3


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_block_sampler_with_the_cache_gives_the_tokens_without_it(ckpt, temperature):
    _, _, _, bundle = ckpt
    ids = torch.randint(0, 90, (3, 6), generator=torch.Generator().manual_seed(6))
    keep = torch.ones_like(ids)
    keep[0, :2] = 0
    scfg = SamplerConfig(gen_length=16, steps=8, temperature=temperature)
    outs = [block_generate(bundle.net, ids, keep, scfg, BS, bundle.mask_token_id,
                           RowNoise.rows(0, 0, ids.shape[0]), use_cache=c).sequences for c in (True, False)]
    assert torch.equal(outs[0], outs[1])


def test_the_router_is_frozen_its_bias_never_trains_and_both_are_checkpointed(ckpt, tmp_path):
    folder, cfg, sd, _ = ckpt
    for train_router in (False, True):
        b = build_policy(ModelConfig(name="hf", path=str(folder), attention="native", block_size=BS,
                                     train_router=train_router))
        net = b.net.train()
        routers = [m for m in net.modules() if isinstance(m, LLaDA2Router)]
        assert len(routers) == cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]
        assert all(r.weight.requires_grad == train_router for r in routers)
        assert all(not r.expert_bias.requires_grad for r in routers)
        before = {n: t.clone() for n, t in net.state_dict().items() if ".gate." in n}
        opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=1.0)
        ids = torch.randint(0, 90, (2, 16), generator=torch.Generator().manual_seed(2))
        net(input_ids=ids).logits.logsumexp(-1).mean().backward()
        opt.step()
        after = net.state_dict()
        for name, t in before.items():
            moved = not torch.equal(after[name], t)
            assert moved == (train_router and name.endswith(".weight")), name
        load = net.model.router_load()  # tokens per expert, per MoE layer, in the last forward
        assert load.shape == (len(routers), cfg["num_experts"])
        assert (load.sum(1) == ids.numel() * cfg["num_experts_per_tok"]).all()
        m = router_metrics(net)  # what each update logs
        mean = ids.numel() * cfg["num_experts_per_tok"] / cfg["num_experts"]
        assert m["moe/load_max_over_mean"] == pytest.approx(float(load.max()) / mean)
        assert m["moe/idle_expert_frac"] == pytest.approx(float((load == 0).float().mean()))
    net.model.save_pretrained(tmp_path / "saved")  # what a checkpoint of the full model holds
    saved = checkpoint_tensors(tmp_path / "saved")
    biases = [n for n in saved if n.endswith("mlp.gate.expert_bias")]
    assert len(biases) == len(routers) and all(torch.equal(saved[n], sd[n]) for n in biases)


def test_every_expert_has_a_gradient_even_when_no_token_reached_it(ckpt):
    """Data-parallel reductions need every trainable parameter to take part: unused experts get zeros."""
    _, _, _, bundle = ckpt
    b = build_policy(ModelConfig(name="hf", path=str(ckpt[0]), attention="native", block_size=BS))
    net = b.net.train()
    ids = torch.randint(0, 90, (1, 2), generator=torch.Generator().manual_seed(3))  # 2 tokens: most experts idle
    net(input_ids=ids).logits.logsumexp(-1).mean().backward()
    idle = (net.model.router_load() == 0).sum().item()
    assert idle > 0
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)


def test_the_presets_set_block_32_and_a_missing_block_size_fails_in_one_line(ckpt, tmp_path):
    folder = ckpt[0]
    for preset in ("llada2_mini", "llada2_1_mini"):
        composed = compose_cfg([f"model={preset}", f"model.path={folder}"], tmp_path, tiny=False).model
        assert composed.block_size == 32 and composed.train_router is False
    with pytest.raises(ConfigError) as err:
        build_policy(ModelConfig(name="hf", path=str(folder), attention="native"))
    assert "\n" not in str(err.value) and str(err.value).startswith("model.block_size")


def test_matches_what_the_released_code_computed(ckpt):
    """Logits and chosen experts of the released ``modeling_llada2_moe.py`` (transformers 4.57.1), recorded
    on this same tiny checkpoint by tests/helpers/record_released.py (the released code does not import
    under transformers 5)."""
    _, _, _, bundle = ckpt
    rec = json.loads((FIXTURES.parent / "released_outputs" / "llada2.json").read_text())
    ids, block = torch.tensor(rec["ids"]), rec["block"]
    assert block == BS
    chosen: list[list] = []
    hooks = [m.gate.register_forward_hook(lambda mod, a, o: chosen.append(o[0].view(*ids.shape, -1)))
             for m in bundle.net.modules() if isinstance(m, LLaDA2MoE)]
    try:
        with torch.no_grad():
            ours = bundle.net(input_ids=ids).logits
    finally:
        for h in hooks:
            h.remove()
    assert (ours - torch.tensor(rec["logits"])).abs().max() <= 1e-4
    assert len(chosen) == len(rec["experts"])
    for layer, theirs in zip(chosen, rec["experts"]):
        assert torch.equal(layer.sort(-1).values, torch.tensor(theirs).sort(-1).values)


def test_matches_the_released_modelling_code(ckpt, tmp_path):
    """The same, live, where the released code imports (``DIFFUSION_RL_REMOTE_CODE_DIR``; skipped otherwise)."""
    folder, cfg, _, bundle = ckpt
    released = released_model("llada2", folder, tmp_path)
    ids = torch.randint(0, 90, (2, 16), generator=torch.Generator().manual_seed(7))
    blk = torch.arange(16) // BS
    allowed = (blk[None, :] <= blk[:, None])[None, None].expand(2, 1, 16, 16)  # as the released 2.0 sampler
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    with torch.no_grad():
        ours = bundle.net(input_ids=ids).logits
        theirs = released(input_ids=ids, attention_mask=additive, position_ids=torch.arange(16)[None]).logits
    assert (ours - theirs.float()).abs().max() <= 1e-4


# ---- LLaDA2.1's token editing ---------------------------------------------------------------------
def released_editing_sampler(net, prompt: torch.Tensor, gen: int, block: int, mask_id: int, threshold: float,
                             editing_threshold: float, max_post_steps: int) -> torch.Tensor:
    """LLaDA2.1's released ``generate`` for one row at temperature 0, as plainly as possible: a window
    rerun over the block-causal mask each step, threshold unmasking (at least one token), editing of
    the block's decoded tokens, then passes over the full block while they change something. The
    prompt fills whole blocks, as the block sampler here aligns it."""
    x = torch.cat([prompt, torch.full((1, gen), mask_id)], 1)
    P = prompt.shape[1]
    for start in range(P, P + gen, block):
        end = start + block
        post = 0
        while True:
            old = x[0, start:end].clone()
            masked = old == mask_id
            if not masked.any():
                post += 1
            if post > max_post_steps:
                break
            blk = torch.arange(end) // block
            allowed = (blk[None, :] <= blk[:, None])[None, None]
            logits = net(input_ids=x[:, :end], attention_mask=allowed, position_ids=torch.arange(end)[None]).logits
            probs = logits[0, start:end].float().softmax(-1)
            tok = probs.argmax(-1)
            conf = probs.gather(-1, tok[:, None])[:, 0]
            unmask = torch.zeros(block, dtype=torch.bool)
            if masked.any():
                high = (conf > threshold) & masked
                if high.sum() >= 1:
                    unmask = high
                else:
                    unmask[torch.where(masked, conf, -torch.inf).argmax()] = True
            edit = ~masked & (conf > editing_threshold) & (tok != old)
            x[0, start:end] = torch.where(unmask | edit, tok, old)
            if not masked.any() and not edit.any():
                break
    return x[:, P:]


def test_token_editing_gives_the_released_samplers_tokens(ckpt):
    """Greedy threshold decoding with editing through the cached block sampler equals the released
    2.1 sampler's tokens (transcribed above), on a model whose head is scaled up so that tokens are
    confident enough to be unmasked in parallel and edited."""
    folder = ckpt[0]
    b = build_policy(ModelConfig(name="hf", path=str(folder), attention="native", block_size=BS))
    net = b.net.eval()
    with torch.no_grad():
        net.model.lm_head.weight.mul_(40.0)
    g = torch.Generator().manual_seed(8)
    edited = 0.0
    for row in range(4):
        prompt = torch.randint(0, 90, (1, BS), generator=g)
        cfg = SamplerConfig(gen_length=3 * BS, steps=3 * BS, temperature=0.0, decode="threshold", threshold=0.6,
                            editing_threshold=0.5, max_post_steps=4)
        with torch.no_grad():
            ours = block_generate(net, prompt, None, cfg, BS, b.mask_token_id, RowNoise.rows(0, row, 1))
            theirs = released_editing_sampler(net, prompt, 3 * BS, BS, b.mask_token_id, 0.6, 0.5, 4)
        assert torch.equal(ours.completion, theirs)
        edited += ours.edited
    assert edited > 0  # editing happened: the comparison covers it


def test_editing_off_or_never_confident_enough_changes_no_token(ckpt):
    """Greedy (at a temperature above 0 the passes over full blocks draw noise, so later blocks differ)."""
    _, _, _, bundle = ckpt
    ids = torch.randint(0, 90, (2, BS), generator=torch.Generator().manual_seed(12))
    outs = []
    for thr in (None, 1.0):
        cfg = SamplerConfig(gen_length=2 * BS, steps=2 * BS, temperature=0.0, editing_threshold=thr)
        outs.append(block_generate(bundle.net, ids, None, cfg, BS, bundle.mask_token_id, RowNoise.rows(0, 0, 2)))
    assert torch.equal(outs[0].completion, outs[1].completion) and outs[1].edited == 0
    assert outs[1].forwards == outs[0].forwards + 2  # one pass over each full block found nothing to edit


def test_editing_is_refused_where_it_cannot_run(ckpt, tmp_path):
    from dataclasses import replace

    from diffusion_rl.sampling import sample

    _, _, _, bundle = ckpt
    ids = torch.randint(0, 90, (1, BS), generator=torch.Generator().manual_seed(1))
    cfg = SamplerConfig(gen_length=BS, steps=BS, editing_threshold=0.5)
    with pytest.raises(ConfigError, match="sampler.editing_threshold"):  # not a block model
        sample(replace(bundle, block_size=0), ids, None, cfg)
    with pytest.raises(ConfigError, match="sampler.editing_threshold"):
        SamplerConfig(editing_threshold=1.5).validate()
    cfg_train = compose_cfg(["objective=tracerl", "sampler.editing_threshold=0.5"], tmp_path)
    from diffusion_rl.app.train import train

    with pytest.raises(ConfigError, match="sampler.editing_threshold"):  # trains on the recorded steps
        train(cfg_train, tmp_path / "run")
