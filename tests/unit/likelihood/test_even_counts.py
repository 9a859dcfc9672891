"""BGPO's even-counts estimator (likelihood/even_counts.py): parity with a transcription of DARE's
masking and per-copy estimates (yjyddq/DARE @ 83ae8a3, ``verl/workers/actor/llada_dp_actor_bgpo.py``)
on a random model, the masks' counts and offsets, and the ELBO on a model small enough to enumerate.
The objective's loss is tested in tests/unit/rl/test_bgpo.py, which reuses this transcription."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import mask_seeds
from diffusion_rl.likelihood.elbo import ELBOSample
from diffusion_rl.likelihood.even_counts import (
    EvenCountsConfig,
    EvenCountsEstimator,
    copy_estimates,
    even_counts,
)
from diffusion_rl.models.policy import logits_fn
from tests.helpers.random_model import MASK, ContextModel, forward_spy, input_spy, random_batch

# ---------------------------------------------------------------- the transcription (reference)
# DARE's computation written out afresh, shapes as there: _forward_process_bgpo for one sequence and its
# n_l copies with the random draws passed in (the offset k and each copy's permutation of the response
# positions), and _forward_micro_batch's per-copy sum of log p / p_mask.


def ref_counts(k, target_len, b):
    k = torch.tensor(k)  # torch.randint's 0-d long tensor
    x = torch.round(torch.linspace(float(k), k + (b - 1) * (target_len / b), steps=b)).long()
    return ((x - 1) % target_len) + 1


def ref_forward_process(batch, attention_mask, prompt_len, mask_id, k, perms):
    """(n_l, seq_len) copies of one sequence -> noisy copies, mask_indices, p_mask."""
    b, seq_len = batch.shape
    response_mask = attention_mask.bool().clone()
    response_mask[:prompt_len] = False
    response_indices = torch.where(response_mask)[0]
    target_len = response_mask.sum().item()
    x = ref_counts(k, target_len, b)
    assert 1 <= x.min() and x.max() <= target_len
    mask_indices = torch.zeros((b, seq_len), dtype=torch.bool)
    for i in range(b):
        mask_indices[i, response_indices[perms[i][: x[i]]]] = True
    noisy = torch.where(mask_indices, mask_id, batch)
    p_mask = (x / target_len).unsqueeze(1).repeat(1, seq_len)
    return noisy, mask_indices, p_mask


def ref_loss_per_sample(model_fn, noisy, mask_indices, p_mask, seq):
    """One copy of every row: sum over its masked tokens of log p / p_mask. (B, S) -> (B,)"""
    logits = model_fn(noisy)
    out = []
    for b in range(noisy.shape[0]):
        m = mask_indices[b]
        out.append(-(F.cross_entropy(logits[b][m], seq[b][m], reduction="none") / p_mask[b][m]).sum())
    return torch.stack(out)


def drawn_inputs(est, seeds, prompt_mask, scored):
    """Our draws as DARE's: per row the offset and, per copy, the permutation of the scored positions that
    lists the smallest keys first (so ``perm[:x]`` is our masked set)."""
    d = est.draw(seeds, prompt_mask, scored)
    out = []
    for b in range(scored.shape[0]):
        perms = [d.keys[j, b][scored[b]].argsort() for j in range(d.keys.shape[0])]
        out.append((int(d.offset[b]), perms))
    return d, out


def ref_copy_estimates(model_fn, prompt, pmask, comp, draws, mask_id):
    """Every row's K estimates by the transcription, (B, K): row b's copies made together, as DARE's worker."""
    B, P = prompt.shape
    ids = torch.cat([prompt, comp], 1)
    attn = torch.cat([pmask, torch.ones_like(comp)], 1)
    K = len(draws[0][1])
    noisy, idx, pm = zip(*(ref_forward_process(ids[b:b + 1].repeat(K, 1), attn[b], P, mask_id, *draws[b])
                           for b in range(B)))
    noisy, idx, pm = torch.stack(noisy, 1), torch.stack(idx, 1), torch.stack(pm, 1)  # (K, B, S)
    return torch.stack([ref_loss_per_sample(model_fn, noisy[i], idx[i], pm[i], ids) for i in range(K)], 1)


# ---------------------------------------------------------------- parity


@pytest.mark.parametrize("n,K", [(16, 16), (256, 16), (7, 16), (16, 5), (10, 4), (3, 2), (1, 16), (40, 1)])
def test_mask_counts_are_dares(n, K):
    for k in range(1, n + 1):
        assert torch.equal(even_counts(k, n, K), ref_counts(k, n, K)), (k, n, K)


