"""The StableDRL objective: hand-computed cases and invariants, on the Monte Carlo ELBO estimator (whose own
tests are in tests/unit/likelihood/test_elbo.py)."""

import copy
import math

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.elbo import (
    ELBOConfig,
    ELBOEstimator,
    eubo_from_logps,
)
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import StepContext, agg_loss, kl_penalty
from diffusion_rl.rl.objectives.stabledrl import (
    StableDRL,
    StableDRLConfig,
    clip_bounds,
    group_weights,
    stabledrl_loss,
)
from tests.helpers.common import compose_cfg, make_batch, rollout_of

MASK_ID = 99


def make_rollout(bundle, G=4, groups=2, L=10, seed=0):
    prompt, pmask, comp, cmask = make_batch(bundle, n=G * groups, L=L, seed=seed)
    rewards = torch.arange(G * groups, dtype=torch.float) % 3
    adv = rewards.view(groups, G) - rewards.view(groups, G).mean(-1, keepdim=True)
    return rollout_of(prompt, pmask, comp, cmask, rewards, adv.reshape(-1), G)


def shared(**kw) -> StableDRLConfig:
    """StableDRL on the masks of the old policy with the ELBO as the surrogate: the regime the unit tests
    below check by hand (the defaults are the public code's: fresh masks, SPG's bound)."""
    return StableDRLConfig(share_masks_with_old=True, surrogate="elbo", **kw)


def sdrl_loss(elbo, old, adv, G, eps, clip="paper", normalize="self"):
    """stabledrl_loss on per-sequence tensors (B,), as one unit per sequence (B, 1)."""
    cfg = StableDRLConfig(eps=eps, clip=clip, normalize=normalize)
    return stabledrl_loss(elbo[:, None], old[:, None], adv[:, None], torch.ones_like(old)[:, None], cfg, group_size=G)


# ---------------------------------------------------------------- StableDRL loss (pure)


def test_clip_bounds_hand_computed():
    assert clip_bounds(5.0, "paper") == (-math.inf, math.log(6.0))
    lo, hi = clip_bounds(0.2, "paper")
    assert lo == pytest.approx(math.log(0.8)) and hi == pytest.approx(math.log(1.2))
    assert clip_bounds(5.0, "cap") == (-math.inf, math.log(5.0))
    assert clip_bounds(5.0, "none") == (-math.inf, math.inf)
    assert clip_bounds(5.0, "ppo") == clip_bounds(5.0, "cap")


def test_ppo_clip_is_grpo_on_sequence_ratios():
    """clip=ppo with normalize=group_size: the loss value and gradient of GRPO's -min(rho A, clip(rho) A)
    on sequence ratios with the same upper bound (eps = 5: rho clipped above 5; GRPO's lower bound set
    out of reach), the same surrogate, 1/G per group."""
    from diffusion_rl.rl.objectives.grpo import GRPOConfig, grpo_loss

    g = torch.Generator().manual_seed(0)
    elbo = (torch.randn(8, generator=g) - 2).requires_grad_(True)
    old = elbo.detach() - torch.tensor([2.5, -0.3, 1.0, 0.2, 1.8, -1.2, 0.0, 3.0])  # some ratios beyond 5
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, -1.0, 1.0, 0.2, 0.3])
    ours, m = sdrl_loss(elbo, old, adv, 4, 5.0, "ppo", "group_size")
    (g_ours,) = torch.autograd.grad(ours, elbo)
    x = elbo.detach().clone().requires_grad_(True)
    theirs, _ = grpo_loss(x[:, None], old[:, None], adv[:, None], torch.ones(8, 1),
                          GRPOConfig(eps=1 - 1e-9, eps_high=4.0, agg="seq-mean-token-mean"), group_size=4)
    (g_theirs,) = torch.autograd.grad(theirs, x)
    # the same gradient; the values differ by the clipped samples' constant term only
    assert torch.allclose(g_ours, g_theirs, atol=1e-6)
    clipped = ((elbo.detach() - old).exp() > 5) & (adv > 0)
    assert clipped.any() and torch.all(g_ours[clipped] == 0)
    assert m["ratio/clip_frac_high"].item() == pytest.approx(clipped.float().mean().item())


