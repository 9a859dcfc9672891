"""The remasking sampler against a slow, literal transcription of docs/methods.md §2, and its block
schedule."""

import pytest
import torch

from diffusion_rl.models.policy import encode_prompts, logits_fn
from diffusion_rl.sampling import RowNoise, SamplerConfig, generate, num_transfer_tokens
from diffusion_rl.sampling.sampler import completion_mask


def reference_generate(forward, prompt_ids, prompt_mask, cfg, mask_id):
    """Greedy sampler written one sequence, one step and one position at a time (no vectorising)."""
    outs = []
    for b in range(prompt_ids.shape[0]):
        x = prompt_ids[b].tolist() + [mask_id] * cfg.gen_length
        attn = prompt_mask[b].tolist() + [1] * cfg.gen_length
        P = prompt_ids.shape[1]
        nb = cfg.gen_length // cfg.block_length
        n = cfg.steps // nb
        for blk in range(nb):
            lo, hi = P + blk * cfg.block_length, P + (blk + 1) * cfg.block_length
            m = sum(1 for i in range(lo, hi) if x[i] == mask_id)
            ks = [m // n + (1 if s < m % n else 0) for s in range(n)]
            for s in range(n):
                logits = forward(torch.tensor([x]), torch.tensor([attn]))[0]
                cands = []
                for i in range(lo, hi):
                    if x[i] != mask_id:
                        continue
                    probs = torch.softmax(logits[i].float(), -1)
                    tok = int(torch.argmax(logits[i]))
                    cands.append((float(probs[tok]), i, tok))
                cands.sort(key=lambda c: (-c[0], c[1]))
                for _, i, tok in cands[: ks[s]]:
                    x[i] = tok
        outs.append(x[P:])
    return torch.tensor(outs)


@pytest.mark.parametrize("gen_length,block_length,steps", [(16, 16, 8), (12, 4, 6), (10, 5, 4), (7, 7, 3)])
def test_greedy_sampler_matches_reference(tiny_bundle, gen_length, block_length, steps):
    b = tiny_bundle
    prompts = ["1203=", "40", "0000000000=", "12"]  # different lengths: left padding is exercised
    ids, mask = encode_prompts(b.tokenizer, prompts)
    cfg = SamplerConfig(gen_length=gen_length, block_length=block_length, steps=steps, temperature=0.0)
    fwd = logits_fn(b.net.eval())
    fast = generate(fwd, ids, mask, cfg, b.mask_token_id).completion
    slow = reference_generate(fwd, ids, mask, cfg, b.mask_token_id)
    assert torch.equal(fast, slow)
    assert not (fast == b.mask_token_id).any()


def test_sampling_is_seeded_and_temperature_matters(tiny_bundle):
    b = tiny_bundle
    ids, mask = encode_prompts(b.tokenizer, ["12=", "34="])
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=1.0)
    fwd = logits_fn(b.net.eval())
    a = generate(fwd, ids, mask, cfg, b.mask_token_id, RowNoise.rows(1, 0, 2)).completion
    a2 = generate(fwd, ids, mask, cfg, b.mask_token_id, RowNoise.rows(1, 0, 2)).completion
    c = generate(fwd, ids, mask, cfg, b.mask_token_id, RowNoise.rows(2, 0, 2)).completion
    assert torch.equal(a, a2)
    assert not torch.equal(a, c)  # an untrained model is close to uniform: draws differ


@pytest.mark.parametrize("m,n", [(7, 3), (5, 5), (3, 7), (0, 4), (31, 8), (1, 1)])
def test_block_schedule(m, n):
    k = num_transfer_tokens(torch.tensor([m]), n)[0].tolist()
    assert sum(k) == m
    assert len(k) == n
    assert k == sorted(k, reverse=True)  # remainder goes to the first steps
    assert max(k) - min(k) <= 1


def test_schedule_commits_exactly_k_per_step(tiny_bundle):
    b = tiny_bundle
    cfg = SamplerConfig(gen_length=10, block_length=5, steps=4, temperature=0.7)
    counts = []

    class Rec:
        def on_step(self, step, x_before, logits, candidates, committed):
            counts.append(committed.sum(-1).tolist())

    ids, mask = encode_prompts(b.tokenizer, ["1=", "22="])
    generate(logits_fn(b.net.eval()), ids, mask, cfg, b.mask_token_id, RowNoise.rows(0, 0, 2), Rec())
    assert counts == [[3, 3], [2, 2], [3, 3], [2, 2]]  # 5 masked in 2 steps: 3 then 2, per block


def test_completion_mask_keeps_through_first_eos():
    comp = torch.tensor([[5, 6, 2, 7, 2], [5, 5, 5, 5, 5], [2, 1, 1, 1, 1]])
    m = completion_mask(comp, eos_id=2)
    assert m.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]


