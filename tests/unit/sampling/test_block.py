"""Block diffusion: block-causal model, exact key/value cache, block sampler, staircase ELBO
(docs/methods.md §1-3)."""

import json

import pytest
import torch

from diffusion_rl.app.train import build, train
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.elbo import ELBOConfig, ELBOEstimator
from diffusion_rl.likelihood.staircase import (
    StaircaseConfig,
    StaircaseEstimator,
    staircase_logits,
    staircase_mask,
)
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig, encode_prompts, logits_fn
from diffusion_rl.rl.objectives.grpo import GRPO, GRPOConfig
from diffusion_rl.rl.objectives.stabledrl import StableDRL, StableDRLConfig
from diffusion_rl.sampling import RowNoise, SamplerConfig, generate, sample
from diffusion_rl.sampling.block import block_generate, check_block_sampler
from tests.helpers.common import compose_cfg

BS = 4


@pytest.fixture
def block_bundle():
    torch.manual_seed(0)
    b = build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2, block_size=BS))
    b.net.eval()
    return b


def _data(bundle, prompts=("1203004000102300=", "12=", "3201="), L=16, eos_at=(None, 9, 3)):
    """Left-padded prompts (P whole blocks), random completions with an EOS at the given positions."""
    ids, mask = encode_prompts(bundle.tokenizer, list(prompts), pad_to_multiple_of=BS)
    g = torch.Generator().manual_seed(5)
    comp = torch.randint(5, 90, (len(prompts), L), generator=g)
    cmask = torch.ones(len(prompts), L)
    for r, e in enumerate(eos_at):
        if e is not None:
            comp[r, e:] = bundle.eos_token_id
            cmask[r, e + 1:] = 0
    return ids, mask, comp, cmask


# ---- the block-causal model and its cache -------------------------------------------------------
def test_later_blocks_do_not_change_earlier_block_logits(block_bundle):
    net = block_bundle.net
    x = torch.randint(5, 90, (2, 16), generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[:, 8:] = torch.randint(5, 90, (2, 8), generator=torch.Generator().manual_seed(1))  # blocks 2, 3
    lx, ly = net(input_ids=x).logits, net(input_ids=y).logits
    assert torch.allclose(lx[:, :8], ly[:, :8], atol=1e-6)
    assert not torch.allclose(lx[:, 8:], ly[:, 8:], atol=1e-3)
    z = x.clone()
    z[:, 7] = (x[:, 7] + 1) % 90  # the last token of block 1: seen by all of block 1 (bidirectional)
    lz = net(input_ids=z).logits
    assert torch.allclose(lx[:, :4], lz[:, :4], atol=1e-6)
    assert not torch.allclose(lx[:, 4:7], lz[:, 4:7], atol=1e-3)


def test_kv_cache_gives_the_full_forward_logits(block_bundle):
    net = block_bundle.net
    ids, mask, comp, _ = _data(block_bundle)
    x = torch.cat([ids, comp], 1)
    keep = torch.cat([mask, torch.ones_like(comp)], 1)
    full = net(input_ids=x, attention_mask=keep).logits  # (B, T, V)
    P = ids.shape[1]
    cache = net(input_ids=x[:, :P], attention_mask=keep[:, :P], use_cache=True).past_key_values
    assert len(cache) == 2 and cache[0][0].shape[-2] == P
    for s in range(P, x.shape[1], BS):
        out = net(input_ids=x[:, s:s + BS], attention_mask=keep[:, :s + BS], past_key_values=cache, use_cache=True)
        assert torch.allclose(out.logits, full[:, s:s + BS], atol=1e-5)
        cache = out.past_key_values
    assert cache[0][0].shape[-2] == x.shape[1]
    assert net(input_ids=x).past_key_values is None  # the plain call is unchanged


# ---- block sampler --------------------------------------------------------------------------------
@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
def test_cached_block_sampler_equals_uncached_at_temperature_zero(block_bundle, remasking):
    ids, mask, _, _ = _data(block_bundle)
    cfg = SamplerConfig(gen_length=16, block_length=BS, steps=8, temperature=0.0, remasking=remasking)
    m = block_bundle.mask_token_id
    g = lambda: RowNoise.rows(3, 0, ids.shape[0])  # noqa: E731
    cached = block_generate(block_bundle.net, ids, mask, cfg, BS, m, g())
    uncached = block_generate(block_bundle.net, ids, mask, cfg, BS, m, g(), use_cache=False)
    assert torch.equal(cached.completion, uncached.completion)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert not (cached.completion == m).any()
    if remasking == "low_confidence":  # an independent implementation: the masked-diffusion sampler
        ref = generate(logits_fn(block_bundle.net), ids, mask, cfg, m).completion  # on blocks of the model's size
        assert torch.equal(cached.completion, ref)


def test_cached_block_sampler_equals_uncached_with_gumbel_noise(block_bundle):
    ids, mask, _, _ = _data(block_bundle)
    cfg = SamplerConfig(gen_length=16, block_length=BS, steps=16, temperature=0.9)
    m = block_bundle.mask_token_id
    a = block_generate(block_bundle.net, ids, mask, cfg, BS, m, RowNoise.rows(1, 0, ids.shape[0]))
    b = block_generate(block_bundle.net, ids, mask, cfg, BS, m, RowNoise.rows(1, 0, ids.shape[0]), use_cache=False)
    c = block_generate(block_bundle.net, ids, mask, cfg, BS, m, RowNoise.rows(2, 0, ids.shape[0]))
    assert torch.equal(a.completion, b.completion)
    assert not torch.equal(a.completion, c.completion)


def test_block_sampler_aligns_an_unaligned_prompt_and_records_full_width(block_bundle):
    ids, mask = encode_prompts(block_bundle.tokenizer, ["1203004000102300=", "12="])  # P = 17
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=4, temperature=0.0)
    m = block_bundle.mask_token_id
    seen = []

    class Rec:
        def on_step(self, step, x_before, logits, candidates, committed):
            seen.append((step, x_before.shape, logits.shape, int(committed.sum())))

    out = sample(block_bundle, ids, mask, cfg, recorder=Rec())
    ids20, mask20 = encode_prompts(block_bundle.tokenizer, ["1203004000102300=", "12="], pad_to_multiple_of=BS)
    ref = block_generate(block_bundle.net, ids20, mask20, cfg, BS, m, use_cache=False)
    assert out.sequences.shape == (2, 17 + 8) and torch.equal(out.completion, ref.completion)
    assert [s[0] for s in seen] == [0, 1, 2, 3]
    assert all(s[1] == (2, 28) and s[2][:2] == (2, 28) and s[3] == 4 for s in seen)  # 2 tokens x 2 rows


