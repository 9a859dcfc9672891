"""CJ-GRPO's decoders as sampler options (``sampler.schedule=ass``, EOSER's ``sampler.eos_gamma_min/max``):
the counts and factors hand-computed, a decision EOSER changes, the whole sampler against a transcription
of the public decoding loops, and the config errors.

The reference below is written for this test from yjyddq/EOSER-ASS-RL @ 5affb4e,
``cj-grpo/cj_grpo_trainer_eoser_ass.py`` (``get_block_sizes`` and ``get_num_transfer_tokens_ass`` with
``block_num=1``, ``sampling``, ``ass_sampling``, ``reversed_process``) and
``cj-grpo/cj_grpo_trainer_eoser.py`` (``reversed_process``: one block, even counts), at temperature 0
(``add_gumbel_noise`` returns the logits), in the same order of operations; it imports nothing of the
sampler but ``encode_prompts`` and ``logits_fn``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.policy import encode_prompts, logits_fn
from diffusion_rl.sampling import SamplerConfig, generate
from diffusion_rl.sampling.block import block_generate, check_block_sampler
from diffusion_rl.sampling.sampler import (
    ass_steps,
    ass_transfer_tokens,
    eos_factor,
    maskgit_transfer_tokens,
    num_transfer_tokens,
)


# ======================================================================= the public code, transcribed
def ref_num_transfer_tokens(mask_num, steps):
    """get_num_transfer_tokens: (B, 1) masked counts -> (B, steps)."""
    base = mask_num // steps
    remainder = mask_num % steps
    num = base.expand(-1, steps).clone()
    if remainder.sum() > 0:
        indices = torch.arange(steps)
        num[indices.unsqueeze(0) < remainder] += 1
    return num.to(torch.int64)


def ref_ass_schedule(batch, gen_length, steps):
    """get_block_sizes + get_num_transfer_tokens_ass with block_num = 1."""
    S = int(torch.log2(torch.tensor(gen_length, dtype=torch.float32)).item())
    assert S == steps
    block_sizes, block_steps = [gen_length], [list(range(S))]
    num = torch.zeros((batch, steps), dtype=torch.int64)
    for i in range(steps):
        if i == steps - 1:
            num[:, i] = block_sizes[-1] - (2 ** i - 1)  # len(block_sizes) == 1
        else:
            num[:, i] = 2 ** i
    return num, block_sizes, block_steps


def ref_sampling(logits, x0, step_idx, total_steps, eos_id, min_fac, max_fac):
    """sampling (EOSER over the steps of one block)."""
    p = torch.softmax(logits.float(), dim=-1)
    x0_p = torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)
    if total_steps > 1:
        t = min(max(step_idx, 0), total_steps - 1) / (total_steps - 1)
        fac = min_fac + (max_fac - min_fac) * t
    else:
        fac = max_fac
    return torch.where(x0 == eos_id, x0_p * fac, x0_p)


def ref_ass_sampling(logits, x0, step_idx, total_steps, eos_id, min_fac, max_fac):
    """ass_sampling (EOSER over ASS's steps)."""
    p = torch.softmax(logits.float(), dim=-1)
    x0_p = torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)
    if total_steps > 1:
        t = (2 ** (step_idx + 1) - 1) / 2 ** total_steps
        fac = min_fac + (max_fac - min_fac) * t
    else:
        fac = max_fac
    return torch.where(x0 == eos_id, x0_p * fac, x0_p)


