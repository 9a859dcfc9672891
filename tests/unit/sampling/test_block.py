"""Block diffusion: block-causal model, exact key/value cache, block sampler, the staircase ELBO in configs
and objectives (docs/methods.md §1-3). The staircase estimator itself is tested in
tests/unit/likelihood/test_staircase.py."""


import pytest
import torch

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.policy import encode_prompts, logits_fn
from diffusion_rl.rl.objectives.grpo import GRPO, GRPOConfig
from diffusion_rl.rl.objectives.stabledrl import StableDRL, StableDRLConfig
from diffusion_rl.sampling import RowNoise, SamplerConfig, generate, sample
from diffusion_rl.sampling.block import block_generate, check_block_sampler
from tests.helpers.blocks import BS, block_data, staircase_of
from tests.helpers.common import compose_cfg


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
    ids, mask, comp, _ = block_data(block_bundle)
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
    ids, mask, _, _ = block_data(block_bundle)
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
    ids, mask, _, _ = block_data(block_bundle)
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


# ---- staircase in configs and objectives -----------------------------------------------------------
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

    ids, mask, comp, cmask = block_data(block_bundle)
    est = staircase_of(block_bundle)
    obj = (StableDRL(StableDRLConfig(share_masks_with_old=True, surrogate="elbo"), est) if objective == "stabledrl"
           else GRPO(GRPOConfig(), est))
    ro = rollout_of(ids, mask, comp, cmask, torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.5, -0.5, 0.0]), 3, 0)
    fwd = logits_fn(block_bundle.net)
    loss, metrics = obj.loss(StepContext(ro, 0, 0, fwd, fwd, None))
    loss.backward()
    assert float(metrics["ratio/log_max"]) == pytest.approx(0.0, abs=1e-5)  # theta = theta_old, shared masks
    grads = [p.grad for p in block_bundle.net.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


# ---- LLaDA2.1's token editing, hand-computed ---------------------------------------------------------
def test_an_edit_replaces_a_decoded_token_of_a_live_row_only_above_the_threshold():
    from diffusion_rl.sampling.block import edits

    M = 9
    probs = torch.full((2, 3, 4), 0.25)
    probs[0, 0] = torch.tensor([0.2, 0.6, 0.1, 0.1])  # row 0, position 0: token 1 at 0.6 over the decoded 2
    probs[0, 2] = torch.tensor([0.5, 0.2, 0.2, 0.1])  # position 2: token 0 at exactly the threshold
    probs[1, 0] = torch.tensor([0.05, 0.025, 0.025, 0.9])  # row 1 has ended: never edited
    block = torch.tensor([[2, M, 3], [1, 1, 1]])
    cand = torch.tensor([[1, 0, 0], [3, 1, 1]])
    live = torch.tensor([True, False])
    cfg = SamplerConfig(editing_threshold=0.5)
    got = edits(probs.log(), cand, block, live, M, cfg)
    assert got.tolist() == [[True, False, False], [False, False, False]]  # a masked position is decoding, not editing
    assert edits(probs.log(), cand, block, torch.tensor([True, True]), M, cfg)[1].tolist() == [True, False, False]
    assert not edits(probs.log(), cand, block, live, M, SamplerConfig(editing_threshold=0.65)).any()


def test_revision_passes_edit_until_nothing_changes_and_only_with_editing_on():
    from diffusion_rl.sampling.block import _revise_block
    from diffusion_rl.sampling.sampler import CommitStats

    M = 9
    logits = torch.full((1, 3, 4), -5.0)
    logits[0, :, 3] = 0.0
    logits[0, 0, 1] = 5.0  # the model now prefers 1 at position 0 (p ~ 0.99)
    calls = []

    def logits_of():
        calls.append(1)
        return logits

    for cfg, passes, edited in ((SamplerConfig(temperature=0.0, editing_threshold=0.9), 2, 1.0),
                                (SamplerConfig(temperature=0.0, editing_threshold=0.9, max_post_steps=0), 0, 0.0),
                                (SamplerConfig(temperature=0.0), 0, 0.0)):
        x = torch.tensor([[7, 7, 2, 3, 3]])  # the block is x[:, 2:5]
        calls.clear()
        stats = CommitStats(1, 5, torch.device("cpu"))
        _revise_block(x, logits_of, 2, 5, torch.tensor([True]), cfg, M, None, stats)
        assert len(calls) == passes and stats.edited == edited
        assert x.tolist() == ([[7, 7, 1, 3, 3]] if edited else [[7, 7, 2, 3, 3]])
        if edited:
            assert stats.token_logp[0, 2].item() == pytest.approx(torch.log_softmax(logits[0, 0], -1)[1].item())


def test_the_block_sampler_s_config_edges():
    from diffusion_rl.core.errors import ConfigError
    from diffusion_rl.sampling.block import check_block_sampler

    check_block_sampler(SamplerConfig(gen_length=4, block_length=4, steps=4), 1)  # blocks of one token
    check_block_sampler(SamplerConfig(gen_length=8, block_length=8, steps=3, schedule="ass"), 8)
    for cfg, size, key in ((SamplerConfig(gen_length=8, block_length=8, steps=8), 0, "model.block_size"),
                           (SamplerConfig(gen_length=8, block_length=8, steps=8), 3, "sampler.gen_length"),
                           (SamplerConfig(gen_length=8, block_length=8, steps=3), 4, "sampler.steps"),
                           (SamplerConfig(gen_length=8, block_length=8, steps=8, cfg_scale=0.5), 4, "sampler.cfg_scale"),
                           (SamplerConfig(gen_length=8, block_length=8, steps=8, kv_cache="prefix"), 4, "sampler.kv_cache"),
                           (SamplerConfig(gen_length=8, block_length=8, steps=2, schedule="ass"), 4, "sampler.schedule")):
        with pytest.raises(ConfigError, match=rf"^{key.replace('.', chr(92) + '.')}="):
            check_block_sampler(cfg, size)


def test_a_prompt_is_left_padded_to_whole_blocks_in_its_own_dtypes():
    from diffusion_rl.sampling.block import align_prompt

    ids = torch.tensor([[5, 6, 7]], dtype=torch.int32)
    mask = torch.tensor([[0, 1, 1]], dtype=torch.int8)
    out_ids, out_mask, pad = align_prompt(ids, mask, 4, 0)
    assert pad == 1 and out_ids.tolist() == [[0, 5, 6, 7]] and out_mask.tolist() == [[0, 0, 1, 1]]
    assert out_ids.dtype == torch.int32 and out_mask.dtype == torch.int8
    same_ids, same_mask, pad = align_prompt(torch.tensor([[5, 6, 7, 8]]), None, 4, 0)
    assert pad == 0 and same_mask.tolist() == [[1, 1, 1, 1]]


def test_editing_runs_without_a_recorder_and_is_refused_with_one(block_bundle):
    from diffusion_rl.sampling.trajectory import TrajectoryRecorder

    ids, mask, _, _ = block_data(block_bundle)
    m = block_bundle.mask_token_id
    cfg = SamplerConfig(gen_length=16, block_length=BS, steps=8, temperature=0.0, editing_threshold=0.0)
    out = block_generate(block_bundle.net, ids, mask, cfg, BS, m)  # threshold 0: every preferred change is made
    plain = block_generate(block_bundle.net, ids, mask, SamplerConfig(gen_length=16, block_length=BS, steps=8,
                                                                       temperature=0.0), BS, m)
    assert out.edited > 0 and plain.edited == 0 and not torch.equal(out.completion, plain.completion)
    with pytest.raises(ConfigError, match=r"^sampler\.editing_threshold=0\.0"):
        block_generate(block_bundle.net, ids, mask, cfg, BS, m, recorder=TrajectoryRecorder(m))


def test_an_uncached_block_step_runs_the_prompt_and_the_blocks_so_far(block_bundle):
    ids, mask, _, _ = block_data(block_bundle)
    cfg = SamplerConfig(gen_length=16, block_length=BS, steps=8, temperature=0.0)
    cached = block_generate(block_bundle.net, ids, mask, cfg, BS, block_bundle.mask_token_id)
    uncached = block_generate(block_bundle.net, ids, mask, cfg, BS, block_bundle.mask_token_id, use_cache=False)
    P, spb = ids.shape[1], 2
    assert uncached.forward_tokens == sum(spb * (P + BS * (b + 1)) for b in range(4))
    assert cached.forward_tokens < uncached.forward_tokens and uncached.forwards == 8
