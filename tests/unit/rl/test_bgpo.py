"""BGPO: parity with a transcription of DARE's BGPO (yjyddq/DARE @ 83ae8a3,
``verl/trainer/ppo/dllm_core_algos.py`` and ``verl/workers/actor/llada_dp_actor_bgpo.py``) on random
tensors and on a tiny model's rollouts, values and gradients; one forward and backward per copy with a
flat graph; invariants; configs. Its even-counts estimator is tested in
tests/unit/likelihood/test_even_counts.py."""

import math
import weakref
from dataclasses import replace

import pytest
import torch

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.even_counts import (
    EvenCountsConfig,
    EvenCountsEstimator,
)
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import StepContext
from diffusion_rl.rl.objectives.bgpo import BGPO, BGPOConfig, bgpo_loss
from diffusion_rl.rl.rollout import RolloutEngine
from tests.helpers.common import compose_cfg, rollout_of
from tests.helpers.random_model import MASK, ContextModel, forward_spy, input_spy, random_batch
from tests.unit.likelihood.test_even_counts import drawn_inputs, ref_copy_estimates
from tests.unit.rl.test_coupled_grpo import perturbed

# ---------------------------------------------------------------- the transcription (reference)
# DARE's loss written out afresh, shapes as there: compute_policy_loss_bgpo with verl's masked_mean, and
# update_policy's loop (one micro-batch holding the mini-batch, the loss / mc_num). Its masking and
# per-copy estimates are transcribed beside the estimator's tests (tests/unit/likelihood/test_even_counts.py).


def ref_policy_loss(old_l_theta, l_theta, advantages, response_mask, clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0,
                    linear_positive=True, dual_clip=True, agg="token-mean"):
    """compute_policy_loss_bgpo; the keywords after clip_ratio_c are one-line changes for the sensitivity test."""
    if linear_positive:
        negative_approx_kl = torch.where(advantages > 0, torch.log(1 + l_theta - old_l_theta), l_theta - old_l_theta)
    else:  # DARE's commented-out alternative: exp(z) for every sign
        negative_approx_kl = l_theta - old_l_theta
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1) if dual_clip else clip_pg_losses1
    if agg == "token-mean":  # verl_F.masked_mean
        return (pg_losses * response_mask).sum() / (response_mask.sum() + 1e-8)
    return ((pg_losses * response_mask).sum(-1) / response_mask.sum(-1)).mean()  # seq-mean-token-mean


def ref_update_loss(l_copies, old_copies, advantages, response_mask, **kw):
    """update_policy's sum over copies of pg_loss / mc_num; l_copies, old_copies (B, K) loss_per_sample
    values, advantages (B,), response_mask (B, R)."""
    B, K = l_copies.shape
    R = response_mask.shape[1]
    adv = advantages[:, None].expand(B, R)
    total = 0.0
    for i in range(K):
        l_theta = (l_copies[:, i] / R)[:, None].expand(B, R)  # loss_per_sample / response_length, expanded
        old_l_theta = (old_copies[:, i] / R)[:, None].expand(B, R)
        total = total + ref_policy_loss(old_l_theta, l_theta, adv, response_mask, **kw) / K
    return total


# ---------------------------------------------------------------- the loss's parity


def random_case(seed=1, B=6, K=4, L=10):
    """Estimates whose z = (E - E_old) / L put every row's copies below the clip, inside it, above it and
    past the dual clip; advantages of both signs and 0; rows of different lengths (a mask ending early)."""
    g = torch.Generator().manual_seed(seed)
    est = (-5 * torch.rand(B, K, generator=g) * L).requires_grad_(True)  # (B, K) copy estimates
    grid = torch.tensor([-0.6, 0.1, 0.5, 2.0])[:K]  # r = 1 + z or exp(z): 0.4 / 0.55, ~1.1, 1.5 / 1.65, 3 / 7.4
    z = torch.stack([grid[torch.randperm(K, generator=g)] for _ in range(B)]) + 0.05 * torch.rand(B, K, generator=g)
    old = est.detach() - z * L
    adv = torch.tensor([1.5, -0.7, 0.0, 0.4, -2.0, 0.9])[:B]
    row = torch.ones(B, L)
    row[1, 6:] = 0
    row[3, 3:] = 0
    return est, old, adv, row


def units(x, L):
    return x[..., None].expand(*x.shape, L)  # (B, K) -> (B, K, L): each estimate repeated over the positions