def test_paper_and_cap_weights_hand_computed():
    lr = torch.tensor([math.log(10.0), 0.0, 0.0, math.log(0.5)])
    w, _ = group_weights(lr, 4, 0.2, "paper")
    expected = torch.tensor([1.2, 1.0, 1.0, 0.8]) / 4.0
    assert torch.allclose(w[0], expected, atol=1e-6)
    lr = torch.tensor([math.log(10.0), 0.0, -50.0, 0.0])
    w, _ = group_weights(lr, 4, 5.0, "cap")
    z = 7.0 + math.exp(-50.0)
    assert torch.allclose(w[0], torch.tensor([5.0 / z, 1.0 / z, math.exp(-50.0) / z, 1.0 / z]), atol=1e-7)
    w, wn = group_weights(lr, 4, 5.0, "cap", "group_size")
    assert torch.allclose(w[0], torch.tensor([5.0, 1.0, math.exp(-50.0), 1.0]) / 4, atol=1e-7)
    assert torch.allclose(wn.sum(-1), torch.ones(1))
    # metrics: one of four clipped high (paper, eps=0.2), one low
    lr = torch.tensor([math.log(10.0), 0.0, 0.0, math.log(0.5)])
    _, m = sdrl_loss(lr.clone(), torch.zeros(4), torch.ones(4), 4, 0.2, "paper")
    assert m["ratio/clip_frac_high"].item() == 0.25 and m["ratio/clip_frac_low"].item() == 0.25
    assert m["ratio/log_max"].item() == pytest.approx(math.log(10.0))
    assert m["weights/ess"].item() == pytest.approx(1 / (expected**2).sum().item(), rel=1e-5)


def test_weights_sum_to_one_per_group():
    torch.manual_seed(0)
    lr = torch.randn(24) * 3
    for clip in ("paper", "cap", "none"):
        w, wn = group_weights(lr, 6, 5.0, clip, "self")
        assert w.shape == (4, 6)
        assert torch.allclose(w.sum(-1), torch.ones(4), atol=1e-6)
        assert torch.equal(w, wn)


def test_group_boundaries_respected():
    torch.manual_seed(1)
    lr = torch.randn(3 * 4) * 2
    w, _ = group_weights(lr, 4, 100.0, "paper")
    perm = torch.tensor([2, 0, 3, 1])
    lr_p = lr.view(3, 4).clone()
    lr_p[1] = lr_p[1][perm]  # permute inside group 1
    w_p, _ = group_weights(lr_p.reshape(-1), 4, 100.0, "paper")
    assert torch.allclose(w_p[1], w[1][perm])
    assert torch.equal(w_p[0], w[0]) and torch.equal(w_p[2], w[2])
    lr_c = lr.view(3, 4).clone()
    lr_c[2] += torch.tensor([3.0, -1.0, 0.5, 2.0])  # change group 2 only
    w_c, _ = group_weights(lr_c.reshape(-1), 4, 100.0, "paper")
    assert torch.equal(w_c[0], w[0]) and torch.equal(w_c[1], w[1])
    assert not torch.allclose(w_c[2], w[2])