def test_block_sampler_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="sampler.steps"):
        check_block_sampler(SamplerConfig(gen_length=16, block_length=16, steps=6), BS)
    with pytest.raises(ConfigError, match="sampler.gen_length"):
        check_block_sampler(SamplerConfig(gen_length=18, block_length=18, steps=9), BS)


# ---- staircase -------------------------------------------------------------------------------------
def test_staircase_mask_follows_the_spec_rule():
    P, L, bs = 4, 6, 2
    m = staircase_mask(P, L, bs)
    T = P + L
    for a in range(T + L):
        for b in range(T + L):
            na, nb_ = a >= T, b >= T
            ba = (a - L if na else a) // bs
            bb = (b - L if nb_ else b) // bs
            want = (not na and not nb_ and bb <= ba) or (na and not nb_ and bb < ba) or (na and nb_ and bb == ba)
            assert bool(m[a, b]) == want, (a, b)
    assert staircase_mask(P, L, bs) is m  # built once per shape


def _est(bundle, **kw):
    est = StaircaseEstimator(StaircaseConfig(**kw), bundle.mask_token_id)
    est.bind(bundle)
    return est


@pytest.mark.parametrize("weighting,p_prompt", [("inverse_t", 0.0), ("mean", 0.3)])
def test_one_pass_equals_one_forward_per_block(block_bundle, weighting, p_prompt):
    ids, mask, comp, cmask = _data(block_bundle)
    fwd = logits_fn(block_bundle.net)
    seeds = [11, 12, 13]
    kw = dict(num_samples=3, weighting=weighting, p_mask_prompt=p_prompt)
    one = _est(block_bundle, **kw)
    naive = _est(block_bundle, one_pass=False, **kw)
    s1 = one.sample(fwd, ids, mask, comp, cmask, seeds)
    s2 = naive.sample(fwd, ids, mask, comp, cmask, seeds)
    assert torch.equal(s1.masked, s2.masked) and torch.equal(s1.t, s2.t)
    assert torch.allclose(s1.token_logps[s1.masked], s2.token_logps[s2.masked], atol=1e-5)
    e1, e2 = one(fwd, ids, mask, comp, cmask, seeds), naive(fwd, ids, mask, comp, cmask, seeds)
    assert e1.shape == (3,) and torch.isfinite(e1).all()
    assert torch.allclose(e1, e2, rtol=1e-5, atol=1e-4)
    assert not torch.allclose(e1, one(fwd, ids, mask, comp, cmask, [1, 2, 3]), atol=1e-3)  # masks matter
    # every block with a scored token masks at least one; blocks after the EOS contribute nothing
    per_block = s1.masked.view(3, 3, -1, BS).any(-1)  # (K, B, nb)
    assert per_block[:, 0].all() and per_block[:, 1, :3].all() and not per_block[:, 1, 3].any()
    assert not per_block[:, 2, 1:].any()