def test_loss_matches_the_transcription_on_random_tensors():
    est, old, adv, row = random_case()
    B, K = est.shape
    L = row.shape[1]
    cfg = BGPOConfig()
    ours, m = bgpo_loss(units(est, L), units(old, L), adv[:, None, None], row[:, None].expand(B, K, L), cfg,
                        group_size=3)
    ref = ref_update_loss(est, old, adv, row)
    assert ours.item() == pytest.approx(ref.item(), abs=1e-6)
    (ga,) = torch.autograd.grad(ours, est)
    (gb,) = torch.autograd.grad(ref, est)
    assert torch.allclose(ga, gb, atol=1e-6)
    # every branch was exercised: the PPO clip on both sides, the dual clip
    assert m["ratio/clip_frac_low"] > 0 and m["ratio/clip_frac_high"] > 0 and m["bgpo/dual_clip_frac"] > 0
    assert m["bgpo/nonpositive_ratio_frac"] == 0


@pytest.mark.parametrize("change", [{"linear_positive": False}, {"dual_clip": False}, {"agg": "seq-mean"},
                                    {"clip_ratio_c": 2.0}, {"clip_high": 0.28}])
def test_a_one_line_change_to_the_loss_is_caught(change):
    """The parity above can fail: each one-line change of the transcription (exp(z) for A > 0, as DARE's
    commented-out line; no dual clip; a mean over rows; another c or clip) moves the loss or its gradient."""
    est, old, adv, row = random_case()
    B, K = est.shape
    L = row.shape[1]
    ours, _ = bgpo_loss(units(est, L), units(old, L), adv[:, None, None], row[:, None].expand(B, K, L), BGPOConfig(),
                        group_size=3)
    other = ref_update_loss(est, old, adv, row, **change)
    (ga,) = torch.autograd.grad(ours, est)
    (gb,) = torch.autograd.grad(other, est)
    assert abs(ours.item() - other.item()) > 1e-3 or (ga - gb).abs().max() > 1e-3


# ---------------------------------------------------------------- on a tiny model's rollout


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A tiny model's rollout under bgpo's config, advantages of both signs whatever it earned."""
    # the public code knows no pinned tokens: the completion is all decisions, as there
    c = build(compose_cfg(["objective=bgpo", "task.pin_givens=false"], tmp_path_factory.mktemp("bgpo")))
    eng = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=3)
    ro = eng(c.task.splits.train[:2], c.bundle.net, 0)
    return c, replace(ro, advantages=torch.linspace(-1.5, 1.5, ro.advantages.shape[0]))


def backward_by_parts(obj, ctx, params):
    """What the module does: backpropagate each part as it comes. -> loss, metrics, gradients"""
    for p in params:
        p.grad = None
    total, metrics = 0.0, {}
    for part, m in obj.loss_parts(ctx):
        part.backward()
        total, metrics = total + part.detach(), {**metrics, **m}
    return total, metrics, [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]


def test_objective_matches_the_transcription_on_a_tiny_models_rollout(real):
    c, ro = real
    net = c.bundle.net.train()
    params = list(net.parameters())
    old = perturbed(net, 0.02, 1)
    obj = c.objective
    assert isinstance(obj, BGPO) and obj.cfg.backward_per_copy and obj.likelihood.cfg.num_samples == 16
    assert c.advantage.cfg.name == "group_std" and c.advantage.cfg.eps == 1e-6
    L = ro.completion_ids.shape[1]
    ids_attn = torch.cat([ro.prompt_mask, torch.ones_like(ro.completion_ids)], 1)
    for it in (0, 2):
        ctx = StepContext(ro, it, 3, logits_fn(net), logits_fn(old), None)
        ours, m, g_ours = backward_by_parts(obj, ctx, params)
        scored = torch.ones_like(ro.completion_ids, dtype=torch.bool)
        _, draws = drawn_inputs(obj.likelihood, obj.mask_seeds(ctx, "policy"), ro.prompt_mask, scored)

        def estimates(f, draws=draws):
            return ref_copy_estimates(lambda x: f(x, ids_attn), ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                      draws, c.bundle.mask_token_id)

        with torch.no_grad():
            old_est = estimates(logits_fn(old))
        expected = ref_update_loss(estimates(logits_fn(net)), old_est, ro.advantages, torch.ones(len(ro.texts), L))
        g_ref = torch.autograd.grad(expected, params)
        assert ours.item() == pytest.approx(expected.item(), abs=1e-6), it
        assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(g_ours, g_ref)), it
        assert m["ratio/log_std"].item() > 0  # the old policy is apart: the ratios are not all 1
    # every inner update reads the rollout's masks, as DARE keeps them for the batch
    assert obj.mask_seeds(StepContext(ro, 2, 3, None, None, None), "policy") == obj.mask_seeds(ctx, "old")


def test_one_graph_equals_one_backward_per_copy(real):
    """backward_per_copy=false (every copy in one graph, the template's loss) gives the same loss, gradients
    and metrics as the per-copy parts."""
    c, ro = real
    net = c.bundle.net.train()
    params = list(net.parameters())
    old = perturbed(net, 0.02, 2)
    ctx = StepContext(ro, 1, 3, logits_fn(net), logits_fn(old), None)
    a, ma, ga = backward_by_parts(c.objective, ctx, params)
    joint = BGPO(BGPOConfig(backward_per_copy=False), c.objective.likelihood)
    b, mb, gb = backward_by_parts(joint, StepContext(ro, 1, 3, logits_fn(net), logits_fn(old), None), params)
    assert a.item() == pytest.approx(b.item(), abs=1e-7)
    assert all(torch.allclose(x, y, atol=1e-7, rtol=1e-5) for x, y in zip(ga, gb))
    assert ma.keys() == mb.keys() and all(torch.allclose(ma[k], mb[k], atol=1e-6) for k in ma)


def test_each_part_holds_one_copys_graph(real):
    """Memory flat in the copies: when each part is handed to the module, the graph alive holds the
    tensors of one copy's forward (the same count for every copy); the joint graph holds all of them."""
    c, ro = real
    net = c.bundle.net.train()
    old = perturbed(net, 0.02, 3)

    class Box:
        def __init__(self, t):
            self.t = t

    def live_at_each_part(obj):
        live: weakref.WeakSet = weakref.WeakSet()

        def pack(t):
            box = Box(t)
            live.add(box)
            return box

        counts = []
        ctx = StepContext(ro, 1, 3, logits_fn(net), logits_fn(old), None)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda box: box.t):
            for part, _ in obj.loss_parts(ctx):
                counts.append(len(live))
                part.backward()
        return counts

    per_copy = live_at_each_part(c.objective)
    (joint,) = live_at_each_part(BGPO(BGPOConfig(backward_per_copy=False), c.objective.likelihood))
    assert len(per_copy) == 16 and len(set(per_copy)) == 1 and per_copy[0] > 0
    assert joint > 10 * per_copy[0]