def test_gradient_equals_formula():
    torch.manual_seed(2)
    G, groups, D = 4, 3, 5
    feats = torch.randn(G * groups, D)
    theta = torch.randn(D, requires_grad=True)
    old = feats @ theta.detach() + torch.randn(G * groups) * 0.8
    adv = torch.randn(G * groups)
    for clip, normalize in (("paper", "self"), ("cap", "self"), ("paper", "group_size"), ("none", "self")):
        theta.grad = None
        elbo = feats @ theta  # (B,) ELBO_j = <f_j, theta>
        loss, _ = sdrl_loss(elbo, old, adv, G, 0.5, clip, normalize)
        loss.backward()
        w, _ = group_weights(elbo.detach() - old, G, 0.5, clip, normalize)
        w = w.reshape(-1)
        grads = torch.stack([torch.autograd.grad((feats @ theta)[j], theta)[0] for j in range(G * groups)])
        expected = -(w[:, None] * adv[:, None] * grads).sum(0) / groups
        assert torch.allclose(theta.grad, expected, atol=1e-6), (clip, normalize)
        lo, hi = clip_bounds(0.5, clip)
        lt = (elbo.detach() - old).clamp(min=lo, max=hi).view(groups, G)
        expected_loss = -(w.view(groups, G) * adv.view(groups, G) * elbo.detach().view(groups, G)).sum(-1).mean()
        assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5)
        if normalize == "self":
            assert torch.allclose(w.view(groups, G), lt.exp() / lt.exp().sum(-1, keepdim=True), atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_finite_for_extreme_log_ratios(dtype):
    lr = torch.tensor([1e4, -1e4, 0.0, 1e4, -1e4, -1e4, -1e4, -1e4])
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.0, 0.0])
    for clip in ("paper", "cap", "none"):
        for normalize in ("self", "group_size"):
            elbo = (torch.full((8,), -30.0) + lr).to(dtype).requires_grad_(True)
            old = torch.full((8,), -30.0).to(dtype)
            loss, m = sdrl_loss(elbo, old, adv.to(dtype), 4, 5.0, clip, normalize)
            loss.backward()
            assert loss.dtype == torch.float32
            assert torch.isfinite(loss), (clip, normalize)
            assert bool(torch.isfinite(elbo.grad.float()).all()), (clip, normalize)
            assert all(bool(torch.isfinite(v)) for v in m.values()), (clip, normalize, m)


# ---------------------------------------------------------------- the objective on a real estimator


def _ctx(bundle, policy_net, old_net, ro, inner_iter=0, ref_net=None):
    ref = None if ref_net is None else logits_fn(ref_net)
    return StepContext(ro, inner_iter, 3, logits_fn(policy_net), logits_fn(old_net), ref)


def masked_token_kl(logp, ref, masked):
    """The anchor StableDRL adds: k3 per masked token, mean per Monte Carlo sample, then over samples
    and sequences. (K, B, L) inputs, as the ELBO gives them."""
    return agg_loss(kl_penalty(logp.transpose(0, 1), ref.transpose(0, 1)), masked.transpose(0, 1))


def test_masked_token_kl_hand_computed():
    logp = torch.tensor([[[-1.0, -2.0, 5.0]], [[-0.5, -0.5, -0.5]]])  # (K=2, B=1, L=3)
    ref = torch.tensor([[[-2.0, -2.0, -9.0]], [[-0.5, -0.5, -0.5]]])
    masked = torch.tensor([[[True, True, False]], [[False, False, False]]])
    k3 = math.exp(-1.0) + 1.0 - 1.0  # d = ref - logp = -1 on token 0, 0 on token 1
    # sample 0: mean over its 2 masked tokens (the unmasked third is ignored); sample 1: no masked token -> 0
    assert masked_token_kl(logp, ref, masked).item() == pytest.approx((k3 / 2 + 0.0) / 2)