def test_estimator_matches_the_transcription_on_a_random_model():
    prompt, pmask, comp, _ = random_batch(B=5, L=9)
    model = ContextModel(prompt.shape[1] + comp.shape[1])
    est = EvenCountsEstimator(EvenCountsConfig(num_samples=6), MASK)
    seeds = mask_seeds(5, 3, comp.shape[0], 0)
    scored = torch.ones_like(comp, dtype=torch.bool)  # DARE's LLaDA rollout: every response position is valid
    ours = copy_estimates(est.sample(model, prompt, pmask, comp, scored, seeds)).t()  # (B, K)
    _, draws = drawn_inputs(est, seeds, pmask, scored)
    attn = torch.cat([pmask, torch.ones_like(comp)], 1)
    ref = ref_copy_estimates(lambda ids: model(ids, attn), prompt, pmask, comp, draws, MASK)
    assert torch.allclose(ours, ref, rtol=1e-6, atol=1e-5)  # float32 sums of ~L * 10 nats
    g_ours = torch.autograd.grad(ours.sum(), list(model.parameters()))
    g_ref = torch.autograd.grad(ref.sum(), list(model.parameters()))
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(g_ours, g_ref))
    assert torch.allclose(est(model, prompt, pmask, comp, scored, seeds), ours.mean(1))  # the ELBO: the copies' mean


# ---------------------------------------------------------------- the masks and the estimate


def test_masks_have_the_counts_and_stay_inside_the_scored_positions():
    prompt, pmask, comp, cmask = random_batch(B=6, L=16)
    est = EvenCountsEstimator(EvenCountsConfig(num_samples=16), MASK)
    seeds = mask_seeds(0, 1, 6, 0)
    scored = cmask.bool()
    d = est.draw(seeds, pmask, scored)
    n = scored.sum(-1)
    assert torch.equal(d.masked.sum(-1), d.counts) and bool((d.masked & ~scored).sum() == 0)
    assert bool(((d.offset >= 1) & (d.offset <= n)).all())
    for b in range(6):  # K = n = 16: every count 1..16 once; rows ending early (n = 3, 5): spread evenly
        freq = torch.bincount(d.counts[:, b], minlength=int(n[b]) + 1)
        assert freq[0] == 0 and len(freq) == int(n[b]) + 1 and int(freq[1:].max() - freq[1:].min()) <= (0 if n[b] == 16 else 2)
    assert torch.equal(est.draw(seeds, pmask, scored).masked, d.masked)  # the same seeds: the same masks
    assert not torch.equal(est.draw(mask_seeds(0, 2, 6, 0), pmask, scored).masked, d.masked)
    fwd, seen = forward_spy(ContextModel(20))
    s = est.sample(fwd, prompt, pmask, comp, cmask, seeds, copies=[3, 7])
    assert len(seen) == 2  # one forward per copy asked for
    assert torch.equal(seen[0][:, 4:] == MASK, d.masked[3] | ~scored)  # unscored positions: masked, never scored
    assert torch.equal(s.masked, d.masked[[3, 7]]) and torch.equal(seen[0][:, :4], prompt)  # the prompt as is
    assert torch.allclose(s.t, d.counts[[3, 7]] / n)


def test_offsets_are_uniform_and_each_copy_count_uniform_without_ties():
    """Over many rows the offset is uniform on 1..n, so a copy whose shift j n / K is not a half-integer
    has a uniform count (its estimate is then unbiased for the ELBO)."""
    n, K, B = 5, 4, 4000
    est = EvenCountsEstimator(EvenCountsConfig(num_samples=K), MASK)
    d = est.draw(mask_seeds(1, 0, B, 0), torch.ones(B, 1, dtype=torch.long), torch.ones(B, n, dtype=torch.bool))
    freq = torch.bincount(d.offset, minlength=n + 1)[1:] / B
    assert bool(((freq - 1 / n).abs() < 0.03).all())
    for j in range(K):  # shifts 0, 1.25, 2.5, 3.75: copy 2 rounds half to even, as DARE's
        f = torch.bincount(d.counts[j], minlength=n + 1)[1:] / B
        assert bool(((f - 1 / n).abs() < 0.03).all()) == (j != 2), j


