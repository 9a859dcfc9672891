"""The remasking sampler against a slow, literal transcription of SPEC §2, and its block schedule."""

import pytest
import torch

from diffusion_rl.models.policy import encode_prompts, logits_fn
from diffusion_rl.sampling import SamplerConfig, generate, num_transfer_tokens
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
    a = generate(fwd, ids, mask, cfg, b.mask_token_id, torch.Generator().manual_seed(1)).completion
    a2 = generate(fwd, ids, mask, cfg, b.mask_token_id, torch.Generator().manual_seed(1)).completion
    c = generate(fwd, ids, mask, cfg, b.mask_token_id, torch.Generator().manual_seed(2)).completion
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
    generate(logits_fn(b.net.eval()), ids, mask, cfg, b.mask_token_id, torch.Generator().manual_seed(0), Rec())
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
    from diffusion_rl.errors import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        SamplerConfig(**kw).validate()