def test_kl_anchor_adds_beta_times_masked_token_kl(tiny_bundle):
    """beta > 0: loss = StableDRL loss + beta * KL on the new masks; the KL's gradient pulls toward ref."""
    ro = make_rollout(tiny_bundle)
    net = tiny_bundle.net
    old = copy.deepcopy(net).requires_grad_(False).eval()
    est = ELBOEstimator(ELBOConfig(num_samples=2, weighting="mean"), tiny_bundle.mask_token_id)
    plain, _ = StableDRL(shared(beta=0.0), est).loss(_ctx(tiny_bundle, net, old, ro))
    # reference = the policy itself: KL exactly 0, loss unchanged
    anchored, m = StableDRL(shared(beta=0.5), est).loss(_ctx(tiny_bundle, net, old, ro, ref_net=old))
    assert m["train/kl"].item() == 0.0 and anchored.item() == pytest.approx(plain.item(), abs=1e-7)
    # a different reference: the added term is beta * the per-token k3 of the same masks
    ref = copy.deepcopy(net).requires_grad_(False).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    anchored, m = StableDRL(shared(beta=0.5), est).loss(_ctx(tiny_bundle, net, old, ro, ref_net=ref))
    data = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    from diffusion_rl.likelihood.base import mask_seeds

    seeds = mask_seeds(3, ro.rollout_id, ro.completion_ids.shape[0], 0)
    with torch.no_grad():
        s, r = est.sample(logits_fn(net), *data, seeds), est.sample(logits_fn(ref), *data, seeds)
    kl = masked_token_kl(s.token_logps, r.token_logps, s.masked)
    assert kl.item() > 0 and m["train/kl"].item() == pytest.approx(kl.item(), rel=1e-5)
    assert anchored.item() == pytest.approx(plain.item() + 0.5 * kl.item(), rel=1e-5, abs=1e-6)
    anchored.backward()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)


def test_theta_equals_old_with_shared_masks_gives_zero_ratio_and_uniform_weights(tiny_bundle):
    ro = make_rollout(tiny_bundle)
    net = tiny_bundle.net
    old = copy.deepcopy(net).requires_grad_(False).eval()
    est = ELBOEstimator(ELBOConfig(num_samples=2, weighting="inverse_t", t_min=1e-3), tiny_bundle.mask_token_id)
    obj = StableDRL(shared(beta=0.0), est)
    for it in range(2):
        loss, m = obj.loss(_ctx(tiny_bundle, net, old, ro, it))
        assert m["ratio/log_min"].item() == 0.0 and m["ratio/log_max"].item() == 0.0
        assert m["weights/ess"].item() == pytest.approx(ro.group_size)
        assert m["weights/max"].item() == pytest.approx(1 / ro.group_size)
        loss.backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())
        net.zero_grad()
    # independent masks (the public code's regime): nonzero log-ratio at theta = theta_old
    obj = StableDRL(StableDRLConfig(surrogate="elbo", beta=0.0), est)
    _, m = obj.loss(_ctx(tiny_bundle, net, old, ro))
    assert m["ratio/log_std"].item() > 0 and m["ratio/log_max"].item() > m["ratio/log_min"].item()


def test_spg_mix_surrogate_changes_only_nonpositive_advantages(tiny_bundle):
    ro = make_rollout(tiny_bundle)
    net = tiny_bundle.net
    old = copy.deepcopy(net).requires_grad_(False).eval()
    est = ELBOEstimator(ELBOConfig(num_samples=2, weighting="mean"), tiny_bundle.mask_token_id)
    loss_e, _ = StableDRL(shared(beta=0.0), est).loss(_ctx(tiny_bundle, net, old, ro))
    loss_m, m = StableDRL(StableDRLConfig(share_masks_with_old=True, beta=0.0), est).loss(_ctx(tiny_bundle, net, old, ro))
    assert torch.isfinite(loss_m) and loss_m.item() != pytest.approx(loss_e.item())
    assert m["ratio/log_max"].item() == 0.0  # weights still come from the ELBO ratio
    ro.advantages = ro.advantages.abs() + 0.1  # every A > 0: both surrogates are the ELBO
    loss_e, _ = StableDRL(shared(beta=0.0), est).loss(_ctx(tiny_bundle, net, old, ro))
    loss_m, _ = StableDRL(StableDRLConfig(share_masks_with_old=True, beta=0.0), est).loss(_ctx(tiny_bundle, net, old, ro))
    assert loss_m.item() == pytest.approx(loss_e.item(), rel=1e-6)


