"""ESPO's stratified ELBO estimator (likelihood/stratified.py): parity with a transcription of ESPO's
masking and ELBO (ML-GSAI/ESPO @ b5f2dac, ``espo/espo_trainer.py``) on a random model, the masks'
counts, a constant model made exact, and the exact ELBO and its bound on a model small enough to
enumerate. The objective's loss is tested in tests/unit/rl/test_espo.py, which reuses this transcription."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from diffusion_rl.likelihood.base import mask_seeds
from diffusion_rl.likelihood.stratified import (
    StratifiedConfig,
    StratifiedEstimator,
    spread_counts,
    stratified_token_terms,
)
from diffusion_rl.models.policy import logits_fn
from tests.helpers.random_model import MASK, ContextModel, forward_spy, input_spy, random_batch

# ---------------------------------------------------------------- the transcription (reference)
# ESPO's computation written out afresh: forward_process with its random draws passed in (the offset k
# and each row's permutation), _get_elbo for one iteration, the mean over num_mc.


def ref_counts(k, target_len, b):
    x = torch.round(torch.linspace(float(k), k + (b - 1) * ((target_len + 1) / b), steps=b)).long()
    return x % (target_len + 1)


def ref_forward_process(batch, prompt_index, mask_id, k, perms):
    b, seq_len = batch.shape
    target_len = (seq_len - prompt_index.sum()).item()
    x = ref_counts(k, target_len, b)
    assert x.min() >= 0 and x.max() <= target_len
    indices = torch.arange(target_len).repeat(b, 1)
    is_mask = indices < x.unsqueeze(1)
    for i in range(b):
        is_mask[i] = is_mask[i][perms[i]]
    is_mask = torch.cat((torch.zeros(b, int(prompt_index.sum()), dtype=torch.bool), is_mask), dim=1)
    noisy_batch = torch.where(is_mask, mask_id, batch)
    return noisy_batch, (x / (target_len + 1)).unsqueeze(1).repeat(1, seq_len)


def ref_get_elbo(model, input_ids, logits_to_keep, k, perms, mask_id, reduce_var=True):
    """``_get_elbo`` for one iteration and one Monte Carlo draw: (B, T) -> (B,)."""
    batch_size, seq_len = input_ids.shape
    prompt_index = torch.zeros(seq_len, dtype=torch.bool)
    prompt_index[: seq_len - logits_to_keep] = True
    perturbed_seq, p_mask = ref_forward_process(input_ids, prompt_index, mask_id, k, perms)
    targets_kept = input_ids[:, -logits_to_keep:]
    p_mask_kept = p_mask[:, -logits_to_keep:]
    loss = torch.zeros(batch_size, logits_to_keep, dtype=p_mask.dtype)
    mask_index_kept = (perturbed_seq == mask_id)[:, -logits_to_keep:]
    logits_kept = model(perturbed_seq)[:, -logits_to_keep:]
    loss[mask_index_kept] = F.cross_entropy(logits_kept[mask_index_kept], targets_kept[mask_index_kept],
                                            reduction="none") / p_mask_kept[mask_index_kept]
    if reduce_var:
        coupled = input_ids.clone()
        coupled[:, -logits_to_keep:] = torch.where(mask_index_kept, coupled[:, -logits_to_keep:], mask_id)
        coupled_logits_kept = model(coupled)[:, -logits_to_keep:]
        loss[~mask_index_kept] = F.cross_entropy(coupled_logits_kept[~mask_index_kept], targets_kept[~mask_index_kept],
                                                 reduction="none") / (logits_to_keep / (logits_to_keep + 1) - p_mask_kept[~mask_index_kept])
        loss /= 2
    return -loss.sum(dim=-1)


def ref_get_elbo_mc(model, input_ids, logits_to_keep, draws, mask_id, reduce_var=True):
    return torch.stack([ref_get_elbo(model, input_ids, logits_to_keep, k, perms, mask_id, reduce_var)
                        for k, perms in draws]).mean(0)


def drawn_inputs(est, seeds, prompt_mask, L):
    """Our draws, handed to the transcription: per Monte Carlo draw the batch's offset and each row's
    permutation (position j masked iff perm[j] < x_b, ESPO's ``is_mask[i][randperm]``)."""
    d = est.draw(seeds, prompt_mask, torch.ones(prompt_mask.shape[0], L, dtype=torch.bool))
    out = []
    for m in range(d.masked.shape[0]):
        assert bool((d.offset[m] == d.offset[m, 0]).all())  # one offset per batch, as ESPO's k
        out.append((int(d.offset[m, 0]), d.keys[m].argsort(-1).argsort(-1)))
    return out


# ---------------------------------------------------------------- parity


@pytest.mark.parametrize("L,B", [(16, 6), (16, 8), (16, 3), (7, 8), (255, 6), (12, 1)])
def test_spread_counts_are_espos(L, B):
    for k in range(L + 1):
        v = (k + 0.5) / (L + 1)  # a uniform that floors to the offset k
        off, x = spread_counts(v, torch.full((B,), L))
        assert bool((off == k).all())
        assert torch.equal(x, ref_counts(k, L, B)), (k, x)


@pytest.mark.parametrize("coupled", [True, False])
def test_estimator_matches_the_transcription_on_a_random_model(coupled):
    prompt, pmask, comp, _ = random_batch(B=6, L=9)
    model = ContextModel(prompt.shape[1] + comp.shape[1])
    est = StratifiedEstimator(StratifiedConfig(coupled=coupled), MASK)
    seeds = mask_seeds(5, 3, comp.shape[0], 1)
    ours = est(model, prompt, pmask, comp, torch.ones_like(comp), seeds).sum(-1)  # (B,) ELBO
    ref = ref_get_elbo_mc(lambda ids: model(ids), torch.cat([prompt, comp], 1), comp.shape[1],
                          drawn_inputs(est, seeds, pmask, comp.shape[1]), MASK, reduce_var=coupled)
    assert torch.allclose(ours, ref, rtol=1e-6, atol=1e-5)  # float32 sums of ~L * 10 nats
    g_ours = torch.autograd.grad(ours.sum(), list(model.parameters()))
    g_ref = torch.autograd.grad(ref.sum(), list(model.parameters()))
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(g_ours, g_ref))


