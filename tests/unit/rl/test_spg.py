"""SPG (rl/objectives/spg.py): parity with a transcription of the public code, invariants, configs. Its
block-wise masks are tested in tests/unit/likelihood/test_spg_blocks.py, its bounds (the sandwich EUBO >=
log p >= ELBO) in tests/unit/likelihood/test_elbo.py.

The reference functions below are written from facebookresearch/SPG @ a1c7120, ``spg/spg_trainer.py``
(``_get_per_seq_logps``, ``compute_loss``; ``forward_process`` block_random is transcribed in
test_spg_blocks.py), in its operations and order, and import nothing from the project's implementation.
"""

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.elbo import ELBOConfig, ELBOEstimator, elbo_from_logps, eubo_from_logps
from diffusion_rl.likelihood.spg_blocks import SPGBlocksConfig, SPGBlocksEstimator
from diffusion_rl.likelihood.uniform_elbo import UniformELBOConfig, UniformELBOEstimator
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import StepContext
from diffusion_rl.rl.objectives.spg import NEGATIVE_BOUNDS, SPG, SPGConfig, spg_loss
from diffusion_rl.rl.rollout import RolloutEngine
from diffusion_rl.sampling.sampler import completion_mask
from tests.helpers.common import compose_cfg, rollout_of
from tests.helpers.random_model import input_spy, unit_inputs
from tests.unit.likelihood.test_spg_blocks import public_block_random
from tests.unit.rl.test_coupled_grpo import perturbed

MASK = 99


# ---------------------------------------------------------------- the public code, transcribed


def public_per_seq_logps(logits, noisy, input_ids, logits_to_keep, completion_mask, reward_mask, mask_id,
                         logp_estimation="mix", eubo_beta=1.5, mix_weight=0.5):
    """SPG's _get_per_seq_logps after the forward, num_iterations = 1: logits (b, num_t, l, V) of the
    noisy batch (b, num_t, l). -> (1, b)"""
    batch_size, num_t = noisy.shape[:2]
    num_iterations = 1
    perturb_mask = noisy == mask_id
    completion_logits = logits[:, :, -logits_to_keep:, :]
    completion_targets = input_ids[:, -logits_to_keep:]
    perturb_mask = perturb_mask[:, :, -logits_to_keep:]
    completion_targets = completion_targets.unsqueeze(1).repeat(1, num_t, 1)
    flat_logits = completion_logits.reshape(-1, completion_logits.size(-1))
    flat_targets = completion_targets.reshape(-1)
    loss = F.cross_entropy(flat_logits, flat_targets, reduction="none")
    prob = F.softmax(flat_logits, dim=-1).gather(dim=-1, index=flat_targets.unsqueeze(-1))
    completion_log_probs = -loss.view(num_iterations * batch_size, num_t, logits_to_keep)
    completion_probs = prob.view(num_iterations * batch_size, num_t, logits_to_keep)
    per_token_logps = completion_log_probs.view(num_iterations, batch_size, num_t, logits_to_keep).to(torch.float32)
    per_token_probs = completion_probs.view(num_iterations, batch_size, num_t, logits_to_keep).to(torch.float32)
    completion_mask_expanded = completion_mask.unsqueeze(0).unsqueeze(2).expand(num_iterations, -1, num_t, -1)
    perturb_mask_expanded = perturb_mask.view(num_iterations, batch_size, num_t, logits_to_keep)
    denominator = (completion_mask_expanded * perturb_mask_expanded).sum(dim=3)
    if (denominator == 0).any():
        denominator = torch.clamp(denominator, min=1e-8)
    per_seq_logps = (per_token_logps * completion_mask_expanded * perturb_mask_expanded).sum(dim=3) / denominator
    if logp_estimation in ("eubo", "mix"):
        empirical_t = (completion_mask_expanded * perturb_mask_expanded).sum(dim=3) / completion_mask_expanded.sum(dim=3)
        empirical_t_expanded = empirical_t.unsqueeze(3).expand(-1, -1, -1, completion_mask_expanded.size(-1))
        per_token_avg_ps = (per_token_probs.pow(eubo_beta) * perturb_mask_expanded * completion_mask_expanded
                            / empirical_t_expanded.clamp(min=1e-8))
        per_token_avg_ps = per_token_avg_ps.mean(dim=2)
        per_token_avg_ps_dezero = per_token_avg_ps.clone()
        per_token_avg_ps_dezero[per_token_avg_ps_dezero == 0] = 1
        loss_mask = (per_token_avg_ps > 0).bool()
    reward_mask_expanded = reward_mask.unsqueeze(0).expand(num_iterations, -1)
    per_seq_logps_positive = per_seq_logps.mean(dim=2)
    if logp_estimation == "eubo":
        per_seq_logps_negative = ((per_token_avg_ps_dezero.log() * loss_mask).sum(dim=2)
                                  / loss_mask.sum(dim=2).clamp(min=1e-8) / eubo_beta)
    elif logp_estimation == "mix":
        per_seq_logps_negative = (mix_weight * (per_token_avg_ps_dezero.log() * loss_mask).sum(dim=2)
                                  / loss_mask.sum(dim=2).clamp(min=1e-8) / eubo_beta
                                  + (1 - mix_weight) * per_seq_logps.mean(dim=2))
    elif logp_estimation == "elbo":
        per_seq_logps_negative = per_seq_logps.mean(dim=2)
    elif logp_estimation == "zero":
        per_seq_logps_negative = torch.zeros_like(per_seq_logps_positive)
    return (reward_mask_expanded.float() * per_seq_logps_positive
            + (~reward_mask_expanded).float() * per_seq_logps_negative)