def test_grpo_on_elbo_sequence_ratios(tmp_path, tiny_bundle):
    from diffusion_rl.app.train import build

    # one advantage per sample: the testbed's per-cell credit on Sudoku needs a per-token likelihood
    with pytest.raises(ConfigError, match=r"advantage.credit='token' is invalid: needs a per-token likelihood"):
        build(compose_cfg(["objective=grpo", "likelihood=elbo"], tmp_path))
    c = build(compose_cfg(["objective=grpo", "likelihood=elbo", "advantage.credit=sequence"], tmp_path))
    assert c.objective.likelihood.per_token is False
    ro = make_rollout(tiny_bundle)
    net = tiny_bundle.net
    old = copy.deepcopy(net).requires_grad_(False).eval()
    obj = type(c.objective)(c.objective.cfg, ELBOEstimator(c.objective.likelihood.cfg, tiny_bundle.mask_token_id))
    loss, m = obj.loss(_ctx(tiny_bundle, net, old, ro))
    assert m["ratio/log_max"].item() == 0.0 and m["ratio/clip_frac_high"].item() == 0.0
    assert loss.item() == pytest.approx(-ro.advantages.mean().item(), abs=1e-6)  # ratio 1 everywhere
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())


# ---------------------------------------------------------------- configs


def test_stabledrl_config_is_the_public_codes_regime_and_command_line_wins(tmp_path):
    from diffusion_rl.app.train import build
    from diffusion_rl.likelihood.spg_blocks import SPGBlocksEstimator

    cfg = compose_cfg(["objective=stabledrl", "~testbed"], tmp_path)
    assert cfg.likelihood.name == "spg_blocks" and cfg.advantage.name == "group"
    o = cfg.objective
    assert (o.eps, o.clip, o.normalize, o.surrogate, o.mu, o.beta, o.share_masks_with_old) == \
        (5.0, "cap", "self", None, 2, 0.0, False)
    assert (cfg.optim.lr, cfg.optim.grad_clip, cfg.optim.weight_decay, cfg.optim.decay_steps) == (1e-6, 0.2, 0.1, 2000)
    c = build(cfg)
    assert isinstance(c.objective, StableDRL) and isinstance(c.objective.likelihood, SPGBlocksEstimator)
    assert c.objective.surrogate == "spg_mix"  # null takes the public code's bound where the masks give it
    assert isinstance(build(compose_cfg(["objective=stabledrl", "likelihood=elbo"], tmp_path)).objective.likelihood,
                      ELBOEstimator)
    cfg = compose_cfg(["objective=stabledrl", "likelihood=one_step"], tmp_path)
    assert cfg.likelihood.name == "one_step"
    with pytest.raises(ConfigError, match="likelihood.name"):
        build(cfg)  # StableDRL refuses a per-token estimator in one line
    assert compose_cfg(["objective=grpo"], tmp_path).likelihood.name == "one_step"


