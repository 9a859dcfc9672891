"""wd1 (rl/objectives/wd1.py): parity with a transcription of the public loss, the group softmax weights,
invariants and configs.

The reference below is written from xiaohangt/wd1 @ 0898985, ``wd1/trainers/rev_grpo_trainer.py``
``compute_loss`` and ``_get_per_token_logps`` (and ``rev_grpo_trainer_psr.py`` for the positive-only
variant), in its operations and order, and imports nothing from the project's implementation. Its
softmax spans the micro-batch it is given; the public scripts give it one group.
"""

import copy
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import StepContext
from diffusion_rl.rl.objectives.wd1 import WD1, WD1Config, group_softmax_weights, wd1_loss
from diffusion_rl.rl.rollout import RolloutEngine
from diffusion_rl.sampling.sampler import completion_mask
from tests.helpers.common import compose_cfg
from tests.helpers.random_model import unit_inputs

# ---------------------------------------------------------------- the public code, transcribed


def public_per_token_logps(logits, input_ids, logits_to_keep):
    """wd1's _get_per_token_logps after the forward (num_iterations = 1): logits (b, l, V). -> (1, b, L)"""
    batch_size = input_ids.shape[0]
    completion_logits = logits[:, -logits_to_keep:, :]
    completion_targets = input_ids[:, -logits_to_keep:]
    flat_logits = completion_logits.reshape(-1, completion_logits.size(-1))
    flat_targets = completion_targets.reshape(-1)
    loss = F.cross_entropy(flat_logits, flat_targets, reduction="none")
    completion_log_probs = -loss.view(batch_size, logits_to_keep)
    return completion_log_probs.view(1, batch_size, logits_to_keep).to(torch.float32)


def public_loss(per_token_logps, completion_mask, advantages, negative=True):
    """wd1's compute_loss on one micro-batch (rev_grpo_trainer.py; negative=False: rev_grpo_trainer_psr.py)."""
    is_weights = torch.softmax(advantages, dim=0)
    ce_loss = -((per_token_logps[0] * completion_mask).sum(-1) * is_weights).sum()
    if not negative:
        return ce_loss
    n_is_weights = torch.softmax(-advantages, dim=0)
    min_likeli_loss = ((per_token_logps[0] * completion_mask).sum(-1) * n_is_weights).sum()
    return ce_loss + min_likeli_loss


def public_over_groups(per_token_logps, completion_mask, advantages, G, negative=True):
    """The public runs: one group per micro-batch, gradients averaged over devices and accumulation steps."""
    losses = [public_loss(per_token_logps[:, g:g + G], completion_mask[g:g + G], advantages[g:g + G], negative)
              for g in range(0, advantages.shape[0], G)]
    return torch.stack(losses).mean()


# ---------------------------------------------------------------- parity


@pytest.mark.parametrize("negative", [True, False], ids=["wd1", "positive-only"])
def test_loss_parity_on_random_tensors(negative):
    g = torch.Generator().manual_seed(0)
    G, B, P, L, V = 6, 18, 4, 10, 9
    for _ in range(4):
        logits = (torch.randn(B, P + L, V, generator=g) * 2).requires_grad_(True)
        ids = torch.randint(0, V, (B, P + L), generator=g)
        lengths = torch.randint(1, L + 1, (B,), generator=g)
        cmask = (torch.arange(L)[None] < lengths[:, None]).long()
        adv = torch.randn(B, generator=g)
        ref = public_over_groups(public_per_token_logps(logits, ids, L), cmask, adv, G, negative)
        g_ref, = torch.autograd.grad(ref, logits)
        logp = logits[:, P:].float().log_softmax(-1).gather(-1, ids[:, P:, None]).squeeze(-1)  # (B, L)
        ours, _ = wd1_loss(logp, None, adv[:, None], cmask, WD1Config(negative_term=negative), group_size=G)
        g_ours, = torch.autograd.grad(ours, logits)
        assert ours.item() == pytest.approx(ref.item(), abs=1e-6)
        assert torch.allclose(g_ours, g_ref, atol=1e-6)