def test_one_forward_per_copy_with_the_old_estimates_taken_once(real):
    c, ro = real
    net = c.bundle.net.train()
    fwd, seen = forward_spy(logits_fn(net))
    old_fwd, old_seen = forward_spy(logits_fn(perturbed(net, 0.02, 4)))
    ctx = StepContext(ro, 0, 3, fwd, old_fwd, None)
    n_before = []
    for _ in c.objective.loss_parts(ctx):
        n_before.append(len(seen))
    assert n_before == list(range(1, 17)) and len(old_seen) == 16  # 16 old forwards, before the first part
    ctx.inner_iter = 1
    list(c.objective.loss_parts(ctx))
    assert len(old_seen) == 16  # the rollout's masks: the old estimates serve every update
    # the first update after a rollout, old policy = policy: no old forward at all, the ratio exactly 1
    ctx = StepContext(ro, 0, 3, fwd, old_fwd, None, policy_is_old=True)
    *_, (_, m) = c.objective.loss_parts(ctx)
    assert len(old_seen) == 16 and m["ratio/log_min"].item() == 0 == m["ratio/log_max"].item()


# ---------------------------------------------------------------- the loss's invariants


def test_at_theta_old_nothing_is_clipped_and_both_bounds_give_the_policy_gradient():
    """z = 0: r = 1 on either side, the loss is the token mean of -A, and the gradient of each copy's
    estimate is -A n_b / (K L sum n), the linear bound's and exp's alike."""
    est, _, adv, row = random_case()
    B, K = est.shape
    L = row.shape[1]
    mask = row[:, None].expand(B, K, L)
    loss, m = bgpo_loss(units(est, L), units(est.detach(), L), adv[:, None, None], mask, BGPOConfig(), group_size=3)
    n = row.sum(-1)
    assert loss.item() == pytest.approx(float((-adv * n).sum() / n.sum()), abs=1e-7)
    assert m["ratio/clip_frac_low"] == 0 == m["ratio/clip_frac_high"] and m["ratio/log_max"] == 0
    (g,) = torch.autograd.grad(loss, est)
    assert torch.allclose(g, (-adv * n / (K * L * n.sum()))[:, None].expand(B, K), atol=1e-8)


def test_the_linear_ratio_below_zero_stays_finite_and_unclipped():
    """A > 0 with 1 + z <= 0: DARE's log(1 + z) is NaN (the update is lost); here the loss is -A (1 + z)."""
    est = torch.tensor([[-30.0]], requires_grad=True)
    L = 4
    old = torch.tensor([[-20.0]])  # z = -10 / 4 = -2.5
    loss, m = bgpo_loss(units(est, L), units(old, L), torch.full((1, 1, 1), 2.0), torch.ones(1, 1, L), BGPOConfig(),
                        group_size=1)
    assert loss.item() == pytest.approx(-2.0 * (1 - 2.5)) and m["bgpo/nonpositive_ratio_frac"].item() == 1
    (g,) = torch.autograd.grad(loss, est)
    assert g.item() == pytest.approx(-2.0 / L)
    assert math.isnan(ref_update_loss(est.detach(), old, torch.tensor([2.0]), torch.ones(1, L)).item())