def public_loss(per_seq_logps, advantages, completion_mask):
    """SPG's compute_loss after the bounds."""
    per_seq_loss = -advantages.unsqueeze(0) * per_seq_logps
    completion_length = completion_mask.sum(dim=1).unsqueeze(0)
    return (per_seq_loss * completion_length).sum() / completion_length.sum()


# ---------------------------------------------------------------- helpers


def ours_from_logits(logits, noisy, comp, cmask, adv, P, negative="mix", eubo_beta=1.5, mix_weight=0.5):
    """The project's pieces, composed as SPG.logp_units and the template compose them, on the same noisy
    inputs: (B, K, P+L, V) logits, (B, K, P+L) ids."""
    K = noisy.shape[1]
    logp = logits[:, :, P:].float().log_softmax(-1).gather(-1, comp[:, None, :, None].expand(-1, K, -1, 1))
    token_logps = logp.squeeze(-1).transpose(0, 1)  # (K, B, L)
    cm = cmask.bool()
    masked = (noisy[:, :, P:] == MASK).transpose(0, 1) & cm  # (K, B, L)
    t = masked.sum(-1) / cm.sum(-1)  # (K, B)
    elbo = elbo_from_logps(token_logps, masked, t, "mean")
    eubo = eubo_from_logps(token_logps, masked, t.float(), eubo_beta)
    neg = {"mix": mix_weight * eubo + (1 - mix_weight) * elbo, "eubo": eubo, "elbo": elbo,
           "zero": torch.zeros_like(elbo)}[negative]
    s = torch.where(adv > 0, elbo, neg)
    L = comp.shape[1]
    cfg = SPGConfig(negative=negative, eubo_beta=eubo_beta, mix_weight=mix_weight)
    return spg_loss(elbo[:, None].expand(-1, L), None, adv[:, None], cmask, cfg, group_size=4,
                    surrogate=s[:, None].expand(-1, L))[0]


def random_case(seed, B=8, P=5, L=12, V=7, K=2, bl=4):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, V, (B, P), generator=g)
    comp = torch.randint(0, V, (B, L), generator=g)
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    cmask = (torch.arange(L)[None] < lengths[:, None]).long()
    batch = torch.cat([prompt, comp], 1)
    noisy, _ = public_block_random(batch, P, cmask, MASK, K, bl, 0.0, 1.0, 0.15, g)
    logits = torch.randn(B, K, P + L, V, generator=g) * 2
    adv = torch.randn(B, generator=g)
    adv[::3] = 0.0  # A = 0 takes the upper-bound side, as reward_mask = A > 0 does
    return noisy, logits, comp, cmask, adv, batch


# ---------------------------------------------------------------- parity with the public code


@pytest.mark.parametrize("negative", ["mix", "eubo", "elbo", "zero"])
def test_loss_parity_on_random_tensors(negative):
    for seed in range(4):
        noisy, logits, comp, cmask, adv, batch = random_case(seed)
        logits = logits.requires_grad_(True)
        ref = public_loss(public_per_seq_logps(logits, noisy, batch, comp.shape[1], cmask, adv > 0, MASK,
                                               negative, 1.5, 0.5), adv, cmask)
        g_ref, = torch.autograd.grad(ref, logits)
        ours = ours_from_logits(logits, noisy, comp, cmask, adv, batch.shape[1] - comp.shape[1], negative)
        g_ours, = torch.autograd.grad(ours, logits)
        assert ours.item() == pytest.approx(ref.item(), abs=1e-6), (negative, seed)
        assert torch.allclose(g_ours, g_ref, atol=1e-6), (negative, seed)


