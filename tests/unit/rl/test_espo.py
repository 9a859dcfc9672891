"""ESPO and its stratified ELBO estimator: parity with a transcription of ESPO's loss (ML-GSAI/ESPO @
b5f2dac, ``espo/espo_trainer.py``) on random tensors and on a tiny model's rollouts, the exact ELBO
and its bound on a model small enough to enumerate, invariants, configs."""

import itertools
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import mask_seeds
from diffusion_rl.likelihood.stratified import (
    StratifiedConfig,
    StratifiedEstimator,
    spread_counts,
    stratified_token_terms,
)
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import Scores, StepContext
from diffusion_rl.rl.objectives.espo import ESPO, ESPOConfig, espo_kl, espo_loss
from diffusion_rl.rl.rollout import RolloutEngine
from tests.helpers.common import compose_cfg, rollout_of
from tests.unit.rl.test_coupled_grpo import MASK, ContextModel, forward_spy, perturbed, random_batch

# ---------------------------------------------------------------- the transcription (reference)
# ESPO's computation written out afresh: forward_process with its random draws passed in (the offset k
# and each row's permutation), _get_elbo for one iteration, the mean over num_mc, compute_loss.


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


def ref_compute_loss(elbo, old, ref, advantages, logits_to_keep, beta, epsilon_low, epsilon_high):
    batch_size = elbo.shape[0]
    per_token_logps, old_per_token_logps = elbo.view(-1, 1), old.view(-1, 1)
    coef_1 = torch.exp((per_token_logps - old_per_token_logps) / logits_to_keep)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss1 = coef_1 * advantages.view(-1, 1)
    per_token_loss2 = coef_2 * advantages.view(-1, 1)
    loss = -torch.min(per_token_loss1, per_token_loss2).sum() / batch_size
    if beta != 0.0:
        log_ratio = per_token_logps - ref.view(-1, 1)
        kl = log_ratio**2 / 2.0  # compute_approx_kl(..., "k2")
        loss += beta * (kl.sum() / (batch_size * logits_to_keep))
    return loss


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


