"""A sample is a function of its key and its own prompt: the same rows sampled in calls of 1, 3 or
all rows give the same tokens (sampling/noise.py), on the embedded model and a tiny LLaDA in the
released layout, flat and block samplers, the exact and the threshold rules, with the caches, with
random remasking and with ``stop_after_eos``."""

from dataclasses import replace

import pytest
import torch

from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig, encode_prompts
from diffusion_rl.sampling import RowNoise, SamplerConfig, sample
from diffusion_rl.training.evaluation import generate_texts
from tests.helpers.released_layouts import write_checkpoint

PROMPTS = ["1203=", "40", "0000000000=", "12", "3=", "2013=", "1"]  # 7 rows: calls of 3 leave a remainder
KEY = 11


def chunked(bundle, cfg: SamplerConfig, size: int, key: int = KEY):
    """Every row of PROMPTS sampled in calls of ``size`` rows, as a rollout does (prompts encoded once,
    then split; row ``j`` keyed by ``j``). -> completions (N, L), sampler log-probs (N, L)"""
    ids, mask = encode_prompts(bundle.tokenizer, PROMPTS, pad_to_multiple_of=bundle.block_size)
    comps, logps = [], []
    for s in range(0, ids.shape[0], size):
        out = sample(bundle, ids[s:s + size], mask[s:s + size], cfg, RowNoise.rows(key, s, ids[s:s + size].shape[0]))
        comps.append(out.completion)
        logps.append(out.token_logp)
    return torch.cat(comps), torch.cat(logps)


def assert_chunking_changes_nothing(bundle, cfg: SamplerConfig) -> torch.Tensor:
    whole, whole_logp = chunked(bundle, cfg, len(PROMPTS))
    for size in (1, 3):
        comp, logp = chunked(bundle, cfg, size)
        assert torch.equal(comp, whole), f"rollout_batch_size={size} changed the samples"
        assert torch.allclose(logp, whole_logp, atol=1e-5)
    return whole


def embedded(block_size: int = 0):
    torch.manual_seed(0)
    b = build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2, block_size=block_size))
    b.net.eval()
    return b


@pytest.fixture(scope="module")
def flat():
    return embedded()


@pytest.fixture(scope="module")
def llada(tmp_path_factory):
    folder = write_checkpoint("llada", tmp_path_factory.mktemp("released") / "llada", real_ids=False)
    b = build_policy(ModelConfig(name="hf", path=str(folder)))
    b.net.eval()
    return b


FLAT_CASES = [  # (decode, cache, remasking)
    ("fixed", "none", "low_confidence"), ("fixed", "none", "random"), ("threshold", "none", "low_confidence"),
    ("fixed", "prefix", "low_confidence"), ("threshold", "dual", "low_confidence"),
]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("decode,cache,remasking", FLAT_CASES)
def test_embedded_flat_sampler(flat, decode, cache, remasking, temperature):
    cfg = SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=temperature, decode=decode,
                        threshold=0.05, kv_cache=cache, remasking=remasking)
    whole = assert_chunking_changes_nothing(flat, cfg)
    if temperature > 0 or remasking == "random":  # the rows do draw: another key gives other samples
        assert not torch.equal(chunked(flat, cfg, len(PROMPTS), key=KEY + 1)[0], whole)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("decode", ["fixed", "threshold"])
def test_embedded_block_sampler(decode, temperature):
    b = embedded(block_size=4)
    cfg = SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=temperature, decode=decode, threshold=0.05)
    assert_chunking_changes_nothing(b, cfg)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("decode,cache", [("fixed", "none"), ("threshold", "none"), ("fixed", "dual")])
def test_tiny_llada(llada, decode, cache, temperature):
    """LLaDA as released (padding attended and counted in the positions): the rows share one padded
    prompt tensor, as in a rollout, so only the chunking differs."""
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=temperature, decode=decode,
                        threshold=0.05, kv_cache=cache)
    assert_chunking_changes_nothing(llada, cfg)