def test_expected_estimate_is_the_elbo_on_an_enumerable_model(tiny_bundle):
    """L = 3, K = 3 (integer shifts): over the offset and the subsets, each copy's (n / x) * sum of masked
    log-probs averages to the masked-diffusion ELBO, the mean log-likelihood over generation orders, below
    the log of their mean likelihood."""
    net, mask_id = tiny_bundle.net.eval(), tiny_bundle.mask_token_id
    lo = max(mask_id, tiny_bundle.eos_token_id, tiny_bundle.pad_token_id) + 1
    prompt, x0 = torch.tensor([[lo + 1, lo + 4]]), torch.tensor([[lo + 2, lo + 7, lo + 3]])
    L = K = 3
    subsets = [frozenset(s) for r in range(1, L + 1) for s in itertools.combinations(range(L), r)]
    with torch.no_grad():
        def lp_given(masked):  # log p(x_i | `masked` masked, the others visible), (L,)
            comp = torch.where(torch.tensor([i in masked for i in range(L)]), mask_id, x0[0])
            lg = logits_fn(net)(torch.cat([prompt[0], comp])[None], None)[0, 2:]
            return torch.log_softmax(lg, -1).gather(-1, x0[0][:, None])[:, 0]
        lp = {s: lp_given(s) for s in subsets}
    orders = [sum(float(lp[frozenset(o[j:])][o[j]]) for j in range(L)) for o in itertools.permutations(range(L))]
    ao_elbo = sum(orders) / len(orders)
    per_offset = []
    for k in range(1, L + 1):
        copies = []
        for x in even_counts(k, L, K).tolist():
            terms = []
            for s in (s for s in subsets if len(s) == x):
                m = torch.tensor([i in s for i in range(L)])
                sample = ELBOSample(lp[s][None, None], m[None, None], torch.tensor([[x / L]]))
                terms.append(float(copy_estimates(sample)))
            copies.append(sum(terms) / len(terms))
        per_offset.append(sum(copies) / K)
    assert sum(per_offset) / L == pytest.approx(ao_elbo, rel=1e-5)
    assert ao_elbo <= math.log(sum(math.exp(v) for v in orders) / len(orders)) + 1e-9


def test_rows_with_one_or_no_scored_position():
    """A row with one scored position masks it in every copy (t = 1); a row with none masks nothing and
    estimates 0."""
    prompt, pmask, comp, _ = random_batch(B=3, L=4)
    cmask = torch.tensor([[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]])
    est = EvenCountsEstimator(EvenCountsConfig(num_samples=3), MASK)
    seeds = mask_seeds(2, 1, 3, 0)
    d = est.draw(seeds, pmask, cmask.bool())
    assert d.counts[:, 1].tolist() == [1, 1, 1] and d.counts[:, 2].tolist() == [0, 0, 0]
    assert int(d.offset[1]) == 1 and int(d.offset[2]) == 0
    model = ContextModel(prompt.shape[1] + 4)
    s = est.sample(model, prompt, pmask, comp, cmask, seeds)
    assert s.t[:, 1].tolist() == [1.0, 1.0, 1.0] and s.t[:, 2].tolist() == [0.0, 0.0, 0.0]
    value = est(model, prompt, pmask, comp, cmask, seeds)
    # its copies all mask the one token (the unscored ones are masked too): log p of it, times n / x = 1
    logp = torch.log_softmax(model(torch.cat([prompt[1:2], torch.full((1, 4), MASK)], 1)), -1)
    torch.testing.assert_close(value[1], logp[0, prompt.shape[1] + 1, comp[1, 1]])
    assert float(value[2].detach()) == 0.0


def test_the_offset_does_not_depend_on_the_prompt_masking():
    """The offset and the prompt's masking use different random numbers of the row: over 3000 rows with
    half the prompt masked, the offset is uncorrelated with whether the first prompt token is masked."""
    B, n = 3000, 8
    est = EvenCountsEstimator(EvenCountsConfig(num_samples=2, p_mask_prompt=0.5), MASK)
    d = est.draw(mask_seeds(4, 0, B, 0), torch.ones(B, 3, dtype=torch.long), torch.ones(B, n, dtype=torch.bool))
    hit = d.prompt_hit[:, 0].double()
    assert 0.45 < float(hit.mean()) < 0.55
    assert abs(float(torch.corrcoef(torch.stack([hit, d.offset.double()]))[0, 1])) < 0.06  # 3 sd at B = 3000


def test_each_copy_shows_the_pins_and_carries_the_padding_mask():
    prompt, pmask, comp, cmask = random_batch(B=3, L=6)
    pmask[1, :2] = 0
    pinned = torch.zeros_like(comp, dtype=torch.bool)
    pinned[:, 1] = True
    spy, seen = input_spy(ContextModel(prompt.shape[1] + comp.shape[1]))
    est = EvenCountsEstimator(EvenCountsConfig(num_samples=2), MASK)
    est(spy, prompt, pmask, comp, cmask, mask_seeds(1, 2, 3, 0), pinned=pinned)
    assert len(seen) == 2
    for ids, attn in seen:
        assert torch.equal(ids[:, prompt.shape[1] + 1], comp[:, 1])  # pinned: shown in every copy
        assert attn is not None and torch.equal(attn, torch.cat([pmask, torch.ones_like(comp)], 1))


def test_sampler_units_sum_the_scored_tokens():
    lp = torch.tensor([[-0.5, -1.0, -2.0], [-0.25, -4.0, -8.0]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    est = EvenCountsEstimator(EvenCountsConfig(), MASK)
    assert est.sampler_units(lp, mask).tolist() == [-1.5, -12.0]


def test_num_samples_is_checked():
    EvenCountsConfig(num_samples=1).validate()
    with pytest.raises(ConfigError, match=r"^likelihood\.num_samples=0 is invalid"):
        EvenCountsConfig(num_samples=0).validate()