def ref_reversed_process(model, prompt, steps, gen_length, mask_id, eos_id, decoding, min_fac=0.01, max_fac=1.0):
    """reversed_process of cj_grpo_trainer_{eoser,ass,eoser_ass}.py at temperature 0, one block; returns
    the final x, the trajectory [x_0 .. x_K] and each transition's unmasked completion positions."""
    bs = prompt.shape[0]
    x = torch.full((bs, prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, :prompt.shape[1]] = prompt.clone()
    logits_to_keep = x.shape[1] - prompt.shape[1]
    if decoding == "eoser":
        num_transfer_tokens = ref_num_transfer_tokens((x[:, prompt.shape[1]:] == mask_id).sum(1, keepdim=True), steps)
        block_steps, end_idx = [list(range(steps))], x.shape[1]
    else:
        num_transfer_tokens, block_sizes, block_steps = ref_ass_schedule(bs, gen_length, steps)
        end_idx = prompt.shape[1] + block_sizes[0]
    traj, unmask = [x.clone()], []
    for block_step in block_steps:
        for i in block_step:
            mask_index = x == mask_id
            logits = model(x)
            x0 = torch.argmax(logits, dim=-1)  # temperature 0: add_gumbel_noise returns the logits
            if decoding == "eoser":
                x0_p = ref_sampling(logits, x0, i, steps, eos_id, min_fac, max_fac)
            elif decoding == "eoser_ass":
                x0_p = ref_ass_sampling(logits, x0, i, steps, eos_id, min_fac, max_fac)
            else:  # ass: plain low-confidence
                x0_p = torch.gather(torch.softmax(logits.float(), -1), -1, x0.unsqueeze(-1)).squeeze(-1)
            x0_p[:, end_idx:] = -math.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(-math.inf))
            transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(confidence.shape[0]):
                num_tokens = num_transfer_tokens[j, i].item()
                if num_tokens > 0:
                    _, select_index = torch.topk(confidence[j], k=num_tokens)
                    transfer_index[j, select_index] = True
            x[transfer_index] = x0[transfer_index]
            unmask.append((mask_index & (x != mask_id))[:, -logits_to_keep:])
            traj.append(x.clone())
    return x, traj, unmask


# ======================================================================= helpers
def sharp(bundle, scale=8.0):
    """The tiny model with larger weights: confident, well-separated predictions (no top-k ties)."""
    net = copy.deepcopy(bundle.net).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(scale)
    return net


class EOSFavoured:
    """A forward whose logits favour EOS at the completion's first position (probability ~0.9) and a
    content token at the second (~0.6), whatever the state: the two compete for step 0's one commit."""

    def __init__(self, vocab=6, eos_id=2, content=4):
        self.vocab, self.eos_id, self.content = vocab, eos_id, content

    def __call__(self, ids, attn=None):
        B, T = ids.shape
        logits = torch.zeros(B, T, self.vocab)
        logits[:, -2, self.eos_id] = math.log(0.9 * (self.vocab - 1) / 0.1)  # p(EOS) = 0.9 at position L-2
        logits[:, -1, self.content] = math.log(0.6 * (self.vocab - 1) / 0.4)  # p(content) = 0.6 at L-1
        return logits


# ======================================================================= 1. counts and factors
@pytest.mark.parametrize("L", [2, 3, 16, 17, 100, 128, 256])
def test_ass_counts_are_powers_of_two_then_the_rest(L):
    S = ass_steps(L)
    assert S == int(math.log2(L))
    k = ass_transfer_tokens(torch.tensor([L]), S)[0].tolist()
    assert k[:-1] == [2 ** i for i in range(S - 1)] and sum(k) == L
    if L >= 4:  # the public counts (get_num_transfer_tokens_ass, one block)
        assert k == ref_ass_schedule(1, L, S)[0][0].tolist()
    assert ass_transfer_tokens(torch.tensor([256]), 8)[0].tolist() == [1, 2, 4, 8, 16, 32, 64, 129]


def test_ass_counts_with_pinned_tokens_run_out_early():
    k = ass_transfer_tokens(torch.tensor([16, 9, 3, 0]), 4)
    assert k.tolist() == [[1, 2, 4, 9], [1, 2, 4, 2], [1, 2, 0, 0], [0, 0, 0, 0]]