def test_noisy_block_logits_do_not_see_later_clean_blocks(block_bundle):
    ids, mask, comp, _ = _data(block_bundle)
    fwd = logits_fn(block_bundle.net)
    m = block_bundle.mask_token_id
    noisy = comp.clone()
    noisy[:, ::2] = m
    base = staircase_logits(fwd, ids, mask, comp, noisy, BS)  # (B, L, V)
    g = torch.Generator().manual_seed(9)
    for b in range(4):
        s = b * BS
        changed = comp.clone()
        changed[:, s:] = torch.randint(5, 90, changed[:, s:].shape, generator=g)  # clean blocks >= b
        out = staircase_logits(fwd, ids, mask, changed, noisy, BS)
        assert torch.allclose(out[:, s:s + BS], base[:, s:s + BS], atol=1e-6), b
        if b > 0:  # the clean prefix does reach block b: the test can fail
            earlier = comp.clone()
            earlier[:, s - BS:s] = torch.randint(5, 90, (comp.shape[0], BS), generator=g)
            out = staircase_logits(fwd, ids, mask, earlier, noisy, BS)
            assert not torch.allclose(out[:, s:s + BS], base[:, s:s + BS], atol=1e-3), b
        other = noisy.clone()  # noisy tokens of the other blocks are invisible too
        keep = torch.zeros(comp.shape[1], dtype=torch.bool)
        keep[s:s + BS] = True
        other[:, ~keep] = torch.randint(5, 90, other[:, ~keep].shape, generator=g)
        out = staircase_logits(fwd, ids, mask, comp, other, BS)
        assert torch.allclose(out[:, s:s + BS], base[:, s:s + BS], atol=1e-6), b


def test_one_block_completion_equals_the_elbo(block_bundle):
    """With a single completion block both estimators see the same masks and the same attention."""
    ids, mask, comp, cmask = _data(block_bundle, L=BS, eos_at=(None, 2, None))
    fwd = logits_fn(block_bundle.net)
    seeds = [4, 5, 6]
    kw = dict(num_samples=2, p_mask_prompt=0.2)
    elbo = ELBOEstimator(ELBOConfig(**kw), block_bundle.mask_token_id)(fwd, ids, mask, comp, cmask, seeds)
    stair = _est(block_bundle, **kw)(fwd, ids, mask, comp, cmask, seeds)
    assert torch.allclose(elbo, stair, rtol=1e-5, atol=1e-4)


def test_bind_rejects_unsuitable_models(tiny_bundle, block_bundle):
    est = StaircaseEstimator(StaircaseConfig(), tiny_bundle.mask_token_id)
    with pytest.raises(ConfigError, match="block_size"):
        est.bind(tiny_bundle)
    block_bundle.custom_attention_mask = False
    with pytest.raises(ConfigError, match="model.custom_attention_mask"):
        est.bind(block_bundle)
    with pytest.raises(RuntimeError, match="bind"):
        est(None, None, None, torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4), [0])


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="model.custom_attention_mask"):
        build(compose_cfg(["model=tiny_block", "objective=stabledrl", "likelihood=staircase",
                           "model.custom_attention_mask=false"], tmp_path))
    with pytest.raises(ConfigError, match="likelihood.name"):
        build(compose_cfg(["objective=stabledrl", "likelihood=staircase"], tmp_path))
    with pytest.raises(ConfigError, match="sampler.steps"):
        build(compose_cfg(["model=tiny_block", "sampler.steps=6"], tmp_path))
    with pytest.raises(ConfigError, match="likelihood.weighting"):
        build(compose_cfg(["model=tiny_block", "likelihood=staircase", "likelihood.weighting=x"], tmp_path))


@pytest.mark.parametrize("objective", ["stabledrl", "grpo"])
def test_staircase_plugs_into_objectives(block_bundle, objective):
    from diffusion_rl.rl.objectives.base import StepContext
    from tests.helpers.common import rollout_of

    ids, mask, comp, cmask = _data(block_bundle)
    est = _est(block_bundle)
    obj = (StableDRL(StableDRLConfig(share_masks_with_old=True, surrogate="elbo"), est) if objective == "stabledrl"
           else GRPO(GRPOConfig(), est))
    ro = rollout_of(ids, mask, comp, cmask, torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.5, -0.5, 0.0]), 3, 0)
    fwd = logits_fn(block_bundle.net)
    loss, metrics = obj.loss(StepContext(ro, 0, 0, fwd, fwd, None))
    loss.backward()
    assert float(metrics["ratio/log_max"]) == pytest.approx(0.0, abs=1e-5)  # theta = theta_old, shared masks
    grads = [p.grad for p in block_bundle.net.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_block_model_stabledrl_staircase_end_to_end(tmp_path):
    cfg = compose_cfg(["model=tiny_block", "objective=stabledrl", "likelihood=staircase", "objective.surrogate=elbo",
                       "objective.mu=2"], tmp_path)
    summary = train(cfg, tmp_path / "run")
    assert summary["optimizer_steps"] == 4 and summary["rollouts"] == 2
    s = json.load(open(tmp_path / "run" / "summary.json"))
    assert s["config"]["model"]["block_size"] == BS and s["config"]["likelihood"]["name"] == "staircase"
    assert set(s["after"]) >= {"cell_accuracy", "valid_rate"}
