"""ESPO: parity with a transcription of ESPO's loss (ML-GSAI/ESPO @ b5f2dac, ``espo/espo_trainer.py``)
on random tensors and on a tiny model's rollouts, invariants, configs. Its stratified ELBO estimator is
tested in tests/unit/likelihood/test_stratified.py."""

from dataclasses import replace

import pytest
import torch

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import mask_seeds
from diffusion_rl.likelihood.stratified import (
    StratifiedConfig,
    StratifiedEstimator,
)
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import LogpUnits, StepContext
from diffusion_rl.rl.objectives.espo import ESPO, ESPOConfig, espo_kl, espo_loss
from diffusion_rl.rl.rollout import RolloutEngine
from tests.helpers.common import compose_cfg, rollout_of
from tests.helpers.random_model import MASK, ContextModel, input_spy, random_batch, unit_inputs
from tests.unit.likelihood.test_stratified import drawn_inputs, ref_get_elbo_mc
from tests.unit.rl.test_coupled_grpo import perturbed

# ---------------------------------------------------------------- the transcription (reference)
# ESPO's compute_loss written out afresh (its forward_process and _get_elbo are transcribed beside the
# estimator's tests: tests/unit/likelihood/test_stratified.py).


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


# ---------------------------------------------------------------- parity


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
    ours = pg + cfg.beta * obj.kl_term(LogpUnits(terms, mask), LogpUnits(ref, mask), lambda x: x, 3)
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
    _, m = espo_loss(terms, old, adv, torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 1]]), cfg, group_size=2)
    assert m["ratio/log_max"].item() == pytest.approx(0.4)  # a one-position sequence: its whole gap


def test_elbo_per_token_metric_by_hand():
    """The mean over sequences of ELBO_b / n_b: (-1 - 2) / 2 and -4 / 4 -> (-1.5 - 1) / 2 = -1.25."""
    terms = torch.tensor([[-1.0, -2.0, -9.0, -9.0], [-1.0, -1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    _, m = espo_loss(terms, terms, torch.ones(2, 1), mask, ESPOConfig(), group_size=2)
    assert m["espo/elbo_per_token"].item() == pytest.approx(-1.25)


def test_kl_over_a_single_covered_position():
    """One covered position in the batch: the KL is 1/2 of its squared gap, 1/2 * 0.6^2 = 0.18."""
    terms = torch.tensor([[-1.0, -2.0, -3.0]])
    ref = torch.tensor([[-5.0, -2.6, -7.0]])
    assert espo_kl(terms, ref, torch.tensor([[0, 1, 0]])).item() == pytest.approx(0.18)


def test_pinned_tokens_are_shown_in_every_forward_and_not_covered(tmp_path):
    """Sudoku's givens are pinned: each forward of ESPO's estimator shows them as they are (context,
    never masked) and the ELBO covers every other generated position."""
    c = build(compose_cfg(["objective=espo"], tmp_path))
    ro = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=1)(c.task.splits.train[:2],
                                                                                     c.bundle.net, 0)
    assert ro.pinned is not None and bool(ro.pinned.any())
    fwd, seen = input_spy(logits_fn(c.bundle.net))
    s = c.objective.logp_units(StepContext(ro, 0, 3, fwd, fwd, None), fwd, "policy")
    assert torch.equal(s.mask.bool(), ~ro.pinned)
    B, L = ro.completion_ids.shape
    for ids, _ in seen:
        shown, pinned = ids[:, -L:], ro.pinned.repeat(ids.shape[0] // B, 1)
        assert torch.equal(shown[pinned], ro.completion_ids.repeat(ids.shape[0] // B, 1)[pinned])


def test_the_old_policy_keeps_the_first_iterations_masks(real):
    """With share_masks_with_old=false the policy draws fresh masks at each update and the old policy
    is scored on the first iteration's masks: its inputs at iteration 2 are those of iteration 0."""
    c, ro = real
    inputs = unit_inputs(ESPO(ESPOConfig(share_masks_with_old=False), c.objective.likelihood), ro, c.bundle.net)
    old0, old2, new2 = inputs(0, "old"), inputs(2, "old"), inputs(2, "policy")
    assert torch.equal(old2, old0) and not torch.equal(new2, old2)


def test_elbo_tokens_all_covers_the_padding_and_completion_does_not(real):
    c, ro = real
    cmask = ro.completion_mask.clone()
    cmask[0, 6:] = 0  # as if row 0 had ended early
    ro = replace(ro, completion_mask=cmask)
    f = logits_fn(c.bundle.net)
    for tokens, covered in (("all", torch.ones_like(cmask)), ("completion", cmask)):
        obj = ESPO(ESPOConfig(elbo_tokens=tokens), c.objective.likelihood)
        s = obj.logp_units(StepContext(ro, 0, 3, f, f, None), f, "policy")
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
    (["objective.eps_high=0"], "objective.eps_high"),
    (["likelihood.num_samples=0"], "likelihood.num_samples"),
    (["advantage=per_token"], "advantage.credit"),
])
def test_nonsense_fails_in_one_line(tmp_path, overrides, key):
    with pytest.raises(ConfigError) as err:
        build(compose_cfg(["objective=espo", *overrides], tmp_path))
    assert err.value.key == key and "\n" not in str(err.value)


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