@pytest.mark.parametrize(
    "kw,key",
    [({"gen_length": 10, "block_length": 4}, "sampler.gen_length"), ({"steps": 3, "gen_length": 8, "block_length": 4}, "sampler.steps"),
     ({"temperature": -1.0}, "sampler.temperature"), ({"remasking": "top"}, "sampler.remasking")],
)
def test_sampler_config_errors(kw, key):
    from diffusion_rl.core.errors import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        SamplerConfig(**kw).validate()


# ---- the fewer-forward options (docs/methods.md §10) ---------------------------------------------
def _sharp(bundle, scale=8.0):
    """The tiny model with larger weights: confident, well-separated predictions (no argmax ties)."""
    import copy

    net = copy.deepcopy(bundle.net).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(scale)
    return net


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_threshold_one_with_one_token_per_step_is_the_exact_sampler(tiny_bundle, temperature):
    from dataclasses import replace

    b = tiny_bundle
    net = _sharp(b)
    ids, mask = encode_prompts(b.tokenizer, ["1203=", "40", "0000000000=", "12"])
    exact = SamplerConfig(gen_length=12, block_length=4, steps=12, temperature=temperature)  # 1 token per step
    fast = replace(exact, decode="threshold", threshold=1.0)
    runs = [generate(logits_fn(net), ids, mask, c, b.mask_token_id, RowNoise.rows(5, 0, ids.shape[0]))
            for c in (exact, fast)]
    assert torch.equal(runs[0].completion, runs[1].completion)
    assert torch.equal(runs[0].token_logp, runs[1].token_logp)
    assert runs[1].steps == runs[1].forwards == 12


def test_parallel_counts_hand_computed():
    from diffusion_rl.sampling.sampler import parallel_count

    conf = torch.tensor([[0.95, 0.5, 0.91, 0.2], [0.3, 0.2, 0.1, 0.05], [0.99, 0.97, 0.6, 0.9]])
    allowed = torch.tensor([[True, True, True, True], [True, True, True, False], [False, False, False, False]])
    cfg = SamplerConfig(decode="threshold", threshold=0.9)
    assert parallel_count(conf, allowed, cfg).tolist() == [2, 1, 0]  # at least one where any is allowed
    assert parallel_count(conf, allowed, SamplerConfig(decode="threshold", threshold=0.95)).tolist() == [1, 1, 0]  # strictly above
    # factor f = 1: c_n >= 1 - 1 / (n + 1): 1 - 1/2, 1 - 1/3, 1 - 1/4, 1 - 1/5 = 0.5, 0.667, 0.75, 0.8
    conf = torch.tensor([[0.95, 0.7, 0.8, 0.1], [0.4, 0.3, 0.2, 0.1], [0.99, 0.98, 0.97, 0.81]])
    allowed = torch.ones(3, 4, dtype=torch.bool)
    cfg = SamplerConfig(decode="factor", factor=1.0)
    assert parallel_count(conf, allowed, cfg).tolist() == [2, 1, 4]  # sorted 0.95, 0.8 (>= 0.667), 0.7 < 0.75
    # f = 2: thresholds 0, 0.333, 0.5, 0.6; f = 5: the fourth is 1 - 5/5 = 0
    assert parallel_count(conf, allowed, SamplerConfig(decode="factor", factor=2.0)).tolist() == [3, 1, 4]
    assert parallel_count(conf[:1], allowed[:1], SamplerConfig(decode="factor", factor=5.0)).tolist() == [4]


def test_threshold_decoding_takes_fewer_steps_and_commits_everything(tiny_bundle):
    b = tiny_bundle
    net = _sharp(b)
    ids, mask = encode_prompts(b.tokenizer, ["1203=", "40"])
    counts = []

    class Rec:
        def on_step(self, step, x_before, logits, candidates, committed):
            counts.append((committed & (candidates != b.mask_token_id)).sum(-1).tolist())  # a drawn mask stays

    cfg = SamplerConfig(gen_length=16, block_length=8, steps=16, temperature=0.0, decode="threshold", threshold=0.3)
    out = generate(logits_fn(net), ids, mask, cfg, b.mask_token_id, recorder=Rec())
    assert not (out.completion == b.mask_token_id).any()  # each block runs until nothing is masked
    assert out.steps == len(counts) == out.forwards < 16  # the confident model commits several per step
    assert max(map(max, counts)) > 1 and sum(map(sum, counts)) == 2 * 16


def _eos_forward(V, eos, mask_id, after):
    """A deterministic model: EOS is the best token from completion position ``after`` on, else a digit."""
    def fwd(ids, attn):
        logits = torch.zeros(ids.shape[0], ids.shape[1], V)
        pos = torch.arange(ids.shape[1])
        logits[:, :, 7] = 5.0 + 0.01 * pos  # confidences differ by position: no ties
        if after is not None:
            logits[:, after:, eos] = 9.0
        logits[..., mask_id] = -1e9
        return logits
    return fwd