def test_dual_clip_caps_a_negative_advantages_loss_and_its_gradient():
    est = torch.tensor([[8.0]], requires_grad=True)
    L = 4
    old = torch.tensor([[0.0]])  # z = 2, exp(2) > 3
    loss, m = bgpo_loss(units(est, L), units(old, L), torch.full((1, 1, 1), -0.5), torch.ones(1, 1, L), BGPOConfig(),
                        group_size=1)
    assert loss.item() == pytest.approx(0.5 * 3.0) and m["bgpo/dual_clip_frac"].item() == 1
    (g,) = torch.autograd.grad(loss, est)
    assert g.item() == 0


def test_zero_advantages_give_no_gradient_and_nothing_covered_is_finite(real):
    c, ro = real
    net = c.bundle.net.train()
    zero = replace(ro, advantages=torch.zeros_like(ro.advantages))
    ctx = StepContext(zero, 1, 3, logits_fn(net), logits_fn(perturbed(net, 0.05, 5)), None)
    params = [p for p in net.parameters() if p.requires_grad]
    loss, _, grads = backward_by_parts(c.objective, ctx, params)
    assert loss.item() == 0 and all(float(g.abs().max()) == 0.0 for g in grads)
    est = torch.randn(3, 2, requires_grad=True)
    loss, m = bgpo_loss(units(est, 5), units(est.detach() + 1, 5), torch.ones(3, 1, 1), torch.zeros(3, 2, 5),
                        BGPOConfig(), group_size=3)
    loss.backward()
    assert torch.isfinite(loss) and bool(torch.isfinite(est.grad).all()) and all(bool(torch.isfinite(v)) for v in m.values())


def test_elbo_tokens_completion_covers_up_to_eos_and_weights_rows_by_it(real):
    c, ro = real
    cmask = ro.completion_mask.clone()
    cmask[0, 6:] = 0  # as if row 0 had ended early
    ro = replace(ro, completion_mask=cmask)
    f = logits_fn(c.bundle.net)
    ctx = StepContext(ro, 0, 3, f, f, None)
    for tokens, covered in (("all", torch.ones_like(cmask)), ("completion", cmask)):
        obj = BGPO(BGPOConfig(elbo_tokens=tokens), c.objective.likelihood)
        s = obj.logp_units(ctx, f, "policy", copies=[0, 5])
        assert s.logp.shape == (len(ro.texts), 2, cmask.shape[1])
        assert torch.equal(s.mask, covered[:, None].expand_as(s.mask))
        d = obj.likelihood.draw(obj.mask_seeds(ctx, "policy"), ro.prompt_mask, covered.bool())
        assert bool((d.masked & ~covered.bool()).sum() == 0) and int(d.counts[:, 0].max()) <= int(covered[0].sum())


def test_pinned_tokens_are_context_never_masked_or_covered(tmp_path):
    c = build(compose_cfg(["objective=bgpo"], tmp_path))  # Sudoku's givens pinned
    eng = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=1)
    ro = eng(c.task.splits.train[:2], c.bundle.net, 0)
    assert ro.pinned is not None and bool(ro.pinned.any())
    fwd, seen = forward_spy(logits_fn(c.bundle.net))
    s = c.objective.logp_units(StepContext(ro, 0, 3, fwd, fwd, None), fwd, "policy", copies=[1])
    P = ro.prompt_ids.shape[1]
    assert torch.equal(seen[0][:, P:][ro.pinned], ro.completion_ids[ro.pinned])  # shown as they are
    assert not bool(s.mask[:, 0][ro.pinned].any()) and not bool(s.kl_mask[:, 0][ro.pinned].any())


def test_kl_anchor_by_parts_equals_the_template(real):
    c, ro = real
    net = c.bundle.net.train()
    params = list(net.parameters())
    old, ref = perturbed(net, 0.02, 6), perturbed(net, 0.03, 7)
    parts = BGPO(BGPOConfig(beta=0.04), c.objective.likelihood)
    joint = BGPO(BGPOConfig(beta=0.04, backward_per_copy=False), c.objective.likelihood)
    a, ma, ga = backward_by_parts(parts, StepContext(ro, 1, 3, logits_fn(net), logits_fn(old), logits_fn(ref)), params)
    b, mb, gb = backward_by_parts(joint, StepContext(ro, 1, 3, logits_fn(net), logits_fn(old), logits_fn(ref)), params)
    assert ma["train/kl"].item() > 0 and ma["train/kl"].item() == pytest.approx(mb["train/kl"].item(), rel=1e-5)
    assert a.item() == pytest.approx(b.item(), abs=1e-7)
    assert all(torch.allclose(x, y, atol=1e-7, rtol=1e-5) for x, y in zip(ga, gb))


