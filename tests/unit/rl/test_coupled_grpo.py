"""Coupled-GRPO: parity with a transcription of DiffuCoder's loss (apple/ml-diffucoder @ f735e01,
``src/open_r1/coupled_grpo.py``) on random tensors and on a tiny model's rollouts, hand-checked
invariants, configs. Its complementary-mask estimator is tested in tests/unit/likelihood/test_complementary.py."""

import copy
from dataclasses import replace

import pytest
import torch

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.complementary import (
    ComplementaryConfig,
    ComplementaryEstimator,
)
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import LogpUnits, StepContext
from diffusion_rl.rl.objectives.coupled_grpo import (
    CoupledGRPO,
    CoupledGRPOConfig,
    coupled_grpo_loss,
)
from diffusion_rl.rl.rollout import RolloutEngine
from tests.helpers.common import compose_cfg, rollout_of
from tests.helpers.random_model import MASK, ContextModel, random_batch
from tests.unit.likelihood.test_complementary import drawn_inputs, ref_per_token_logps

# ---------------------------------------------------------------- the transcription (reference)
# DiffuCoder's compute_loss written out afresh, shapes as there (its forward_process and per-token
# log-probs are transcribed beside the estimator's tests: tests/unit/likelihood/test_complementary.py).


def ref_compute_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, completion_mask,
                     beta, epsilon_low, epsilon_high):
    per_token_logps = per_token_logps.unsqueeze(1)  # (B, 1, L): the iteration axis of the public code
    old = old_per_token_logps.unsqueeze(1)
    ref = ref_per_token_logps.unsqueeze(1)
    per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
    coef_1 = torch.exp(per_token_logps - old)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss1 = coef_1 * advantages.view(-1, 1, 1)
    per_token_loss2 = coef_2 * advantages.view(-1, 1, 1)
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
    per_token_loss = per_token_loss + beta * per_token_kl
    return (per_token_loss[:, 0, :] * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)


# ---------------------------------------------------------------- parity


def test_loss_matches_the_transcription_on_random_tensors():
    g = torch.Generator().manual_seed(1)
    B, L = 6, 9
    logp = (torch.randn(B, L, generator=g) - 2).requires_grad_(True)
    old = logp.detach() + 0.6 * torch.randn(B, L, generator=g)  # ratios well outside [0.5, 1.5] too
    ref = logp.detach() + 0.3 * torch.randn(B, L, generator=g)
    adv = torch.randn(B, generator=g)
    mask = (torch.rand(B, L, generator=g) > 0.2).float()
    cfg = CoupledGRPOConfig()
    obj = CoupledGRPO(cfg, ComplementaryEstimator(ComplementaryConfig(), MASK))
    pg, m = coupled_grpo_loss(logp, old, adv[:, None], mask, cfg, group_size=3)
    kl = obj.kl_term(LogpUnits(logp, mask, kl_logp=logp, kl_mask=mask), LogpUnits(ref, mask), lambda x: x, 3)
    ours = pg + cfg.beta * kl
    expected = ref_compute_loss(logp, old, ref, adv, mask, cfg.beta, cfg.eps, cfg.eps_high)
    assert ours.item() == pytest.approx(expected.item(), abs=1e-6)
    assert m["ratio/clip_frac_low"] + m["ratio/clip_frac_high"] > 0  # the clip was exercised
    (ga,) = torch.autograd.grad(ours, logp)
    (gb,) = torch.autograd.grad(expected, logp)
    assert torch.allclose(ga, gb, atol=1e-7)