def test_loss_matches_the_transcription_on_random_tensors():
    g = torch.Generator().manual_seed(1)
    B, L = 6, 12
    terms = (torch.randn(B, L, generator=g) - 3).requires_grad_(True)  # per-position ELBO terms
    old = terms.detach() + torch.randn(B, L, generator=g)  # sequence log-ratios beyond the clip too
    ref = terms.detach() + 0.3 * torch.randn(B, L, generator=g)
    adv = torch.randn(B, generator=g)
    mask = torch.ones(B, L)
    cfg = ESPOConfig()
    obj = ESPO(cfg, StratifiedEstimator(StratifiedConfig(), MASK))
    pg, m = espo_loss(terms, old, adv[:, None], mask, cfg, group_size=3)
    ours = pg + cfg.beta * obj.kl_term(Scores(terms, mask), Scores(ref, mask), lambda x: x, 3)
    expected = ref_compute_loss(terms.sum(-1), old.sum(-1), ref.sum(-1), adv, L, cfg.beta, cfg.eps, cfg.eps_high)
    assert ours.item() == pytest.approx(expected.item(), abs=1e-6)
    assert m["ratio/clip_frac_low"] + m["ratio/clip_frac_high"] > 0  # the clip was exercised
    (ga,) = torch.autograd.grad(ours, terms)
    (gb,) = torch.autograd.grad(expected, terms)
    assert torch.allclose(ga, gb, atol=1e-7)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A tiny model's rollout under espo's config, advantages nonzero whatever it earned."""
    # the public code knows no pinned tokens: the completion is all decisions, as there
    c = build(compose_cfg(["objective=espo", "task.pin_givens=false"], tmp_path_factory.mktemp("espo")))
    eng = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=3)
    ro = eng(c.task.splits.train[:2], c.bundle.net, 0)
    # the untrained model leaves some positions at the mask id; ESPO's first pass would count those as
    # masked whatever its draw (it reads the masks back from the input), a documented deviation: give
    # them an ordinary token so that both sides score the same draw
    b = c.bundle
    plain = max(b.mask_token_id, b.eos_token_id, b.pad_token_id) + 1
    comp = torch.where(ro.completion_ids == b.mask_token_id, plain, ro.completion_ids)
    return c, replace(ro, completion_ids=comp, advantages=torch.linspace(-1.5, 1.5, ro.advantages.shape[0]))


def test_objective_matches_the_transcription_on_a_tiny_models_rollout(real):
    c, ro = real
    net = c.bundle.net.train()
    old, ref = perturbed(net, 0.05, 1), perturbed(net, 0.03, 2)
    obj = c.objective
    assert isinstance(obj, ESPO) and c.advantage.cfg.name == "loo"
    ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    attn = torch.cat([ro.prompt_mask, torch.ones_like(ro.completion_ids)], 1)
    L = ro.completion_ids.shape[1]
    for it in (0, 5):
        ctx = StepContext(ro, it, 3, logits_fn(net), logits_fn(old), logits_fn(ref))
        ours, m = obj.loss(ctx)
        g_ours = torch.autograd.grad(ours, list(net.parameters()))
        draws = drawn_inputs(obj.likelihood, obj.mask_seeds(ctx, "policy"), ro.prompt_mask, L)

        def elbo(f, draws=draws):
            return ref_get_elbo_mc(lambda x: f(x, attn), ids, L, draws, c.bundle.mask_token_id)

        with torch.no_grad():
            old_elbo, ref_elbo = elbo(logits_fn(old)), elbo(logits_fn(ref))
        expected = ref_compute_loss(elbo(logits_fn(net)), old_elbo, ref_elbo, ro.advantages, L, obj.cfg.beta,
                                    obj.cfg.eps, obj.cfg.eps_high)
        g_ref = torch.autograd.grad(expected, list(net.parameters()))
        assert ours.item() == pytest.approx(expected.item(), abs=1e-6), it
        assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(g_ours, g_ref)), it
        assert m["train/kl"].item() > 0 and m["ratio/log_std"].item() > 0


# ---------------------------------------------------------------- the estimator


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


# ---------------------------------------------------------------- the objective's invariants


def test_ratio_one_clips_nothing_and_zero_advantages_give_no_gradient(real):
    c, ro = real
    net = c.bundle.net.train()
    obj = ESPO(ESPOConfig(beta=0.0), c.objective.likelihood)
    f = logits_fn(net)
    loss, m = obj.loss(StepContext(ro, 3, 3, f, f, None))
    assert m["ratio/log_min"].item() == 0 and m["ratio/log_max"].item() == 0  # shared masks: exactly 1
    assert m["ratio/clip_frac_low"].item() == 0 and m["ratio/clip_frac_high"].item() == 0
    assert loss.item() == pytest.approx(-ro.advantages.mean().item(), abs=1e-6)  # mean over sequences
    zero = replace(ro, advantages=torch.zeros_like(ro.advantages))
    loss, _ = obj.loss(StepContext(zero, 0, 3, f, logits_fn(perturbed(net, 0.05, 4)), None))
    grads = torch.autograd.grad(loss, [p for p in net.parameters() if p.requires_grad], allow_unused=True)
    assert all(g is None or float(g.abs().max()) == 0.0 for g in grads)


def test_kl_is_half_the_squared_elbo_gap_over_B_L_and_zero_at_the_reference():
    terms = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0, 0.0], [-0.5, -0.5, -2.5]])  # ELBO gaps -1 and +2
    kl = espo_kl(terms, ref, torch.ones(2, 3))
    assert kl.item() == pytest.approx((0.5 * 1 + 0.5 * 4) / 6)
    kl.backward()
    assert torch.allclose(terms.grad, torch.tensor([[-1.0] * 3, [2.0] * 3]) / 6)  # (ELBO - ref) / (B L)
    assert espo_kl(terms.detach(), terms.detach(), torch.ones(2, 3)).item() == 0


def test_the_ratio_divides_by_L_or_by_each_sequences_length():
    terms = torch.zeros(2, 4, requires_grad=True)
    old = torch.tensor([[-0.4, 0.0, 0.0, 0.0], [-0.4, 0.0, 0.0, 0.0]])  # ELBO gap 0.4 in both rows
    adv = torch.ones(2, 1)
    cfg = ESPOConfig(eps=0.5, eps_high=0.5)
    _, m = espo_loss(terms, old, adv, torch.ones(2, 4), cfg, group_size=2)  # elbo_tokens=all: / L
    assert m["ratio/log_max"].item() == pytest.approx(0.1) and m["ratio/log_min"].item() == pytest.approx(0.1)
    _, m = espo_loss(terms, old, adv, torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 1]]), cfg, group_size=2)
    assert m["ratio/log_max"].item() == pytest.approx(0.2) and m["ratio/log_min"].item() == pytest.approx(0.1)


def test_elbo_tokens_all_covers_the_padding_and_completion_does_not(real):
    c, ro = real
    cmask = ro.completion_mask.clone()
    cmask[0, 6:] = 0  # as if row 0 had ended early
    ro = replace(ro, completion_mask=cmask)
    f = logits_fn(c.bundle.net)
    for tokens, covered in (("all", torch.ones_like(cmask)), ("completion", cmask)):
        obj = ESPO(ESPOConfig(elbo_tokens=tokens), c.objective.likelihood)
        s = obj.score(StepContext(ro, 0, 3, f, f, None), f, "policy")
        assert torch.equal(s.mask, covered)
        assert bool((s.logp[~covered.bool()] == 0).all()) and bool((s.logp[covered.bool()] != 0).any())


def test_all_masked_is_finite():
    terms = torch.randn(3, 5, requires_grad=True)
    loss, m = espo_loss(terms, terms.detach() + 1, torch.ones(3, 1), torch.zeros(3, 5), ESPOConfig(), group_size=3)
    (loss + espo_kl(terms, terms.detach() - 1, torch.zeros(3, 5))).backward()
    assert torch.isfinite(loss) and bool(torch.isfinite(terms.grad).all())
    assert all(bool(torch.isfinite(v)) for v in m.values())
    prompt, pmask, comp, _ = random_batch(B=4)  # the estimator on rows with nothing to score
    out = StratifiedEstimator(StratifiedConfig(), MASK)(ContextModel(11), prompt, pmask, comp, torch.zeros_like(comp),
                                                        mask_seeds(0, 0, 4, 0))
    assert bool((out == 0).all())


# ---------------------------------------------------------------- configs


def test_config_selects_its_estimator_and_loo_and_the_command_line_wins(tmp_path):
    cfg = compose_cfg(["objective=espo"], tmp_path)
    assert (cfg.likelihood.name, cfg.advantage.name, cfg.objective.mu, cfg.objective.beta) == ("stratified", "loo", 8, 0.01)
    assert cfg.objective.eps == 0.2 and cfg.likelihood.num_samples == 2 and cfg.likelihood.coupled is True
    c = build(compose_cfg(["objective=espo", "likelihood=complementary", "objective.beta=1e-3"], tmp_path))
    assert c.objective.likelihood.cfg.name == "complementary" and c.objective.cfg.beta == 1e-3


@pytest.mark.parametrize("overrides,key", [
    (["likelihood=elbo"], "likelihood.name"),  # sequence-level: no per-position terms to sum
    (["objective.behaviour_correction=tis"], "objective.behaviour_correction"),
    (["objective.elbo_tokens=padding"], "objective.elbo_tokens"),
    (["objective.eps=1.0"], "objective.eps"),
    (["likelihood.num_samples=0"], "likelihood.num_samples"),
    (["advantage=per_token"], "advantage.name"),
])
def test_nonsense_fails_in_one_line(tmp_path, overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        build(compose_cfg(["objective=espo", *overrides], tmp_path))
    assert "\n" not in str(err.value)


def test_grpo_can_use_the_stratified_estimator(real):
    """Per token and registered: d1's GRPO runs on the weighted ELBO terms unchanged."""
    from diffusion_rl.rl.objectives.grpo import GRPO, GRPOConfig

    c, ro = real
    f = logits_fn(c.bundle.net)
    loss, m = GRPO(GRPOConfig(beta=0.0), c.objective.likelihood).loss(StepContext(ro, 0, 3, f, f, None))
    assert torch.isfinite(loss) and m["ratio/log_max"].item() == 0


def test_rollout_of_hand_made_tensors_runs():
    prompt, pmask, comp, cmask = random_batch(B=4)
    ro = rollout_of(prompt, pmask, comp, cmask, torch.arange(4.0), torch.tensor([1.0, -1.0, 0.5, -0.5]), 2)
    model = ContextModel(11)
    obj = ESPO(ESPOConfig(beta=0.0), StratifiedEstimator(StratifiedConfig(), MASK))
    loss, _ = obj.loss(StepContext(ro, 0, 0, model, perturbed(model, 0.1, 0), None))
    loss.backward()
    assert torch.isfinite(loss) and model.tok.grad.abs().sum() > 0