def test_maskgit_linear_schedule_hand_computed():
    """MDPO's public rollouts: after step t, floor(m * (1 - (t + 1) / T)) positions stay masked."""
    k = maskgit_transfer_tokens(torch.tensor([10, 16, 3, 0]), 4)
    assert k.tolist() == [[3, 2, 3, 2], [4, 4, 4, 4], [1, 1, 1, 0], [0, 0, 0, 0]]  # 10: 7, 5, 2, 0 left; 3: 2, 1, 0, 0
    assert num_transfer_tokens(torch.tensor([10]), 4).tolist() == [[3, 3, 2, 2]]  # LLaDA's: the remainder first
    m = torch.arange(0, 40)
    for steps in (1, 3, 8):
        counts = maskgit_transfer_tokens(m, steps)
        assert torch.equal(counts.sum(-1), m) and bool((counts >= 0).all())
        divisible = m % steps == 0
        assert torch.equal(counts[divisible], num_transfer_tokens(m[divisible], steps))
    with pytest.raises(ConfigError, match="sampler.schedule='maskgit' is invalid: needs sampler.decode=fixed"):
        SamplerConfig(schedule="maskgit", decode="threshold").validate()


def test_eoser_factor_rises_linearly_over_the_steps():
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=5, eos_gamma_min=0.01, eos_gamma_max=1.0)
    f = [eos_factor(cfg, s) for s in range(5)]
    assert f == pytest.approx([0.01 + 0.99 * s / 4 for s in range(5)])
    assert f[0] == pytest.approx(0.01) and f[-1] == pytest.approx(1.0)
    assert eos_factor(replace(cfg, steps=1, block_length=16), 0) == 1.0  # one step: gamma_max (the public rule)
    ass = SamplerConfig(gen_length=16, block_length=16, steps=4, schedule="ass", eos_gamma_min=0.01)
    # ASS: linear in the share of tokens decoded by the end of the step, (2^(s+1) - 1) / 2^S
    assert [eos_factor(ass, s) for s in range(4)] == pytest.approx([0.01 + 0.99 * (2 ** (s + 1) - 1) / 16 for s in range(4)])
    for schedule in ("even", "ass"):  # one step: gamma_max under either schedule (the public guard, total_steps > 1)
        one = SamplerConfig(gen_length=2, block_length=2, steps=1, schedule=schedule, eos_gamma_min=0.01, eos_gamma_max=0.7)
        assert eos_factor(one, 0) == 0.7


def test_eoser_changes_which_position_step_zero_commits():
    fwd = EOSFavoured()
    prompt = torch.tensor([[3, 5]])
    base = SamplerConfig(gen_length=2, block_length=2, steps=2, temperature=0.0)
    committed = []

    class Rec:
        def on_step(self, step, x_before, logits, candidates, committed_now):
            committed.append(committed_now[0, -2:].tolist())

    out = generate(fwd, prompt, None, base, mask_id=1, recorder=Rec(), eos_id=2)
    assert committed[0] == [True, False] and out.completion.tolist() == [[2, 4]]  # EOS (0.9 > 0.6) first
    committed.clear()
    eoser = replace(base, eos_gamma_min=0.01)  # EOS's confidence 0.9 x 0.01 at step 0
    out = generate(fwd, prompt, None, eoser, mask_id=1, recorder=Rec(), eos_id=2)
    assert committed[0] == [False, True] and out.completion.tolist() == [[2, 4]]  # the content token first
    committed.clear()
    weak = replace(base, eos_gamma_min=0.7)  # 0.9 x 0.7 = 0.63 > 0.6: EOS still wins
    generate(fwd, prompt, None, weak, mask_id=1, recorder=Rec(), eos_id=2)
    assert committed[0] == [True, False]
    with pytest.raises(ValueError, match="EOS id"):
        generate(fwd, prompt, None, eoser, mask_id=1)