def wd1_setup(tmp_path, extra=()):
    """The objective built from the configs, and a rollout of the (untrained) tiny model with
    advantages of both signs and completions of different lengths."""
    torch.manual_seed(0)  # the model's initialisation
    # the public code knows no pinned tokens (the completion is all decisions) and samples in low-confidence order
    c = build(compose_cfg(["objective=wd1", "objective.beta=0", "task.pin_givens=false", "sampler.remasking=low_confidence",
                          *extra], tmp_path))
    engine = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=3)
    ro = engine(c.task.splits.train[:2], c.bundle.net, 0)
    comp = ro.completion_ids.clone()
    comp[1, 5] = comp[6, 11] = c.bundle.eos_token_id  # Sudoku answers fill all 16 positions
    adv = torch.tensor([0.5, -0.25, 0.0, -0.25, 1.0, -1.0, 0.25, -0.25])
    return c, replace(ro, advantages=adv, completion_ids=comp, completion_mask=completion_mask(comp, c.bundle.eos_token_id))


@pytest.mark.parametrize("negative", [True, False], ids=["wd1", "positive-only"])
def test_loss_parity_on_real_rollouts(tmp_path, negative):
    """The objective's loss on a tiny model's rollout equals the transcription fed the same noisy
    inputs (d1's one-step masks), one group per micro-batch; gradients too."""
    c, ro = wd1_setup(tmp_path, [f"objective.negative_term={str(negative).lower()}"])
    net = c.bundle.net.eval()
    seen = []

    def forward(ids, attn):
        seen.append((ids, attn))
        return logits_fn(net)(ids, attn)

    loss, _ = c.objective.loss(StepContext(ro, 2, 3, forward, logits_fn(net), None))
    params = list(net.parameters())
    g_ours = torch.autograd.grad(loss, params, allow_unused=True)
    ids, attn = seen[-1]  # the policy's forward: prompt masked at 0.15, completion fully masked
    P, L = ro.prompt_ids.shape[1], ro.completion_ids.shape[1]
    assert bool((ids[:, P:] == c.bundle.mask_token_id).all()) and bool((ids[:, :P] == c.bundle.mask_token_id).any())
    batch = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    ref = public_over_groups(public_per_token_logps(logits_fn(net)(ids, attn), batch, L), ro.completion_mask,
                             ro.advantages, ro.group_size, negative)
    g_ref = torch.autograd.grad(ref, params, allow_unused=True)
    assert ro.completion_mask.sum(-1).min() < ro.completion_mask.sum(-1).max()
    # relative: each S_i sums ~16 log-probs of ~-4.6, so fp32 rounding alone is ~1e-6 in absolute terms
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6, abs=1e-6)
    for a, b in zip(g_ours, g_ref):
        assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, rtol=1e-5, atol=1e-6))


def test_the_public_softmax_over_two_groups_differs():
    """The quirk we fix: a micro-batch of two groups normalises across them in the public code."""
    logp = -torch.rand(8, 5)
    mask = torch.ones(8, 5)
    adv = torch.tensor([1.0, 0.0, 0.0, -1.0, 0.2, 0.1, -0.1, -0.2])
    ours, _ = wd1_loss(logp, None, adv[:, None], mask, WD1Config(), group_size=4)
    across = public_loss(logp[None], mask, adv) / 2  # one softmax over both groups
    per_group = public_over_groups(logp[None], mask, adv, 4)
    assert ours.item() == pytest.approx(per_group.item(), abs=1e-6)
    assert ours.item() != pytest.approx(across.item(), abs=1e-3)


# ---------------------------------------------------------------- invariants


def test_weights_sum_to_one_per_group_and_respect_group_boundaries():
    torch.manual_seed(0)
    adv = torch.randn(24)
    w_pos, w_neg = group_softmax_weights(adv, 6)
    assert w_pos.shape == (4, 6)
    assert torch.allclose(w_pos.sum(-1), torch.ones(4)) and torch.allclose(w_neg.sum(-1), torch.ones(4))
    changed = adv.clone()
    changed[6:12] += torch.randn(6)  # only group 1
    w2, _ = group_softmax_weights(changed, 6)
    assert torch.equal(w2[0], w_pos[0]) and torch.equal(w2[2:], w_pos[2:]) and not torch.allclose(w2[1], w_pos[1])
    shifted, _ = group_softmax_weights(adv + 3.0, 6)  # a group-wide shift changes nothing
    assert torch.allclose(shifted, w_pos, atol=1e-6)
    # better samples weigh more in w+, less in w-
    a = adv.view(4, 6)
    order = a.argsort(-1)
    assert bool((w_pos.gather(-1, order).diff(dim=-1) >= 0).all()) and bool((w_neg.gather(-1, order).diff(dim=-1) <= 0).all())