# ---------------------------------------------------------------- the masks and the estimate


def test_evenly_spread_counts_cover_every_count_once_with_L_plus_one_rows():
    for v in (0.0, 0.3, 0.999):
        _, x = spread_counts(v, torch.full((17,), 16))
        assert sorted(x.tolist()) == list(range(17))
    # rows of different lengths each spread over their own 0..n_b
    n = torch.tensor([16, 16, 5, 5, 16, 0])
    off, x = spread_counts(0.5, n)
    assert bool((x >= 0).all()) and bool((x <= n).all()) and off.tolist() == [8, 8, 3, 3, 8, 0]


def test_masks_have_the_drawn_counts_and_each_position_is_scored_once_per_pair():
    prompt, pmask, comp, cmask = random_batch(B=8, L=16)
    fwd, seen = forward_spy(ContextModel(20))
    est = StratifiedEstimator(StratifiedConfig(num_samples=2), MASK)
    seeds = mask_seeds(0, 1, 8, 0)
    scored = cmask.bool()
    est(fwd, prompt, pmask, comp, cmask, seeds)
    assert len(seen) == 1  # every copy in one forward: (pass, sample, row)
    masked = seen[0].view(2, 2, 8, -1)[..., 4:] == MASK  # (C, K, B, L)
    d = est.draw(seeds, pmask, scored)
    assert torch.equal(masked[0] & scored, d.masked) and torch.equal(masked[0].sum(-1) - (~scored).sum(-1), d.counts)
    assert bool((masked[0] ^ masked[1] == scored).all())  # the complement: each scored position once per pair
    assert bool((masked[:, :, ~scored]).all())  # positions outside the caller's mask: masked, never scored
    assert not torch.equal(d.masked[0], d.masked[1])  # the two Monte Carlo draws differ
    assert bool((d.counts[0] <= scored.sum(-1)).all())
    assert torch.equal(est.draw(seeds, pmask, scored).masked, d.masked)  # the same seeds: the same masks
    assert not torch.equal(est.draw(mask_seeds(0, 1, 8, 1), pmask, scored).masked, d.masked)


def test_stratification_makes_a_constant_model_exact():
    """Every position with the same log-prob c under a context-free model: a batch of L + 1 copies of
    one sequence sees every count once, and its mean ELBO is exactly L c on every draw."""
    L, B, P = 6, 7, 2
    V = MASK + 1
    table = torch.zeros(P + L, V)
    table[:, 3] = 2.0  # token 3 everywhere: log p = 2 - log(e^2 + V - 1)

    def fwd(ids, attn, position_ids=None):
        return table[: ids.shape[1]].expand(ids.shape[0], -1, -1)

    c = 2.0 - math.log(math.exp(2.0) + V - 1)
    prompt, comp = torch.zeros(B, P, dtype=torch.long), torch.full((B, L), 3)
    for it in range(4):
        out = StratifiedEstimator(StratifiedConfig(num_samples=1), MASK)(
            fwd, prompt, torch.ones_like(prompt), comp, torch.ones_like(comp), mask_seeds(0, 9, B, it))
        assert out.sum(-1).mean().item() == pytest.approx(L * c, rel=1e-6)
        assert out.sum(-1).std() > 0  # each row alone is noisy