# ======================================================================= 2. the public decoding loops
EOS_LIFT = 6.0
@pytest.mark.parametrize("decoding", ["eoser", "ass", "eoser_ass"])
def test_the_sampler_equals_the_public_decoders_greedy(tiny_bundle, decoding):
    """Tokens, trajectory and unmasked positions of every transition equal the transcription's, with
    EOS made competitive (its logit raised) so that EOSER decides some commits."""
    b = tiny_bundle
    base = logits_fn(sharp(b))
    lift = torch.zeros(len(b.tokenizer))
    lift[b.eos_token_id] = EOS_LIFT

    def fwd(ids, attn):  # the sharpened tiny model with EOS's logit raised: EOS competes for commits
        return base(ids, attn) + lift

    ids, _ = encode_prompts(b.tokenizer, ["1203=", "4021=", "3300=", "0001="])  # one length: the public forward has no mask
    L = 16
    steps = 8 if decoding == "eoser" else ass_steps(L)
    cfg = SamplerConfig(gen_length=L, block_length=L, steps=steps, temperature=0.0,
                        schedule="even" if decoding == "eoser" else "ass",
                        eos_gamma_min=1.0 if decoding == "ass" else 0.01)
    cfg.validate()
    states, unmasked = [], []

    class Rec:
        def on_step(self, step, x_before, logits, candidates, committed):
            states.append(x_before.clone())
            unmasked.append(committed[:, -L:] & (candidates[:, -L:] != b.mask_token_id))

    out = generate(fwd, ids, None, cfg, b.mask_token_id, recorder=Rec(), eos_id=b.eos_token_id)
    x, traj, ref_unmask = ref_reversed_process(lambda t: fwd(t, None), ids, steps, L, b.mask_token_id,
                                               b.eos_token_id, decoding)
    assert torch.equal(out.sequences, x)
    assert len(states) == len(ref_unmask) == steps
    for s in range(steps):
        assert torch.equal(states[s], traj[s]) and torch.equal(unmasked[s], ref_unmask[s])
    if decoding != "ass":  # EOSER took part: without it the decoding differs
        plain = generate(fwd, ids, None, replace(cfg, eos_gamma_min=1.0), b.mask_token_id, eos_id=b.eos_token_id)
        assert (out.completion == b.eos_token_id).any()
        assert not torch.equal(plain.completion, out.completion)


def test_ass_and_eoser_in_the_block_sampler(tiny_bundle):
    """A block model with one block of the completion runs ASS's counts; EOSER needs the EOS id there too."""
    from diffusion_rl.models.build import build_policy
    from diffusion_rl.models.policy import ModelConfig

    torch.manual_seed(0)
    bundle = build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2, block_size=8))
    ids, mask = encode_prompts(bundle.tokenizer, ["1203=12=", "4021=33="], pad_to_multiple_of=8)
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=3, temperature=0.0, schedule="ass", eos_gamma_min=0.01)
    counts = []

    class Rec:
        def on_step(self, step, x_before, logits, candidates, committed):
            counts.append(committed.sum(-1).tolist())

    block_generate(bundle.net.eval(), ids, mask, cfg, 8, bundle.mask_token_id, recorder=Rec(), eos_id=bundle.eos_token_id)
    assert counts == [[1, 1], [2, 2], [5, 5]]
    with pytest.raises(ValueError, match="EOS id"):
        block_generate(bundle.net.eval(), ids, mask, cfg, 8, bundle.mask_token_id)
    with pytest.raises(ConfigError, match="sampler.schedule"):
        check_block_sampler(replace(cfg, gen_length=16, block_length=16, steps=4), 8)


def test_the_exact_sampler_drops_both_decoders():
    cfg = SamplerConfig(gen_length=16, block_length=16, steps=4, schedule="ass", eos_gamma_min=0.01)
    assert not cfg.exact and cfg.eoser
    exact = cfg.as_exact()
    assert exact.exact and exact.schedule == "even" and not exact.eoser


# ======================================================================= 3. config errors
@pytest.mark.parametrize("kw,key", [
    (dict(schedule="log"), "sampler.schedule"),
    (dict(schedule="ass", gen_length=16, block_length=8, steps=4), "sampler.block_length"),
    (dict(schedule="ass", gen_length=16, block_length=16, steps=8), "sampler.steps"),
    (dict(schedule="ass", gen_length=16, block_length=16, steps=4, decode="threshold"), "sampler.schedule"),
    (dict(eos_gamma_min=-0.1), "sampler.eos_gamma_min"),
    (dict(eos_gamma_max=float("nan")), "sampler.eos_gamma_max"),
    (dict(eos_gamma_min=0.01, decode="factor"), "sampler.decode"),
    (dict(eos_gamma_min=0.01, remasking="random"), "sampler.remasking"),
])
def test_decoder_options_fail_in_one_line(kw, key):
    with pytest.raises(ConfigError) as err:
        SamplerConfig(**kw).validate()
    assert str(err.value).startswith(key) and "\n" not in str(err.value)