def test_gradient_equals_the_formula():
    """d loss = mean over groups of sum_i (w-_i - w+_i) d S_i, S_i the sum of the row's token log-probs."""
    torch.manual_seed(1)
    B, L, D, G = 12, 5, 4, 4
    feats = torch.randn(B, L, D)
    theta = torch.randn(D, requires_grad=True)
    mask = (torch.arange(L)[None] < torch.randint(1, L + 1, (B, 1))).float()
    adv = torch.randn(B)
    logp = feats @ theta  # (B, L)
    loss, _ = wd1_loss(logp, None, adv[:, None], mask, WD1Config(), group_size=G)
    loss.backward()
    w_pos, w_neg = group_softmax_weights(adv, G)
    dS = (feats * mask[..., None]).sum(1)  # (B, D)
    expected = ((w_neg - w_pos).reshape(-1)[:, None] * dS).sum(0) / (B // G)
    assert torch.allclose(theta.grad, expected, atol=1e-6)


def test_zero_advantages_give_zero_loss_and_gradient(tmp_path):
    c, ro = wd1_setup(tmp_path)
    ro = replace(ro, advantages=torch.zeros_like(ro.advantages))
    net = c.bundle.net
    loss, m = c.objective.loss(StepContext(ro, 0, 3, logits_fn(net), logits_fn(net), None))
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in net.parameters())
    assert m["weights/ess"].item() == pytest.approx(ro.group_size)  # uniform weights


def test_theta_equals_old_logs_ratio_one_and_nothing_clipped(tmp_path):
    c, ro = wd1_setup(tmp_path)
    net = c.bundle.net.eval()
    old = copy.deepcopy(net).requires_grad_(False)
    for it in range(2):
        _, m = c.objective.loss(StepContext(ro, it, 3, logits_fn(net), logits_fn(old), None))
        assert m["ratio/log_min"].item() == 0.0 and m["ratio/log_max"].item() == 0.0
        assert m["ratio/clip_frac_low"].item() == 0.0 and m["ratio/clip_frac_high"].item() == 0.0


def test_all_masked_rows_and_extreme_advantages_stay_finite():
    logp = torch.full((4, 6), -40.0, requires_grad=True)
    mask = torch.tensor([[0] * 6, [1] * 6, [1, 0, 0, 0, 0, 0], [1] * 6]).float()
    adv = torch.tensor([1e4, -1e4, 0.0, 50.0])
    loss, m = wd1_loss(logp, None, adv[:, None], mask, WD1Config(), group_size=4)
    loss.backward()
    assert torch.isfinite(loss) and bool(torch.isfinite(logp.grad).all())
    assert all(bool(torch.isfinite(v)) for v in m.values())
    assert logp.grad[0].abs().sum() == 0  # nothing of the empty row is scored


def test_positive_only_drops_the_unlearning_term(tmp_path):
    c, ro = wd1_setup(tmp_path)
    net = c.bundle.net
    ctx = StepContext(ro, 0, 3, logits_fn(net), logits_fn(net), None)
    both, _ = WD1(WD1Config(beta=0.0), c.objective.likelihood).loss(ctx)
    pos, _ = WD1(WD1Config(beta=0.0, negative_term=False), c.objective.likelihood).loss(ctx)
    seq = (c.objective.logp_units(ctx, logits_fn(net), "policy").logp * ro.scored_mask).sum(-1).view(-1, ro.group_size)
    w_pos, w_neg = group_softmax_weights(ro.advantages, ro.group_size)
    assert pos.item() == pytest.approx(-(w_pos * seq).sum(-1).mean().item(), rel=1e-6)
    assert both.item() == pytest.approx(((w_neg - w_pos) * seq).sum(-1).mean().item(), rel=1e-5, abs=1e-6)


def test_weight_metrics_by_hand():
    """Group 0 has A = (0, ln 3): w+ = (1/4, 3/4), ESS = 1 / (1/16 + 9/16) = 1.6; group 1 is flat: w+ =
    (1/2, 1/2), ESS = 2. The metrics: the mean ESS over groups, 1.8, and the largest weight, 3/4."""
    adv = torch.tensor([0.0, math.log(3.0), 0.7, 0.7])
    _, m = wd1_loss(-torch.rand(4, 3), None, adv[:, None], torch.ones(4, 3), WD1Config(), group_size=2)
    assert m["weights/ess"].item() == pytest.approx(1.8, abs=1e-6)
    assert m["weights/max"].item() == pytest.approx(0.75, abs=1e-6)