def spg_setup(tmp_path, extra=()):
    """The objective built from the configs, and a rollout of the (untrained) tiny model with
    advantages of both signs (an untrained model earns nearly nothing)."""
    torch.manual_seed(0)  # the model's initialisation
    # the public code knows no pinned tokens: the completion is all decisions, as there
    c = build(compose_cfg(["objective=spg", "objective.beta=0", "likelihood.block_length=4", "task.pin_givens=false",
                              *extra], tmp_path))
    engine = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=3)
    ro = engine(c.task.splits.train[:2], c.bundle.net, 0)
    adv = torch.linspace(-1.0, 1.0, ro.completion_ids.shape[0])
    adv[2] = 0.0
    comp = ro.completion_ids.clone()  # Sudoku answers fill the 16 positions: end two of them early
    comp[1, 5] = comp[3, 9] = c.bundle.eos_token_id
    # an untrained model sometimes commits the mask token itself, which SPG would count as masked
    # (it reads its masks back from the ids): keep such tokens out so both read the same masks
    comp[comp == c.bundle.mask_token_id] = c.bundle.eos_token_id + 1
    return c, replace(ro, advantages=adv, completion_ids=comp, completion_mask=completion_mask(comp, c.bundle.eos_token_id))


@pytest.mark.parametrize("negative", ["mix", "eubo"])
def test_loss_parity_on_real_rollouts(tmp_path, negative):
    """The objective's loss on a tiny model's rollout equals the transcription fed the same noisy inputs."""
    c, ro = spg_setup(tmp_path, [f"objective.negative={negative}"])
    c.bundle.net.requires_grad_(True)
    net = c.bundle.net.eval()
    seen = []

    def forward(ids, attn):
        seen.append((ids, attn))
        return logits_fn(net)(ids, attn)

    K, B = c.objective.likelihood.cfg.num_samples, ro.prompt_ids.shape[0]
    loss, m = c.objective.loss(StepContext(ro, 1, 3, forward, logits_fn(net), None))
    params = list(net.parameters())
    g_ours = torch.autograd.grad(loss, params, allow_unused=True)
    ids, attn = seen[-1]  # (K * B, P + L), the policy's forward
    noisy = ids.view(K, B, -1).transpose(0, 1)  # (B, K, l) as SPG lays them out
    logits = logits_fn(net)(ids, attn).view(K, B, ids.shape[1], -1).transpose(0, 1)  # (B, K, l, V)
    batch = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    cm = ro.completion_mask
    ref = public_loss(public_per_seq_logps(logits, noisy, batch, ro.completion_ids.shape[1], cm, ro.advantages > 0,
                                           c.bundle.mask_token_id, negative, c.objective.cfg.eubo_beta, 0.5),
                      ro.advantages, cm)
    g_ref = torch.autograd.grad(ref, params, allow_unused=True)
    assert cm.sum(-1).min() < cm.sum(-1).max()  # lengths differ: the len_i weights are exercised
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    for a, b in zip(g_ours, g_ref):
        assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, atol=1e-6))
    # the metrics: rows with A <= 0 (the A = 0 row among them) are on the upper side, by s_i - ELBO_i
    with torch.no_grad():
        bounds = [public_per_seq_logps(logits, noisy, batch, ro.completion_ids.shape[1], cm, ro.advantages > 0,
                                       c.bundle.mask_token_id, est, c.objective.cfg.eubo_beta, 0.5)[0]
                  for est in (negative, "elbo")]
    upper = ro.advantages <= 0
    assert m["spg/frac_upper"].item() == pytest.approx(upper.float().mean().item())
    assert m["spg/upper_minus_elbo"].item() == pytest.approx((bounds[0] - bounds[1])[upper].mean().item(), abs=1e-6)


# ---------------------------------------------------------------- the objective's invariants


def test_zero_advantages_give_zero_gradient(tmp_path):
    c, ro = spg_setup(tmp_path)
    ro = replace(ro, advantages=torch.zeros_like(ro.advantages))
    net = c.bundle.net
    loss, m = c.objective.loss(StepContext(ro, 0, 3, logits_fn(net), logits_fn(net), None))
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in net.parameters())
    assert m["spg/frac_upper"].item() == 1.0  # A = 0 is on the upper-bound side, as SPG's reward_mask