def test_rollout_of_hand_made_tensors_runs():
    prompt, pmask, comp, cmask = random_batch(B=4)
    ro = rollout_of(prompt, pmask, comp, cmask, torch.arange(4.0), torch.tensor([1.0, -1.0, 0.5, -0.5]), 2)
    model = ContextModel(11)
    obj = BGPO(BGPOConfig(), EvenCountsEstimator(EvenCountsConfig(num_samples=3), MASK))
    total = 0.0
    for part, _ in obj.loss_parts(StepContext(ro, 0, 0, model, perturbed(model, 0.1, 0), None)):
        part.backward()
        total += part.item()
    assert math.isfinite(total) and model.tok.grad.abs().sum() > 0


# ---------------------------------------------------------------- configs


def test_config_selects_the_public_regime_and_the_command_line_wins(tmp_path):
    cfg = compose_cfg(["objective=bgpo", "~testbed"], tmp_path)
    assert (cfg.likelihood.name, cfg.likelihood.num_samples, cfg.advantage.name, cfg.advantage.eps) == (
        "even_counts", 16, "group_std", 1e-6)
    assert (cfg.objective.mu, cfg.objective.beta, cfg.objective.eps, cfg.objective.eps_high,
            cfg.objective.dual_clip) == (1, 0.0, 0.2, 0.2, 3.0)
    assert (cfg.optim.lr, cfg.optim.weight_decay, list(cfg.optim.betas), cfg.optim.grad_clip) == (5e-7, 0.01, [0.9, 0.999], 1.0)
    c = build(compose_cfg(["objective=bgpo", "likelihood.num_samples=4", "objective.dual_clip=5"], tmp_path))
    assert c.objective.likelihood.cfg.num_samples == 4 and c.objective.cfg.dual_clip == 5