def test_stop_after_eos_changes_nothing_when_no_row_ends(tiny_bundle):
    from dataclasses import replace

    b = tiny_bundle
    V = len(b.tokenizer)
    ids = torch.tensor([[10, 11], [12, 13]])
    fwd = _eos_forward(V, b.eos_token_id, b.mask_token_id, None)
    cfg = SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=0.7)
    runs = [generate(fwd, ids, None, c, b.mask_token_id, RowNoise.rows(1, 0, ids.shape[0]), eos_id=b.eos_token_id)
            for c in (cfg, replace(cfg, stop_after_eos=True))]
    assert torch.equal(runs[0].completion, runs[1].completion) and runs[1].filled == 0
    assert runs[0].forwards == runs[1].forwards == 6


def test_stop_after_eos_fills_the_remaining_blocks_without_forwards(tiny_bundle):
    from diffusion_rl.sampling.trajectory import TrajectoryRecorder

    b = tiny_bundle
    V, eos, m = len(b.tokenizer), b.eos_token_id, b.mask_token_id
    ids = torch.tensor([[10, 11], [12, 13]])
    fwd = _eos_forward(V, eos, m, after=2 + 3)  # EOS from the 4th completion token on: ends in block 0
    cfg = SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=0.0, stop_after_eos=True)
    rec = TrajectoryRecorder(m)
    out = generate(fwd, ids, None, cfg, m, recorder=rec, eos_id=eos)
    exact = generate(fwd, ids, None, SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=0.0), m)
    assert torch.equal(out.completion, exact.completion)  # this model writes EOS there anyway
    assert out.forwards == 2 and out.filled == 8 and (out.completion[:, 4:] == eos).all()
    assert (out.token_logp[:, 4:] == 0).all() and (out.token_logp[:, :4] < 0).all()
    assert torch.equal(rec.final, out.sequences) and torch.equal(rec.state_before(rec.num_steps), out.sequences)
    assert (rec.state_before(1)[:, 6:] == m).all()  # the filled tail was masked at every recorded step
    assert rec.counts.sum().item() == 2 * 4


def test_stop_after_eos_stopped_and_continued_equals_the_uninterrupted_run():
    """A schedule cut at any step and continued from its state (a tree's branches) ends as the
    uninterrupted run: the rows that ended at a block end already passed stay ended (they are filled,
    not decoded), the others go on. Row 0 writes EOS from completion position 1 (ends in block 0), row 1
    from position 5 (block 1), row 2 never."""
    V, eos, m, P = 12, 11, 10, 2
    after = torch.tensor([1, 5, 99])

    def fwd(ids, attn):
        logits = torch.zeros(ids.shape[0], ids.shape[1], V)
        pos = torch.arange(ids.shape[1])
        logits[:, :, 7] = 5.0 + 0.01 * pos
        logits[pos[None, :] >= P + after[ids[:, 0]][:, None], eos] = 9.0  # the row's first prompt token picks it
        logits[..., m] = -1e9
        return logits

    ids = torch.tensor([[0, 3], [1, 3], [2, 3]])
    cfg = SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=0.0, stop_after_eos=True)
    full = generate(fwd, ids, None, cfg, m, eos_id=eos)
    assert (full.completion[0, 1:] == eos).all() and (full.completion[1, 5:] == eos).all()
    assert (full.completion[1, :5] == 7).all() and (full.completion[2] == 7).all()
    for cut in range(1, 6):
        part = generate(fwd, ids, None, cfg, m, eos_id=eos, stop_step=cut)
        assert (part.completion == m).any()  # a stopped state stays masked: its continuation fills it
        rest = generate(fwd, ids, None, cfg, m, eos_id=eos, canvas=part.completion, start_step=cut)
        assert torch.equal(rest.completion, full.completion), cut
        # forwards of the continuation: the blocks still decoding, none for a block every row has ended
        assert part.forwards + rest.forwards == full.forwards, cut


def test_sampler_option_errors():
    from diffusion_rl.core.errors import ConfigError

    for kw, key in [({"decode": "greedy"}, "sampler.decode"), ({"kv_cache": "full"}, "sampler.kv_cache"),
                    ({"decode": "threshold", "remasking": "random"}, "sampler.remasking"),
                    ({"threshold": 1.5}, "sampler.threshold"), ({"factor": 0.0}, "sampler.factor"),
                    ({"kv_cache": "dual", "cfg_scale": 1.0}, "sampler.cfg_scale"), ({"kv_cache_refresh": -1}, "sampler.kv_cache_refresh")]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            SamplerConfig(**kw).validate()