def test_theta_equals_old_logs_ratio_one_and_nothing_clipped(tmp_path):
    c, ro = spg_setup(tmp_path)
    net = c.bundle.net
    old = copy.deepcopy(net).requires_grad_(False).eval()
    for it in range(2):
        _, m = c.objective.loss(StepContext(ro, it, 3, logits_fn(net.eval()), logits_fn(old), None))
        assert m["ratio/log_min"].item() == 0.0 and m["ratio/log_max"].item() == 0.0
        assert m["ratio/clip_frac_low"].item() == 0.0 and m["ratio/clip_frac_high"].item() == 0.0


def test_gradient_equals_the_formula():
    """d loss = -sum_i A_i len_i d s_i / sum_i len_i, with s_i the ELBO for A_i > 0 and the mix otherwise."""
    torch.manual_seed(0)
    B, L, D = 8, 6, 5
    feats = torch.randn(B, D)
    theta = torch.randn(D, requires_grad=True)
    lengths = torch.tensor([6, 1, 3, 6, 2, 5, 4, 6])
    mask = (torch.arange(L)[None] < lengths[:, None]).float()
    adv = torch.randn(B)
    s = feats @ theta  # (B,) the bound of each row
    loss, _ = spg_loss(s[:, None].expand(-1, L), None, adv[:, None], mask, SPGConfig(), group_size=4)
    loss.backward()
    expected = -(adv[:, None] * lengths[:, None] * feats).sum(0) / lengths.sum()
    assert torch.allclose(theta.grad, expected, atol=1e-6)


def test_bounds_by_sign_of_the_advantage(tmp_path):
    """A > 0 rows train on the ELBO whatever `negative` is; negative=elbo is REINFORCE on the ELBO and
    negative=zero leaves the A <= 0 rows without gradient."""
    c, ro = spg_setup(tmp_path)
    net = c.bundle.net.eval()
    ctx = StepContext(ro, 0, 3, logits_fn(net), logits_fn(net), None)
    loss = {}
    for neg in ("mix", "eubo", "elbo", "zero"):
        obj = SPG(SPGConfig(negative=neg, beta=0.0, eubo_beta=1.0), c.objective.likelihood)
        loss[neg], m = obj.loss(ctx)
        if neg == "elbo":
            assert m["spg/upper_minus_elbo"].item() == 0.0
    assert len({round(v.item(), 6) for v in loss.values()}) == 4
    pos = ro.advantages > 0
    positive_only = replace(ro, advantages=torch.where(pos, ro.advantages, torch.zeros_like(ro.advantages)))
    ctx_p = StepContext(positive_only, 0, 3, logits_fn(net), logits_fn(net), None)
    zero, _ = SPG(SPGConfig(negative="zero", beta=0.0), c.objective.likelihood).loss(ctx)
    assert zero.item() == pytest.approx(SPG(SPGConfig(negative="elbo", beta=0.0), c.objective.likelihood)
                                        .loss(ctx_p)[0].item(), abs=1e-7)