def test_exact_elbo_and_its_bound_on_an_enumerable_model(tiny_bundle):
    """L = 3: the estimator's expectation over every count and subset is the masked-diffusion ELBO, which
    equals the mean log-likelihood over generation orders and lies below the log of their mean likelihood."""
    net, mask_id = tiny_bundle.net.eval(), tiny_bundle.mask_token_id
    lo = max(mask_id, tiny_bundle.eos_token_id, tiny_bundle.pad_token_id) + 1
    prompt, x0 = torch.tensor([[lo + 1, lo + 4]]), torch.tensor([[lo + 2, lo + 7, lo + 3]])
    L = 3
    subsets = [frozenset(s) for r in range(L + 1) for s in itertools.combinations(range(L), r)]
    with torch.no_grad():
        def lp_given(masked):  # log p(x_i | the others visible, `masked` masked), (L,)
            comp = torch.where(torch.tensor([i in masked for i in range(L)]), mask_id, x0[0])
            lg = logits_fn(net)(torch.cat([prompt[0], comp])[None], None)[0, 2:]
            return torch.log_softmax(lg, -1).gather(-1, x0[0][:, None])[:, 0]
        lp = {s: lp_given(s) for s in subsets}
    orders = [sum(float(lp[frozenset(o[j:])][o[j]]) for j in range(L)) for o in itertools.permutations(range(L))]
    ao_elbo = sum(orders) / len(orders)  # E over orders of log p_order(x)
    log_mean_p = math.log(sum(math.exp(v) for v in orders) / len(orders))
    n = torch.tensor(L)
    for coupled in (True, False):
        per_count = []
        for x in range(L + 1):
            terms = []
            for s in (s for s in subsets if len(s) == x):
                m = torch.tensor([i in s for i in range(L)])
                comp = frozenset(range(L)) - s
                t = stratified_token_terms(lp[s], lp[comp] if coupled else None, m, torch.ones(L, dtype=torch.bool),
                                           torch.tensor(x), n)
                terms.append(float(t.sum()))
            per_count.append(sum(terms) / len(terms))
        expectation = sum(per_count) / (L + 1)  # x uniform on 0..L, the subset uniform given x
        assert expectation == pytest.approx(ao_elbo, rel=1e-5), coupled
    assert ao_elbo <= log_mean_p + 1e-9 and ao_elbo < 0


# ---------------------------------------------------------------- inputs and dtypes


def test_each_copy_shows_the_pins_and_carries_the_padding_mask():
    """The forward sees every masked-set copy and its complement with the task's pinned tokens in place
    and the prompt's padding masked out (the attention mask of each copy is its row's)."""
    prompt, pmask, comp, cmask = random_batch(B=3, L=6)
    pmask[1, :2] = 0  # the second prompt left-padded
    pinned = torch.zeros_like(comp, dtype=torch.bool)
    pinned[:, 0] = True
    pinned[2, 4] = True
    spy, seen = input_spy(ContextModel(prompt.shape[1] + comp.shape[1]))
    est = StratifiedEstimator(StratifiedConfig(coupled=True, num_samples=2), MASK)
    est(spy, prompt, pmask, comp, cmask, mask_seeds(1, 2, 3, 1), pinned=pinned)
    (ids, attn), = seen
    P, copies = prompt.shape[1], 2 * 2  # (complement, draw) pairs
    rows = torch.arange(ids.shape[0]) % 3  # copy-major, then the batch
    completion_part = ids[:, P:]
    assert torch.equal(completion_part[pinned[rows]], comp[rows][pinned[rows]])
    assert (completion_part[~pinned[rows]] == MASK).any()  # the rest is masked in some copy
    assert attn is not None and torch.equal(attn, torch.cat([pmask, torch.ones_like(comp)], 1).repeat(copies, 1))


def test_token_terms_keep_the_log_probs_dtype():
    """float64 log-probs give float64 terms computed in float64: with n = 2 scored positions the
    masking rates are 1/3 and 2/3, which float32 would round."""
    lp = torch.tensor([[-0.7, -1.1]], dtype=torch.float64)
    lp_comp = torch.tensor([[-0.3, -2.9]], dtype=torch.float64)
    masked, scored = torch.tensor([[True, False]]), torch.tensor([[True, True]])
    counts, n = torch.tensor([1]), torch.tensor([2])
    one = stratified_token_terms(lp, None, masked, scored, counts, n)
    assert one.dtype == torch.float64
    torch.testing.assert_close(one, torch.tensor([[-0.7 * 3, 0.0]], dtype=torch.float64), rtol=1e-15, atol=0)
    both = stratified_token_terms(lp, lp_comp, masked, scored, counts, n)
    expected = torch.tensor([[-0.7 * 3 / 2, -2.9 * 3 / 2]], dtype=torch.float64)  # complement rate (2 - 1) / 3
    torch.testing.assert_close(both, expected, rtol=1e-15, atol=0)