def test_sums_run_in_float32_as_the_public_code():
    """The public code casts its per-token log-probs to float32 (``.to(torch.float32)``) before the
    weighted sums: float64 log-probs give the float32 loss of their float32 values."""
    g = torch.Generator().manual_seed(2)
    logp = -torch.rand(6, 7, generator=g, dtype=torch.float64) * 5
    mask = (torch.arange(7)[None] < torch.tensor([7, 3, 1, 5, 7, 2])[:, None]).long()
    adv = torch.randn(6, generator=g)
    ours, _ = wd1_loss(logp, None, adv[:, None], mask, WD1Config(), group_size=3)
    ref = public_over_groups(logp.float()[None], mask, adv, 3)
    assert ours.dtype == torch.float32
    assert ours.item() == pytest.approx(ref.item(), abs=1e-5)


def test_per_token_advantages_are_refused_in_wd1s_name():
    """wd1 weighs whole samples: (B, L) advantages are refused, and the error says which objective refused."""
    with pytest.raises(ValueError, match=r"^wd1\b"):
        wd1_loss(-torch.rand(4, 3), None, torch.randn(4, 3), torch.ones(4, 3), WD1Config(), group_size=2)


def test_the_old_policy_keeps_the_first_iterations_masks(tmp_path):
    """With share_masks_with_old=false the policy draws fresh prompt masks at each update and the old
    policy is scored on the first iteration's masks: its inputs at iteration 2 are those of iteration 0."""
    c, ro = wd1_setup(tmp_path, ["objective.share_masks_with_old=false"])
    inputs = unit_inputs(c.objective, ro, c.bundle.net)
    old0, old2, new2 = inputs(0, "old"), inputs(2, "old"), inputs(2, "policy")
    P = ro.prompt_ids.shape[1]
    assert torch.equal(old2, old0)
    assert not torch.equal(new2[:, :P], old2[:, :P])  # the policy's prompt masks are its own


def test_ratio_diagnostic_off_spends_no_forward_on_the_old_policy(tmp_path):
    from diffusion_rl.training.module import DiffusionRLModule

    c, ro = wd1_setup(tmp_path, ["objective.ratio_diagnostic=false"])

    def no_old(*args, **kwargs):
        raise AssertionError("the old policy was scored")

    loss, m = c.objective.loss(StepContext(ro, 1, 3, logits_fn(c.bundle.net), no_old, None))
    assert torch.isfinite(loss) and not any(k.startswith("ratio/") for k in m)
    module = DiffusionRLModule(c.bundle, c.task, c.objective, c.advantage, c.sampler, c.optim, 0)
    assert module.old_policy is None


def test_the_kl_anchor_leaves_out_pinned_tokens(tmp_path):
    """Sudoku's givens are pinned: shown to the model, never its decisions, so neither the weighted
    likelihood nor the KL anchor reads their log-probs (the model's outputs at visible positions)."""
    c = build(compose_cfg(["objective=wd1"], tmp_path))
    ro = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=1)(c.task.splits.train[:2], c.bundle.net, 0)
    assert ro.pinned is not None and bool(ro.pinned.any())
    f = logits_fn(c.bundle.net)
    s = c.objective.logp_units(StepContext(ro, 0, 3, f, f, None), f, "policy")
    assert not bool(s.mask.bool()[ro.pinned].any()) and not bool(s.kl_mask.bool()[ro.pinned].any())
    assert torch.equal(s.kl_mask.bool(), ro.completion_mask.bool() & ~ro.pinned)


# ---------------------------------------------------------------- configs


def test_config_selects_one_step_and_unscaled_advantages(tmp_path):
    cfg = compose_cfg(["objective=wd1"], tmp_path)
    assert cfg.likelihood.name == "one_step" and cfg.likelihood.p_mask_prompt == 0.15
    assert cfg.advantage.name == "group"
    c = build(cfg)
    assert isinstance(c.objective, WD1) and c.objective.cfg.mu == 1  # the CPU job's (the dataclass: 8)
    assert WD1Config().mu == 8


@pytest.mark.parametrize("overrides,key", [
    (["likelihood=elbo"], "likelihood.name"),
    (["objective.behaviour_correction=tis"], "objective.behaviour_correction"),
    (["advantage=per_token"], "advantage.credit"),
    (["objective.mu=0"], "objective.mu"),
])
def test_config_errors_name_the_key(tmp_path, overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build(compose_cfg(["objective=wd1", *overrides], tmp_path))