def test_all_masked_and_empty_rows_stay_finite(tiny_bundle):
    """A row whose completion mask is empty (nothing scored) and a 1-token row: finite bounds, loss, grads."""
    net = tiny_bundle.net
    m = tiny_bundle.mask_token_id
    prompt = torch.full((4, 3), 7)
    comp = torch.full((4, 5), 8)
    cmask = torch.tensor([[0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    est = SPGBlocksEstimator(SPGBlocksConfig(block_length=2), m)
    s = est.sample(logits_fn(net), prompt, torch.ones_like(prompt), comp, cmask, [1, 2, 3, 4])
    assert not bool(s.masked[:, 0].any()) and bool(s.masked[:, 1, 0].all())  # 1 token: always the one masked
    ro = rollout_of(prompt, torch.ones_like(prompt), comp, cmask, torch.zeros(4), torch.tensor([1.0, -1.0, 0.5, -0.5]), 4)
    loss, metrics = SPG(SPGConfig(beta=0.0), est).loss(StepContext(ro, 0, 3, logits_fn(net), logits_fn(net), None))
    loss.backward()
    assert torch.isfinite(loss) and all(bool(torch.isfinite(v)) for v in metrics.values())
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)


def test_ratio_diagnostic_off_spends_no_forward_on_the_old_policy(tmp_path):
    from diffusion_rl.training.module import DiffusionRLModule

    c, ro = spg_setup(tmp_path, ["objective.ratio_diagnostic=false"])
    assert not c.objective.needs_old_logp()

    def no_old(*args, **kwargs):
        raise AssertionError("the old policy was scored")

    net = c.bundle.net
    loss, m = c.objective.loss(StepContext(ro, 1, 3, logits_fn(net), no_old, None))
    assert torch.isfinite(loss) and not any(k.startswith("ratio/") for k in m)
    module = DiffusionRLModule(c.bundle, c.task, c.objective, c.advantage, c.sampler, c.optim, 0)
    assert module.old_policy is None  # no frozen copy either
    tis = SPG(SPGConfig(ratio_diagnostic=False, behaviour_correction="tis"), c.objective.likelihood)
    assert tis.needs_old_logp()  # TIS reads the old log-probs whatever the diagnostic says


def test_metrics_by_hand():
    """Rows 0..3 with 3, 1, 0 and 2 tokens and A = (0.5, -1, -2, 2): rows 0, 1, 3 have tokens, row 1 alone
    is on the upper side (row 2 has nothing scored): frac_upper = 1/3; its s - ELBO is -2.5 - (-2) = -0.5."""
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]])
    elbo = torch.tensor([-1.0, -2.0, -3.0, -4.0])[:, None].expand(-1, 3)
    s = torch.tensor([-1.0, -2.5, -3.5, -4.0])[:, None].expand(-1, 3)
    adv = torch.tensor([0.5, -1.0, -2.0, 2.0])[:, None]
    _, m = spg_loss(elbo, None, adv, mask, SPGConfig(), group_size=2, surrogate=s)
    assert m["spg/frac_upper"].item() == pytest.approx(1 / 3)
    assert m["spg/upper_minus_elbo"].item() == pytest.approx(-0.5)
    # one row with tokens, on the upper side: all of the rows that count
    _, m = spg_loss(elbo[:2], None, adv[[1, 0]], mask[[1, 2]], SPGConfig(), group_size=2, surrogate=s[:2])
    assert m["spg/frac_upper"].item() == 1.0


def test_the_kl_anchor_is_k3_on_each_monte_carlo_samples_masked_tokens(tmp_path):
    """beta > 0: train/kl is the k3 estimator exp(d) - d - 1, d = log p_ref - log p, on the completion
    tokens each Monte Carlo sample masks, averaged over a sample's tokens, then over samples and rows;
    the inputs and logits are read from the forwards themselves."""
    c, ro = spg_setup(tmp_path, ["objective.beta=0.04"])
    net = c.bundle.net.eval()
    ref_net = perturbed(net, 0.05, 1)
    fwd, seen = input_spy(logits_fn(net))
    _, m = c.objective.loss(StepContext(ro, 0, 3, fwd, logits_fn(net), logits_fn(ref_net)))
    ids, attn = seen[-1]  # (K * B, P + L): the policy's forward
    K, L = c.objective.likelihood.cfg.num_samples, ro.completion_ids.shape[1]
    comp = ro.completion_ids.repeat(K, 1)  # (K * B, L)
    with torch.no_grad():
        lp, lp_ref = (logits_fn(f)(ids, attn)[:, -L:].log_softmax(-1).gather(-1, comp[..., None]).squeeze(-1)
                      for f in (net, ref_net))
    masked = (ids[:, -L:] == c.bundle.mask_token_id) & ro.completion_mask.repeat(K, 1).bool()  # (K * B, L)
    assert bool(masked.any(-1).all())  # every sample masks some token
    d = lp_ref - lp
    k3 = torch.where(masked, d.exp() - d - 1, torch.zeros_like(d))
    expected = (k3.sum(-1) / masked.sum(-1)).mean()
    assert m["train/kl"].item() == pytest.approx(expected.item(), rel=1e-5)


def test_pinned_tokens_stay_visible_and_unscored(tmp_path):
    """Sudoku's givens are pinned: every Monte Carlo sample shows them to the model as they are and
    neither bound nor the KL anchor reads them."""
    torch.manual_seed(0)
    c = build(compose_cfg(["objective=spg", "likelihood.block_length=4"], tmp_path))
    ro = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=1)(c.task.splits.train[:2],
                                                                                     c.bundle.net, 0)
    assert ro.pinned is not None and bool(ro.pinned.any())
    fwd, seen = input_spy(logits_fn(c.bundle.net))
    s = c.objective.logp_units(StepContext(ro, 0, 3, fwd, fwd, None), fwd, "policy")
    K, L = c.objective.likelihood.cfg.num_samples, ro.completion_ids.shape[1]
    shown = seen[-1][0][:, -L:]  # (K * B, L)
    pinned = ro.pinned.repeat(K, 1)
    assert torch.equal(shown[pinned], ro.completion_ids.repeat(K, 1)[pinned])
    assert not bool(s.kl_mask.bool()[ro.pinned[:, None].expand_as(s.kl_mask)].any())