def perturbed(net, scale, seed):
    out = copy.deepcopy(net).requires_grad_(False).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A tiny model's rollout under coupled_grpo's config, with old and reference policies apart."""
    c = build(compose_cfg(["objective=coupled_grpo", "task.pin_givens=false"], tmp_path_factory.mktemp("cgrpo")))
    # the public code knows no pinned tokens: the completion is all decisions, as there
    eng = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=3)
    ro = eng(c.task.splits.train[:2], c.bundle.net, 0)
    cmask = ro.completion_mask.clone()
    cmask[0, 5:] = 0  # rows of different lengths, as if they had ended early: token-mean != sequence mean
    cmask[2, 9:] = 0
    ro = replace(ro, advantages=torch.linspace(-1.5, 1.5, ro.advantages.shape[0]), completion_mask=cmask)
    return c, ro


def test_objective_matches_the_transcription_on_a_tiny_models_rollout(real):
    c, ro = real
    net = c.bundle.net.train()
    old, ref = perturbed(net, 0.05, 1), perturbed(net, 0.03, 2)
    obj = c.objective
    assert isinstance(obj, CoupledGRPO) and c.advantage.cfg.name == "loo"
    for it in range(obj.cfg.mu):
        ctx = StepContext(ro, it, 3, logits_fn(net), logits_fn(old), logits_fn(ref))
        ours, m = obj.loss(ctx)
        g_ours = torch.autograd.grad(ours, list(net.parameters()))
        # the transcription, fed our masks (one t per batch) and the same forwards
        ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
        attn = torch.cat([ro.prompt_mask, torch.ones_like(ro.completion_ids)], 1)
        L = ro.completion_ids.shape[1]
        t, rm = drawn_inputs(obj.likelihood, obj.mask_seeds(ctx, "policy"), ro.prompt_mask, L)

        def lp(f, ids=ids, attn=attn, t=t, rm=rm, L=L):
            return ref_per_token_logps(lambda x: f(x, attn.repeat(3, 1)), ids, L, t, rm, c.bundle.mask_token_id)

        with torch.no_grad():
            old_lp, ref_lp = lp(logits_fn(old)), lp(logits_fn(ref))
        expected = ref_compute_loss(lp(logits_fn(net)), old_lp, ref_lp, ro.advantages, ro.completion_mask.float(),
                                    obj.cfg.beta, obj.cfg.eps, obj.cfg.eps_high)
        g_ref = torch.autograd.grad(expected, list(net.parameters()))
        assert ours.item() == pytest.approx(expected.item(), abs=1e-6), it
        assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(g_ours, g_ref)), it
        assert m["train/kl"].item() > 0 and m["ratio/log_std"].item() > 0


# ---------------------------------------------------------------- the objective's invariants


def test_ratio_one_clips_nothing_and_zero_advantages_give_no_gradient(real):
    c, ro = real
    net = c.bundle.net.train()
    obj = CoupledGRPO(CoupledGRPOConfig(beta=0.0), c.objective.likelihood)
    f = logits_fn(net)
    loss, m = obj.loss(StepContext(ro, 1, 3, f, f, None))
    assert m["ratio/log_min"].item() == 0 and m["ratio/log_max"].item() == 0  # shared masks: exactly 1
    assert m["ratio/clip_frac_low"].item() == 0 and m["ratio/clip_frac_high"].item() == 0
    mask = ro.completion_mask.float()
    token_mean_adv = (ro.advantages[:, None] * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(-token_mean_adv.item(), abs=1e-6)  # every token weighs the same
    zero = replace(ro, advantages=torch.zeros_like(ro.advantages))
    loss, _ = obj.loss(StepContext(zero, 0, 3, f, logits_fn(perturbed(net, 0.05, 4)), None))
    grads = torch.autograd.grad(loss, [p for p in net.parameters() if p.requires_grad], allow_unused=True)
    assert all(g is None or float(g.abs().max()) == 0.0 for g in grads)


def test_token_mean_differs_from_grpos_sequence_mean():
    logp = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 0, 0, 0]])
    adv = torch.tensor([[1.0], [-1.0]])
    loss, _ = coupled_grpo_loss(logp, logp.detach(), adv, mask, CoupledGRPOConfig(), group_size=2)
    assert loss.item() == pytest.approx(-(4 * 1 - 1) / 5)  # GRPO's per-sequence mean would give 0


def test_all_masked_is_finite():
    logp = torch.randn(3, 5, requires_grad=True)
    loss, m = coupled_grpo_loss(logp, logp.detach() + 1, torch.ones(3, 1), torch.zeros(3, 5), CoupledGRPOConfig(),
                                group_size=3)
    loss.backward()
    assert loss.item() == 0 and bool(torch.isfinite(logp.grad).all())
    assert all(bool(torch.isfinite(v)) for v in m.values())


# ---------------------------------------------------------------- configs


def test_config_selects_its_estimator_and_loo_and_the_command_line_wins(tmp_path):
    cfg = compose_cfg(["objective=coupled_grpo"], tmp_path)
    assert (cfg.likelihood.name, cfg.advantage.name, cfg.objective.mu, cfg.objective.beta) == ("complementary", "loo", 2, 0.01)
    assert cfg.objective.eps == 0.5 and cfg.objective.eps_high == 0.5
    c = build(compose_cfg(["objective=coupled_grpo", "likelihood=one_step", "advantage=group"], tmp_path))
    assert c.objective.likelihood.cfg.name == "one_step" and c.advantage.cfg.name == "group"
    assert compose_cfg(["objective=grpo", "likelihood=complementary"], tmp_path).likelihood.t_min == 0.2


@pytest.mark.parametrize("overrides,key", [
    (["likelihood=elbo"], "likelihood.name"),  # a sequence-level estimator
    (["likelihood.t_min=0"], "likelihood.t_min"),
    (["likelihood.t_max=1.0"], "likelihood.t_max"),
    (["likelihood.t_min=0.6", "likelihood.t_max=0.4"], "likelihood.t_max"),
    (["likelihood.t_per=row"], "likelihood.t_per"),
    (["objective.eps=1.5"], "objective.eps"),
])
def test_nonsense_fails_in_one_line(tmp_path, overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        build(compose_cfg(["objective=coupled_grpo", *overrides], tmp_path))
    assert "\n" not in str(err.value)


def test_grpo_can_use_the_complementary_estimator(real):
    """The estimator is per token and registered: d1's GRPO runs on it unchanged."""
    from diffusion_rl.rl.objectives.grpo import GRPO, GRPOConfig

    c, ro = real
    f = logits_fn(c.bundle.net)
    loss, m = GRPO(GRPOConfig(beta=0.0), c.objective.likelihood).loss(StepContext(ro, 0, 3, f, f, None))
    assert torch.isfinite(loss) and m["ratio/log_max"].item() == 0


def test_rollout_of_hand_made_tensors_runs():
    prompt, pmask, comp, cmask = random_batch(B=4)
    ro = rollout_of(prompt, pmask, comp, cmask, torch.arange(4.0), torch.tensor([1.0, -1.0, 0.5, -0.5]), 2)
    model = ContextModel(11)
    obj = CoupledGRPO(CoupledGRPOConfig(beta=0.0), ComplementaryEstimator(ComplementaryConfig(), MASK))
    loss, _ = obj.loss(StepContext(ro, 0, 0, model, perturbed(model, 0.1, 0), None))
    loss.backward()
    assert torch.isfinite(loss) and model.tok.grad.abs().sum() > 0