@pytest.mark.parametrize("overrides,key", [
    (["likelihood=elbo"], "likelihood.name"),
    (["objective.behaviour_correction=tis"], "objective.behaviour_correction"),
    (["objective.dual_clip=1.0"], "objective.dual_clip"),
    (["objective.elbo_tokens=padding"], "objective.elbo_tokens"),
    (["objective.eps=1.0"], "objective.eps"),
    (["likelihood.num_samples=0"], "likelihood.num_samples"),
    (["advantage=per_token"], "advantage.credit"),
])
def test_nonsense_fails_in_one_line(tmp_path, overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        build(compose_cfg(["objective=bgpo", *overrides], tmp_path))
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- the loss and its metrics, unit by unit
# BGPO's rule (the module docstring) written out for each row b and copy j in float64, with every branch
# and bound exercised: the linear ratio at 0 (logged as 1e-6), on the upper bound and above it; the
# exponential ratio on the lower bound, below it, on the dual clip and past it; A = 0 and 0 < A < 1 rows;
# rows covering 4, 3, 2, 1 and no positions (not contiguous); K = 3 copies, L = 4 positions, B = 6 rows.

Z = [[-1.0, 0.25, 0.5],  # A = 1.5: 1 + z = 0 (non-positive), 1.25 (the upper bound itself), 1.5 (clipped)
     [-0.25, -1.0, 1.0],  # A = -0.7: exp(z) the lower bound itself, below it, the dual clip c itself
     [-1.0, 2.0, 0.125],  # A = 0: exp(z) below the lower bound, past c, inside
     [-0.5, 0.75, -0.125],  # A = 0.5: 1 + z below, above, inside the clip range
     [0.0, 1.5, -0.5],  # A = -2: exp(z) 1, past c, below the lower bound
     [0.25, -0.25, 0.0]]  # A = 1, no covered position: counts nowhere
ADV = [1.5, -0.7, 0.0, 0.5, -2.0, 1.0]
COVER = [[0, 1, 2, 3], [0, 2, 3], [0, 1, 2, 3], [1], [2, 3], []]


def hand_case():
    """(E, E_old, adv, mask, cfg) with the bounds set to the ratios of the edge units: 1 - eps is the
    exp ratio of row 1 copy 0 and c that of row 1 copy 2, as the same float32 exp gives them."""
    B, K, L = 6, 3, 4
    old = torch.tensor([[-3.0 * b - j for j in range(K)] for b in range(B)])
    z = torch.tensor(Z)
    est = old + L * z  # exact: z in eighths, L = 4
    mask = torch.zeros(B, K, L)
    for b, cols in enumerate(COVER):
        mask[b, :, cols] = 1
    adv = torch.tensor(ADV)
    zz = ((est - old) / L)[..., None].expand(B, K, L)
    exp = torch.exp(torch.where((adv > 0)[:, None, None].expand(B, K, L), torch.zeros_like(zz), zz))
    r_low, c = float(exp[1, 0, 0]), float(exp[1, 2, 0])
    return est, old, adv, mask, BGPOConfig(eps=1 - r_low, eps_high=0.25, dual_clip=c), exp[..., 0]


def hand_loss_and_metrics(est, old, adv, mask, cfg, exp32):
    """The rule per unit, float64: -> loss (a graph on est), metrics. The comparisons with the bounds read
    the ratio as float32 holds it (``exp32``, (B, K), for the exponential ratio; 1 + z is exact here), so
    that a unit built on a bound is on it."""
    B, K, L = mask.shape
    e = est.double()
    lo, hi, c = 1 - cfg.eps, 1 + cfg.eps_high, cfg.dual_clip
    n = [int(mask[b, 0].sum()) for b in range(B)]
    total, logs, low, high, dual, nonpos = 0.0, [], 0, 0, 0, 0
    for b in range(B):
        a = float(adv[b])
        for j in range(K):
            z = (e[b, j] - float(old[b, j])) / L
            r = 1 + z if a > 0 else torch.exp(z)
            l_bj = torch.maximum(-a * r, -a * r.clamp(lo, hi))
            if a < 0:
                l_bj = torch.minimum(l_bj, torch.tensor(-a * c, dtype=torch.float64))
            total = total + n[b] * l_bj / (K * sum(n))
            rv = float(r.detach()) if a > 0 else float(exp32[b, j])
            logs += [math.log(max(rv, 1e-6)) if a > 0 else float(z)] * n[b]
            low += n[b] * (rv < lo and a < 0)
            high += n[b] * (rv > hi and a > 0)
            dual += n[b] * (rv > c and a < 0)
            nonpos += n[b] * (a > 0 and rv <= 0)
    units = len(logs)
    mean = sum(logs) / units
    per_token = [[float(est[b, j]) / n[b] for j in range(K)] for b in range(B) if n[b]]
    copy_mean = [sum(p) / K for p in per_token]
    metrics = {"ratio/log_mean": mean, "ratio/log_std": math.sqrt(sum((x - mean) ** 2 for x in logs) / (units - 1)),
               "ratio/log_min": min(logs), "ratio/log_max": max(logs),
               "ratio/clip_frac_low": low / units, "ratio/clip_frac_high": high / units,
               "bgpo/dual_clip_frac": dual / units, "bgpo/nonpositive_ratio_frac": nonpos / units,
               "bgpo/elbo_per_token": sum(copy_mean) / len(per_token),
               "bgpo/copy_std_per_token": sum(math.sqrt(sum((x - m) ** 2 for x in p) / (K - 1))
                                              for p, m in zip(per_token, copy_mean)) / len(per_token)}
    return total, metrics


def test_loss_gradient_and_metrics_equal_the_rule_unit_by_unit():
    est, old, adv, mask, cfg, exp32 = hand_case()
    B, K, L = mask.shape
    e = est.clone().requires_grad_(True)
    loss, m = bgpo_loss(e[..., None].expand(B, K, L), old[..., None].expand(B, K, L), adv[:, None, None], mask, cfg,
                        group_size=3)
    x = est.clone().double().requires_grad_(True)
    want, want_m = hand_loss_and_metrics(x, old, adv, mask, cfg, exp32)
    assert loss.item() == pytest.approx(want.item(), rel=1e-6, abs=1e-7)
    (g,) = torch.autograd.grad(loss, e)
    (gw,) = torch.autograd.grad(want, x)
    on_a_bound = torch.zeros_like(g, dtype=torch.bool)
    on_a_bound[1, 0] = on_a_bound[1, 2] = True  # max / min / clamp at a tie: a subgradient either way
    torch.testing.assert_close(g.double()[~on_a_bound], gw[~on_a_bound], rtol=1e-5, atol=1e-8)
    assert m.keys() == want_m.keys()
    for k, v in want_m.items():
        assert m[k].item() == pytest.approx(v, rel=1e-5, abs=1e-6), k
    # what the case exercises: each bound met exactly and passed, and the non-positive linear ratio
    assert want_m["ratio/clip_frac_low"] > 0 and want_m["ratio/clip_frac_high"] > 0 and want_m["bgpo/dual_clip_frac"] > 0
    assert want_m["bgpo/nonpositive_ratio_frac"] > 0 and want_m["ratio/log_min"] == pytest.approx(math.log(1e-6))


def test_the_metrics_with_one_and_two_copies_and_one_position():
    """One copy: no spread to report. Two copies: their std. A one-position completion (L = 1)."""
    est = torch.tensor([[-2.0, -4.0], [-1.0, -1.5]])
    for K in (1, 2):
        e = est[:, :K]
        _, m = bgpo_loss(e[..., None], e[..., None], torch.tensor([1.0, -1.0])[:, None, None], torch.ones(2, K, 1),
                         BGPOConfig(), group_size=2)
        assert m["bgpo/elbo_per_token"].item() == pytest.approx(float(e.mean(-1).mean()))  # n = 1 per row
        assert m["ratio/log_max"].item() == 0 and m["ratio/log_min"].item() == 0
        if K == 1:
            assert "bgpo/copy_std_per_token" not in m
        else:
            assert m["bgpo/copy_std_per_token"].item() == pytest.approx((math.sqrt(2.0) + math.sqrt(0.125)) / 2)


# ---------------------------------------------------------------- the objective's pieces, against their inputs


def hand_rollout(sampler_logp=None, offset=0, B=4, L=7):
    """4 rows (2 groups of 2), 7 positions (n != L), row 1 ending early; a process's share at ``offset``."""
    from diffusion_rl.core.distributed import Shard

    prompt, pmask, comp, cmask = random_batch(B=B, L=L)
    return rollout_of(prompt, pmask, comp, cmask, torch.arange(float(B)), torch.tensor([1.0, -1.0, 0.5, -0.5]), 2,
                      shard=Shard(0, 1, offset), sampler_logp=sampler_logp)


def test_every_update_reads_the_rollouts_first_masks_and_fresh_ones_are_the_policys():
    """share_masks_with_old (default): every role at every update reads the seeds of the rollout's first
    iteration, ``mask_seeds(run_seed, rollout_id, n, 0, offset)`` (DARE draws them once per batch); with
    false the policy and the reference draw fresh ones at each update, the old policy keeps the first."""
    from diffusion_rl.likelihood.base import mask_seeds

    ro = hand_rollout(offset=5)
    est = EvenCountsEstimator(EvenCountsConfig(num_samples=3), MASK)
    first = mask_seeds(11, ro.rollout_id, 4, 0, 5)
    shared, fresh = BGPO(BGPOConfig(), est), BGPO(BGPOConfig(share_masks_with_old=False), est)
    news = []
    for it in range(3):
        ctx = StepContext(ro, it, 11, None, None, None)
        for role in ("policy", "old", "ref"):
            assert shared.mask_seeds(ctx, role) == first, (it, role)
        assert fresh.mask_seeds(ctx, "old") == first
        news.append(fresh.mask_seeds(ctx, "policy"))
        assert fresh.mask_seeds(ctx, "ref") == news[-1] and len(set(news[-1]) & set(first)) == 0
    assert len({tuple(s) for s in news}) == 3  # fresh at each update
    assert mask_seeds(11, ro.rollout_id, 4, 0, 0) != first  # the offset is read: a process's rows draw their own


def test_the_old_policy_keeps_the_first_iterations_masks_in_its_forwards():
    """With share_masks_with_old=false the old policy's forward inputs at update 2 are those of update 0; the
    policy's are fresh."""
    ro = hand_rollout()
    obj = BGPO(BGPOConfig(share_masks_with_old=False), EvenCountsEstimator(EvenCountsConfig(num_samples=3), MASK))
    fwd, seen = input_spy(ContextModel(11))

    def inputs(it, role):
        seen.clear()
        obj.logp_units(StepContext(ro, it, 3, fwd, fwd, None), fwd, role)
        return torch.cat([ids for ids, _ in seen])

    old0, old2, new2 = inputs(0, "old"), inputs(2, "old"), inputs(2, "policy")
    assert torch.equal(old2, old0) and not torch.equal(new2, old2)


@pytest.mark.parametrize("tokens", ["all", "completion"])
def test_the_units_are_each_copys_estimate_and_the_kl_units_its_masked_tokens(tokens):
    """From the forward's own inputs: copy c of row b masks the covered positions its input shows as the
    mask token; its KL units are those tokens' log-probs (0 elsewhere), its ratio unit the estimate
    ``n_b / x_bc * sum`` of them, repeated over the covered positions, which are its mask."""
    import torch.nn.functional as F

    ro = hand_rollout()
    P, L = ro.prompt_ids.shape[1], ro.completion_ids.shape[1]
    model = ContextModel(P + L)
    obj = BGPO(BGPOConfig(elbo_tokens=tokens), EvenCountsEstimator(EvenCountsConfig(num_samples=4), MASK))
    fwd, seen = input_spy(model)
    copies = [0, 3, 1]  # C = 3, n = 4, L = 7: every axis apart
    s = obj.logp_units(StepContext(ro, 0, 3, fwd, fwd, None), fwd, "policy", copies=copies)
    covered = (torch.ones_like(ro.completion_mask) if tokens == "all" else ro.completion_mask).bool()
    assert len(seen) == len(copies) and s.logp.shape == s.kl_logp.shape == s.kl_mask.shape == (4, 3, L)
    for c, (ids, attn) in enumerate(seen):
        masked = (ids[:, P:] == MASK) & covered  # (n, L) what copy c masks of the covered positions
        assert bool(masked.any(-1).all())  # every row masks at least one position
        lp = F.log_softmax(model(ids, attn)[:, P:].float(), -1).gather(-1, ro.completion_ids[..., None])[..., 0]
        assert torch.equal(s.kl_mask[:, c].bool(), masked)
        torch.testing.assert_close(s.kl_logp[:, c], torch.where(masked, lp, torch.zeros_like(lp)))
        for b in range(4):
            e = covered[b].sum() / masked[b].sum() * lp[b][masked[b]].sum()
            torch.testing.assert_close(s.logp[b, c], e.expand(L))
            assert torch.equal(s.mask[b, c].bool(), covered[b])


def test_the_mismatch_is_the_samplers_covered_sum_against_each_copys_old_estimate():
    """rollout/mismatch_log_ratio: per row and copy, the sampler's log-prob summed over the covered tokens
    minus the copy's old estimate, each (b, j) counted over the row's n_b covered positions."""
    ro = hand_rollout()
    g = torch.Generator().manual_seed(3)
    q = -torch.rand(ro.completion_ids.shape, generator=g)
    model = ContextModel(ro.prompt_ids.shape[1] + ro.completion_ids.shape[1])
    old_model = perturbed(model, 0.1, 1)
    for tokens in ("all", "completion"):
        ro = hand_rollout(sampler_logp=q)
        obj = BGPO(BGPOConfig(elbo_tokens=tokens), EvenCountsEstimator(EvenCountsConfig(num_samples=3), MASK))
        ctx = StepContext(ro, 0, 3, model, old_model, None)
        *_, (_, m) = obj.loss_parts(ctx)
        with torch.no_grad():
            old = obj.logp_units(ctx, old_model, "old").logp[..., 0]  # (n, K)
        covered = torch.ones_like(ro.completion_mask) if tokens == "all" else ro.completion_mask
        n = covered.sum(-1)
        qs = (q * covered).sum(-1)  # (n,)
        want = (n[:, None] * (qs[:, None] - old)).sum() / (3 * n.sum())
        assert m["rollout/mismatch_log_ratio"].item() == pytest.approx(want.item(), abs=1e-5), tokens


def test_without_beta_no_reference_forward_and_without_a_reference_no_kl():
    """beta = 0 with a reference policy at hand: it is never run and no KL is logged; beta > 0 without one
    (none is kept): the loss of beta = 0, as the template's."""
    ro = hand_rollout()
    model = ContextModel(11)
    old = perturbed(model, 0.1, 2)
    est = EvenCountsEstimator(EvenCountsConfig(num_samples=3), MASK)
    ref, ref_seen = forward_spy(perturbed(model, 0.2, 3))
    parts = list(BGPO(BGPOConfig(), est).loss_parts(StepContext(ro, 0, 3, model, old, ref)))
    assert len(ref_seen) == 0 and all("train/kl" not in m for _, m in parts)
    assert all(not m for _, m in parts[:-1]) and "ratio/log_mean" in parts[-1][1]  # the metrics come with the last part
    plain = sum(p.item() for p, _ in parts)
    anchored = list(BGPO(BGPOConfig(beta=0.04), est).loss_parts(StepContext(ro, 0, 3, model, old, None)))
    assert sum(p.item() for p, _ in anchored) == pytest.approx(plain, abs=1e-7)
    assert all("train/kl" not in m for _, m in anchored)


def test_config_edges_and_exact_keys():
    for ok in (dict(dual_clip=1.5), dict(dual_clip=1.01), dict(eps_high=0.01), dict(elbo_tokens="completion"),
               dict(elbo_tokens="all")):
        BGPOConfig(**ok).validate()
    for bad, key in ((dict(dual_clip=1.0), "objective.dual_clip"), (dict(eps_high=0.0), "objective.eps_high"),
                     (dict(eps=0.0), "objective.eps"), (dict(elbo_tokens="scored"), "objective.elbo_tokens"),
                     (dict(behaviour_correction="tis"), "objective.behaviour_correction")):
        with pytest.raises(ConfigError) as err:
            BGPOConfig(**bad).validate()
        assert err.value.key == key