def test_the_old_policy_keeps_the_first_iterations_masks(tmp_path):
    """With share_masks_with_old=false the policy draws fresh masks at each update and the old policy
    is scored on the first iteration's masks: its inputs at iteration 2 are those of iteration 0."""
    c, ro = spg_setup(tmp_path, ["objective.share_masks_with_old=false"])
    inputs = unit_inputs(c.objective, ro, c.bundle.net)
    old0, old2, new2 = inputs(0, "old"), inputs(2, "old"), inputs(2, "policy")
    assert torch.equal(old2, old0) and not torch.equal(new2, old2)


@pytest.mark.parametrize("negative", NEGATIVE_BOUNDS)
def test_a_uniform_noise_model_takes_the_elbo_side_only(negative):
    """Without a mask token there is no EUBO: with likelihood=uniform_elbo, negative=elbo and zero are
    accepted, eubo and mix refused."""
    est = UniformELBOEstimator(UniformELBOConfig(), MASK)
    if negative in ("elbo", "zero"):
        assert SPG(SPGConfig(negative=negative), est).likelihood is est
        return
    with pytest.raises(ConfigError) as err:
        SPG(SPGConfig(negative=negative), est)
    assert err.value.key == "objective.negative"


# ---------------------------------------------------------------- configs


def test_config_selects_spg_masks_unscaled_advantages_and_sudoku_beta(tmp_path):
    cfg = compose_cfg(["objective=spg"], tmp_path)
    assert cfg.likelihood.name == "spg_blocks" and cfg.advantage.name == "group"
    c = build(cfg)
    assert isinstance(c.objective, SPG) and isinstance(c.objective.likelihood, SPGBlocksEstimator)
    assert c.objective.cfg.eubo_beta == 1.0 and c.objective.cfg.mu == 4 and c.objective.cfg.negative == "mix"
    c = build(compose_cfg(["objective=spg", "likelihood=elbo"], tmp_path))  # the project's ELBO, mean weighting
    assert isinstance(c.objective.likelihood, ELBOEstimator)


@pytest.mark.parametrize("overrides,key", [
    (["objective.negative=upper"], "objective.negative"),
    (["objective.eubo_beta=0.5"], "objective.eubo_beta"),
    (["objective.mix_weight=1.5"], "objective.mix_weight"),
    (["likelihood=one_step"], "likelihood.name"),
    (["likelihood=elbo", "likelihood.weighting=inverse_t"], "likelihood.weighting"),
    (["advantage=per_token"], "advantage.credit"),
    (["likelihood.block_choice=random"], "likelihood.block_choice"),
    (["likelihood.t_min=0.8", "likelihood.t_max=0.5"], "likelihood.t_max"),
    (["likelihood.num_samples=0"], "likelihood.num_samples"),
    (["likelihood.block_length=0"], "likelihood.block_length"),
])
def test_config_errors_name_the_key(tmp_path, overrides, key):
    with pytest.raises(ConfigError) as err:
        build(compose_cfg(["objective=spg", *overrides], tmp_path))
    assert err.value.key == key


@pytest.mark.parametrize("weight", [0.0, 1.0])
def test_the_mix_weight_takes_both_ends(weight):
    """w = 0 is the ELBO and w = 1 the EUBO alone: both are in [0, 1]."""
    SPGConfig(mix_weight=weight).validate()
    with pytest.raises(ConfigError):
        SPGConfig(mix_weight=weight + (0.01 if weight else -0.01)).validate()


def test_spg_on_the_projects_elbo(tmp_path):
    """likelihood=elbo (mean weighting, uniform t) gives the same objective on other masks."""
    c, ro = spg_setup(tmp_path)
    net = c.bundle.net
    est = ELBOEstimator(ELBOConfig(weighting="mean"), c.bundle.mask_token_id)
    loss, m = SPG(SPGConfig(beta=0.0), est).loss(StepContext(ro, 0, 3, logits_fn(net), logits_fn(net), None))
    assert torch.isfinite(loss) and m["ratio/log_max"].item() == 0.0