def test_stop_after_eos_ends_each_row_on_its_own(flat):
    """Rows that end at different blocks: an ended row takes no more tokens whatever the rows beside
    it do, so calls of 1 (each row stops alone) equal one call of all."""
    net = flat.net
    eos = flat.eos_token_id

    class EosLikely(torch.nn.Module):  # the embedded model with EOS made likely: rows end early, at random
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, input_ids, attention_mask=None, **kw):
            out = self.net(input_ids=input_ids, attention_mask=attention_mask, **kw)
            out.logits[..., eos] += 3.0
            return out

    b = replace(flat, net=EosLikely())
    cfg = SamplerConfig(gen_length=16, block_length=4, steps=8, temperature=1.0, stop_after_eos=True)
    whole = assert_chunking_changes_nothing(b, cfg)
    first_eos = torch.where((whole == eos).any(-1), (whole == eos).int().argmax(-1), whole.shape[1])
    ended_block = (first_eos // 4).tolist()
    assert len(set(ended_block)) > 1 and min(ended_block) < 3  # rows ended early, in different blocks
    for row, e in zip(whole, first_eos.tolist()):  # everything after an early end is EOS
        if e < 12:
            assert (row[(e // 4 + 1) * 4:] == eos).all()


def test_row_noise_draws_only_for_active_rows():
    noise = RowNoise.rows(3, 0, 3)
    both = RowNoise.rows(3, 0, 3)
    a = noise.uniform((2, 5), torch.tensor([True, False, True]), torch.float64, torch.device("cpu"))
    assert (a[1] == 0.5).all() and not (a[0] == 0.5).any()
    b = both.uniform((2, 5), torch.tensor([True, True, True]), torch.float64, torch.device("cpu"))
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    # row 1 did not advance: its next draw is the first draw of a fresh row-1 stream
    a2 = noise.uniform((2, 5), torch.tensor([False, True, False]), torch.float64, torch.device("cpu"))
    assert torch.equal(a2[1], b[1])
    assert torch.equal(RowNoise.rows(3, 1, 1).uniform((2, 5), torch.tensor([True]), torch.float64,
                                                       torch.device("cpu"))[0], b[1])  # keyed by the global row
    with pytest.raises(ValueError, match="keys 3 rows"):
        noise.uniform((2,), torch.ones(2, dtype=torch.bool), torch.float32, torch.device("cpu"))


def test_evaluation_batch_size_changes_no_completion(flat):
    """Random remasking in evaluation draws from generators keyed by the item: batches of 1, 3 or all
    give the same completions (the embedded model masks padding, so the batch's padding is no input)."""
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=0.0, remasking="random")
    outs = [generate_texts(flat, PROMPTS, cfg, size) for size in (1, 3, len(PROMPTS))]
    assert outs[0] == outs[1] == outs[2]
    shifted = generate_texts(flat, PROMPTS, cfg, len(PROMPTS), rows=list(range(1, len(PROMPTS) + 1)))
    assert shifted != outs[0]  # the item ids key the draws


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_row_noise_is_each_row_s_seeded_stream_in_the_asked_dtype(dtype):
    from diffusion_rl.sampling.noise import uniform

    cpu = torch.device("cpu")
    noise = RowNoise([5, 9])
    u = uniform(noise, (3, 4), torch.tensor([True, True]), dtype, cpu)
    assert u.dtype == dtype
    for b, seed in enumerate([5, 9]):  # row b: torch.rand from a generator seeded with its seed
        assert torch.equal(u[b], torch.rand((3, 4), generator=torch.Generator().manual_seed(seed), dtype=dtype))
    g = uniform(None, (3,), torch.ones(2, dtype=torch.bool), dtype, cpu)  # no noise: the global generator
    assert g.shape == (2, 3) and g.dtype == dtype


def test_row_noise_generators_are_one_stream_per_row_across_calls():
    cpu = torch.device("cpu")
    noise = RowNoise([5, 9])
    first = noise.uniform((2,), torch.tensor([True, True]), torch.float64, cpu)
    gens = noise.generators(cpu)
    assert gens is noise.generators(cpu)  # the same generators again: the streams go on, never restart
    after = torch.rand(2, generator=gens[0], dtype=torch.float64)
    both = torch.rand(4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert torch.equal(torch.cat([first[0], after]), both)
