"""Prefix and dual key/value caches of the masked-diffusion sampler (sampling/cache.py,
docs/methods.md §10)."""

from dataclasses import replace

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig, check_cache_support, encode_prompts, logits_fn
from diffusion_rl.sampling import RowNoise, SamplerConfig, generate
from diffusion_rl.sampling.trajectory import TrajectoryRecorder
from tests.helpers.released_layouts import write_checkpoint

PROMPTS = ["1203=", "40", "0000000000=", "12"]  # different lengths: padding and positions are exercised


def _model(n_layers: int, scale: float = 6.0):
    torch.manual_seed(0)
    b = build_policy(ModelConfig(d_model=32, n_layers=n_layers, n_heads=2))
    with torch.no_grad():  # confident, well-separated predictions: no argmax near-ties
        for p in b.net.parameters():
            p.mul_(scale)
    return b, b.net.eval()


def _run(b, net, cfg, seed=3, recorder=None):
    ids, mask = encode_prompts(b.tokenizer, PROMPTS)
    return generate(logits_fn(net), ids, mask, cfg, b.mask_token_id, RowNoise.rows(seed, 0, ids.shape[0]), recorder,
                    net=net, eos_id=b.eos_token_id)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("decode", ["fixed", "threshold"])
def test_a_refresh_every_step_is_the_uncached_sampler(cache, decode):
    b, net = _model(2)
    cfg = SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=0.9, decode=decode, threshold=0.5)
    ref = _run(b, net, cfg)
    out = _run(b, net, replace(cfg, cache=cache, kv_cache_refresh=1))
    assert torch.equal(out.completion, ref.completion)
    assert torch.equal(out.token_logp, ref.token_logp)
    assert out.forward_tokens == ref.forward_tokens  # every step was a full forward


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_caches_are_exact_for_a_one_layer_model(cache):
    """One layer: cached keys/values depend only on their own token and position, which do not change
    within a block (the prefix is fixed, the suffix stays masked), so the caches are exact; this also
    checks that the block attends to a prefix + suffix cache in any key order as to the whole sequence."""
    b, net = _model(1)
    cfg = SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=0.0)
    ref = _run(b, net, cfg)
    out = _run(b, net, replace(cfg, kv_cache=cache))
    assert torch.equal(out.completion, ref.completion)
    assert torch.allclose(out.token_logp, ref.token_logp, atol=1e-5)
    assert out.forward_tokens < ref.forward_tokens


def test_a_deeper_model_sees_stale_states():
    """Two layers: the cached states are approximations (the point of measuring them), and the
    uncached steps cost what the docstring says: a block start runs the whole sequence, a cached step
    the block and the suffix (prefix) or the block alone (dual)."""
    b, net = _model(2)
    cfg = SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=0.0)
    ids, _ = encode_prompts(b.tokenizer, PROMPTS)
    P, T = ids.shape[1], ids.shape[1] + 12
    runs = {c: _run(b, net, replace(cfg, kv_cache=c)) for c in ("none", "prefix", "dual")}
    assert runs["none"].forward_tokens == 6 * T
    assert runs["prefix"].forward_tokens == sum(T + (T - (P + 4 * k)) for k in range(3))  # 2 steps per block
    assert runs["dual"].forward_tokens == 3 * (T + 4)
    assert all(r.forwards == 6 for r in runs.values())
    assert not torch.allclose(runs["dual"].token_logp, runs["none"].token_logp, atol=1e-4)


def test_a_recorder_sees_full_width_steps_with_a_cache():
    """EGSPO's recorder gets the committed positions of every cached step at their place in the
    sequence, and its replayed states are the states the sampler was in."""
    b, net = _model(2)
    cfg = SamplerConfig(gen_length=12, block_length=4, steps=12, temperature=0.9, decode="threshold", threshold=0.5,
                        kv_cache="dual")
    seen = []

    class Spy(TrajectoryRecorder):
        def on_step(self, step, x_before, logits, candidates, committed):
            seen.append((x_before.clone(), committed & (candidates != self.mask_id)))
            super().on_step(step, x_before, logits, candidates, committed)

    rec = Spy(b.mask_token_id)
    out = _run(b, net, cfg, recorder=rec)
    assert torch.equal(rec.final, out.sequences) and rec.num_steps == out.steps == len(seen)
    for s, (x, committed) in enumerate(seen):
        assert torch.equal(rec.state_before(s), x)
        assert torch.equal(rec.commit_step.long() == s, committed)
    # the sampler's own log-prob of each committed token is the recorder's, step by step
    per_step = torch.stack([(out.token_logp * (rec.commit_step.long()[:, -12:] == s)).sum(-1) for s in range(rec.num_steps)], 1)
    assert torch.allclose(per_step, rec.logps, atol=1e-5)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_a_recorder_changes_no_sample_with_a_cache(cache):
    """With a recorder the cached steps compute every position's logits (its full-width steps); the
    sampler must still read the block's own: the same tokens and log-probs as without one."""
    b, net = _model(2)
    cfg = SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=0.9, kv_cache=cache)
    plain = _run(b, net, cfg)
    recorded = _run(b, net, cfg, recorder=TrajectoryRecorder(b.mask_token_id))
    assert torch.equal(recorded.completion, plain.completion)
    assert torch.allclose(recorded.token_logp, plain.token_logp, atol=1e-6)


def test_cache_support_is_checked_in_one_line():
    class NoCache(torch.nn.Module):
        pass

    class PrefixOnly(torch.nn.Module):
        supports_kv_cache = True

    check_cache_support(NoCache(), "none")
    with pytest.raises(ConfigError, match="sampler.kv_cache"):
        check_cache_support(NoCache(), "prefix")
    check_cache_support(PrefixOnly(), "prefix")
    with pytest.raises(ConfigError, match="kv_cache_any_order"):
        check_cache_support(PrefixOnly(), "dual")
    block = build_policy(ModelConfig(d_model=32, n_layers=1, n_heads=2, block_size=4)).net
    with pytest.raises(ConfigError, match="block model"):
        check_cache_support(block, "dual")


@pytest.mark.parametrize("arch,attention", [("llada", "bidirectional"), ("llada", "native"), ("dream", "native")])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_native_released_models_take_both_caches(arch, attention, cache, tmp_path):
    """Our LLaDA (padding masked, or as released: attended, positions count it) and Dream (shifted logits: the token before
    the block is run too) under the released layout, one layer: the caches are exact, as for the
    embedded model, with prompts of different lengths (left padding)."""
    layers = {"llada": {"n_layers": 1}, "dream": {"num_hidden_layers": 1}}[arch]
    folder = write_checkpoint(arch, tmp_path / arch, real_ids=False, overrides=layers)
    b = build_policy(ModelConfig(name="hf", path=str(folder), attention=attention))
    net = b.net.eval()
    assert net.mask_padding == (attention == "bidirectional" or arch == "dream")
    with torch.no_grad():  # confident, well-separated predictions: no argmax near-ties
        for p in net.parameters():
            p.mul_(3.0)
    assert net.config.to_dict().get("n_layers", net.config.to_dict().get("num_hidden_layers")) == 1
    cfg = SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=0.0)
    ref = _run(b, net, cfg)
    out = _run(b, net, replace(cfg, kv_cache=cache))
    assert torch.equal(out.completion, ref.completion)
    assert torch.allclose(out.token_logp, ref.token_logp, atol=1e-4)
    assert out.forward_tokens < ref.forward_tokens