def test_stabledrl_config_errors_name_the_key(tmp_path):
    from diffusion_rl.app.train import build

    spg_mix = "objective.surrogate=spg_mix"  # an explicit choice the likelihood cannot take is refused
    for overrides, key in ((["objective.eps=-1"], "objective.eps"), (["objective.clip=soft"], "objective.clip"),
                           (["objective.normalize=batch"], "objective.normalize"),
                           (["objective.surrogate=eubo"], "objective.surrogate"),
                           (["likelihood=elbo", "likelihood.weighting=inverse_t", spg_mix], "likelihood.weighting"),
                           (["model=tiny_block", "likelihood=staircase", spg_mix], "objective.surrogate")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            build(compose_cfg(["objective=stabledrl", *overrides], tmp_path))
    # by default the surrogate is the likelihood's: SPG's bound where its masks give it, the ELBO otherwise
    for overrides, surrogate in ((["likelihood=elbo"], "spg_mix"),
                                 (["likelihood=elbo", "likelihood.weighting=inverse_t"], "elbo"),
                                 (["model=tiny_block", "likelihood=staircase"], "elbo"),
                                 (["model=tiny_block", "likelihood=staircase", "objective.surrogate=elbo"], "elbo")):
        assert build(compose_cfg(["objective=stabledrl", *overrides], tmp_path)).objective.surrogate == surrogate


def test_grpo_on_elbo_can_draw_fresh_masks(tmp_path, tiny_bundle):
    """share_masks_with_old is every objective's: GRPO on ELBO ratios sees the paper's noisy regime too."""
    from diffusion_rl.rl.objectives.grpo import GRPO, GRPOConfig

    ro = make_rollout(tiny_bundle)
    net = tiny_bundle.net
    old = copy.deepcopy(net).requires_grad_(False).eval()
    est = ELBOEstimator(ELBOConfig(num_samples=1, weighting="inverse_t", t_min=1e-3), tiny_bundle.mask_token_id)
    _, shared = GRPO(GRPOConfig(beta=0.0), est).loss(_ctx(tiny_bundle, net, old, ro))
    _, fresh = GRPO(GRPOConfig(beta=0.0, share_masks_with_old=False), est).loss(_ctx(tiny_bundle, net, old, ro))
    assert shared["ratio/log_std"].item() == 0.0 and fresh["ratio/log_std"].item() > 0


def test_clip_bounds_at_eps_one_and_above_have_no_lower_bound():
    assert clip_bounds(1.0, "paper") == (-math.inf, math.log(2.0))
    assert clip_bounds(1.5, "paper") == (-math.inf, math.log(2.5))
    assert clip_bounds(0.5, "paper") == (math.log(0.5), math.log(1.5))
    with pytest.raises(ValueError, match="unknown clip 'clamp'"):
        clip_bounds(5.0, "clamp")


def test_ppo_weights_zero_only_above_the_bound_with_a_positive_advantage():
    # eps = 1: the bound is log 1 = 0, so a log-ratio of exactly 0 is at it, not above
    lr = torch.tensor([0.0, 0.5, 0.5, 0.5, -3.0, 0.0, 0.0, 0.0])
    adv = torch.tensor([1.0, 1.0, 0.0, -1.0, -1.0, 0.0, 0.0, 0.0])
    w, w_norm = group_weights(lr, 4, 1.0, "ppo", "self", adv)
    kept = torch.tensor([[0.0, -math.inf, 0.5, 0.5], [-3.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(w_norm, torch.softmax(kept, -1))  # only (0.5, A = 1) is out
    assert torch.equal(w, w_norm)
    # a group with every sample clipped away weighs 0, not NaN
    w, _ = group_weights(torch.full((4,), 2.0), 4, 1.0, "ppo", "self", torch.ones(4))
    assert torch.equal(w, torch.zeros(1, 4))
    with pytest.raises(ValueError, match="clip=ppo needs the advantages"):
        group_weights(lr, 4, 1.0, "ppo")
    assert torch.equal(group_weights(lr, 4, 0.5)[0], group_weights(lr, 4, 0.5, "paper")[0])  # the default clip
    with pytest.raises(ValueError, match="unknown normalize"):
        group_weights(lr, 4, 1.0, "paper", "sum")


def test_clip_fractions_count_strictly_beyond_the_bounds():
    lo = torch.tensor(math.log(0.25))  # eps 0.75: lo = log 0.25, hi = log 1.75, as float32 log-ratios
    hi = torch.tensor(math.log(1.75))
    elbo = torch.stack([lo, hi, lo - 0.1, hi + 0.1])
    _, m = sdrl_loss(elbo, torch.zeros(4), torch.tensor([1.0, -1.0, -1.0, 1.0]), 4, 0.75)
    assert m["ratio/clip_frac_low"].item() == pytest.approx(0.25)  # at the bounds is not beyond them
    assert m["ratio/clip_frac_high"].item() == pytest.approx(0.25)
    # ppo: only ratios above the bound with A > 0 count, the others are not clipped
    _, m = sdrl_loss(torch.tensor([0.0, 0.5, 0.5, 0.0]), torch.zeros(4), torch.tensor([1.0, 1.0, 0.0, -1.0]), 4, 1.0, "ppo")
    assert m["ratio/clip_frac_high"].item() == pytest.approx(0.25)
    assert m["ratio/clip_frac_low"].item() == 0.0


def test_stabledrl_config_edges():
    for ok in (dict(eps=1e-6), dict(eps=0.5), dict(eubo_beta=0.5), dict(mix_weight=0.0), dict(mix_weight=1.0),
               dict(normalize="group_size"), dict(surrogate="spg_mix"), dict(clip="ppo")):
        StableDRLConfig(**ok).validate()
    for bad, key in ((dict(eps=0.0), "eps"), (dict(eubo_beta=0.0), "eubo_beta"), (dict(mix_weight=-0.01), "mix_weight"),
                     (dict(mix_weight=1.01), "mix_weight"), (dict(clip="clamp"), "clip"),
                     (dict(normalize="sum"), "normalize"), (dict(surrogate="eubo"), "surrogate")):
        with pytest.raises(ConfigError, match=rf"^objective\.{key}\b"):
            StableDRLConfig(**bad).validate()


def test_the_eps_warning_names_when_clipping_cannot_act(caplog):
    est = ELBOEstimator(ELBOConfig(num_samples=2, weighting="mean"), MASK_ID)
    cases = [(dict(mu=1, share_masks_with_old=True, clip="cap"), True),
             (dict(mu=2, share_masks_with_old=True, clip="cap"), False),
             (dict(mu=1, share_masks_with_old=False, clip="cap"), False),
             (dict(mu=1, share_masks_with_old=True, clip="none"), False)]
    for kw, warns in cases:
        caplog.clear()
        StableDRL(StableDRLConfig(**kw), est)
        assert ("cannot act" in caplog.text) is warns, kw


def test_spg_mix_needs_the_mean_weighting_and_null_takes_it_where_the_likelihood_gives_it():
    mean = ELBOEstimator(ELBOConfig(weighting="mean"), MASK_ID)
    inverse = ELBOEstimator(ELBOConfig(weighting="inverse_t", t_min=0.001), MASK_ID)
    assert StableDRL(StableDRLConfig(surrogate=None), mean).surrogate == "spg_mix"
    assert StableDRL(StableDRLConfig(surrogate=None), inverse).surrogate == "elbo"
    with pytest.raises(ConfigError, match=r"^likelihood\.weighting='inverse_t'"):
        StableDRL(StableDRLConfig(surrogate="spg_mix"), inverse)
    assert StableDRL(StableDRLConfig(surrogate="spg_mix"), mean).surrogate == "spg_mix"


def test_spg_mix_surrogate_is_the_elbo_for_positive_advantages_and_the_mix_otherwise(tiny_bundle):
    ro = make_rollout(tiny_bundle)
    ro.pinned = torch.zeros_like(ro.completion_ids, dtype=torch.bool)
    ro.pinned[:, 0] = True  # the task's known tokens: context, never masked
    net = tiny_bundle.net.eval()
    est = ELBOEstimator(ELBOConfig(num_samples=2, weighting="mean"), tiny_bundle.mask_token_id)
    obj = StableDRL(StableDRLConfig(eubo_beta=2.0, mix_weight=0.3), est)
    ctx = _ctx(tiny_bundle, net, net, ro)
    with torch.no_grad():
        units = obj.logp_units(ctx, logits_fn(net), "policy")
        s = est.sample(logits_fn(net), ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.scored_mask,
                       obj.mask_seeds(ctx, "policy"), pinned=ro.pinned)
    elbo = est.reduce(s)
    mix = 0.7 * elbo + 0.3 * eubo_from_logps(s.token_logps, s.masked, s.t, 2.0)
    assert not s.masked[:, :, 0].any()  # the pinned position was never masked
    assert torch.allclose(units.logp[:, 0], elbo)
    expected = torch.where(ro.advantages > 0, elbo, mix)
    assert (ro.advantages > 0).any() and (ro.advantages <= 0).any()
    assert torch.allclose(units.surrogate[:, 0], expected)
