"""Behaviour correction for approximate rollouts (rl/objectives/behaviour.py and the shared loss template):
TIS weights and mismatch metrics hand-checked. The sampler's log-probs in each estimator's units are
tested in tests/unit/likelihood/test_base.py."""

import math

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import LikelihoodConfig
from diffusion_rl.likelihood.elbo import ELBOConfig, ELBOEstimator
from diffusion_rl.likelihood.one_step import OneStepEstimator
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import StepContext
from diffusion_rl.rl.objectives.behaviour import behaviour_correction, mismatch_metrics, tis_weights
from diffusion_rl.rl.objectives.grpo import GRPO, GRPOConfig
from diffusion_rl.rl.objectives.stabledrl import StableDRL, StableDRLConfig
from tests.unit.rl.test_stabledrl import make_rollout


def test_tis_weights_hand_computed():
    mismatch = torch.tensor([[0.0, math.log(2.0)], [-math.log(3.0), 1.0]])  # log q - log pi_old
    w = tis_weights(mismatch, cap=2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 0.5], [2.0, math.exp(-1.0)]]))  # exp(-m), 3 capped at 2
    m = mismatch_metrics(mismatch, torch.tensor([[1.0, 1.0], [1.0, 0.0]]), w, 2.0)  # the last unit does not count
    vals = torch.tensor([0.0, math.log(2.0), -math.log(3.0)])
    assert m["rollout/mismatch_log_ratio"].item() == pytest.approx(vals.mean().item(), abs=1e-6)
    assert m["rollout/mismatch_log_ratio_std"].item() == pytest.approx(vals.std().item(), abs=1e-6)
    assert m["tis/weight_mean"].item() == pytest.approx((1.0 + 0.5 + 2.0) / 3, abs=1e-6)
    assert m["tis/clip_frac"].item() == pytest.approx(1 / 3)


def _ctx(bundle, ro):
    f = logits_fn(bundle.net)
    return StepContext(ro, 0, 3, f, f, None)


def test_tis_scales_each_units_advantage_in_the_shared_template(tiny_bundle):
    """GRPO (one-step, per-token units) at theta = theta_old: ratio 1, so the loss is
    -mean_b(sum_t A_b w_bt m_bt / sum_t m_bt) with w = min(pi_old / q, cap) per token."""
    ro = make_rollout(tiny_bundle)
    lik = OneStepEstimator(LikelihoodConfig(), tiny_bundle.mask_token_id)
    plain = GRPO(GRPOConfig(beta=0.0, agg="seq-mean-token-mean"), lik)
    old = plain.old_logp(_ctx(tiny_bundle, ro))  # (n, L) the estimator at theta_old
    shift = torch.linspace(-1.0, 1.5, old.numel()).view_as(old)
    ro.sampler_logp = old + shift  # a sampler that is off by a known amount per token
    loss_none, m_none = plain.loss(_ctx(tiny_bundle, ro))
    tis = GRPO(GRPOConfig(beta=0.0, agg="seq-mean-token-mean", behaviour_correction="tis", tis_cap=2.0), lik)
    loss_tis, m_tis = tis.loss(_ctx(tiny_bundle, ro))
    mask, adv = ro.completion_mask, ro.advantages[:, None]
    w = torch.exp(-shift).clamp(max=2.0)
    want = -((adv * w * mask).sum(-1) / mask.sum(-1)).mean()
    assert loss_tis.item() == pytest.approx(want.item(), abs=1e-5)
    assert loss_none.item() == pytest.approx(-adv.mean().item(), abs=1e-5)
    counted = shift[mask.bool()]
    for m in (m_none, m_tis):
        assert m["rollout/mismatch_log_ratio"].item() == pytest.approx(counted.mean().item(), abs=1e-4)
        assert m["rollout/mismatch_log_ratio_std"].item() == pytest.approx(counted.std().item(), abs=1e-4)
    assert "tis/weight_mean" in m_tis and "tis/weight_mean" not in m_none


def test_tis_in_stabledrl_weights_each_sequence(tiny_bundle):
    """StableDRL at theta = theta_old: self-normalised weights 1/G, so the loss is
    -mean_groups sum_j (1/G) A_j t_j ELBO_j with the TIS weight t_j of sequence j."""
    ro = make_rollout(tiny_bundle)
    est = ELBOEstimator(ELBOConfig(), tiny_bundle.mask_token_id)
    obj = StableDRL(StableDRLConfig(beta=0.0, share_masks_with_old=True, surrogate="elbo", behaviour_correction="tis",
                                    tis_cap=1.5), est)
    ctx = _ctx(tiny_bundle, ro)
    elbo = obj.old_logp(ctx)[:, 0]  # (n,)
    shift = torch.tensor([0.5, -0.2, -2.0, 0.0, 1.0, -0.1, 0.3, -0.5])
    # the sampler's per-token log-probs whose mean over the scored tokens (weighting=mean) is elbo + shift
    ro.sampler_logp = (elbo + shift)[:, None].expand_as(ro.completion_ids).clone()
    loss, m = obj.loss(ctx)
    t = torch.exp(-shift).clamp(max=1.5)
    G = ro.group_size
    want = -((ro.advantages * t * elbo).view(-1, G).sum(-1) / G).mean()
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    assert m["rollout/mismatch_log_ratio"].item() == pytest.approx(shift.mean().item(), abs=1e-5)
    assert m["tis/clip_frac"].item() == pytest.approx(2 / 8)  # exp(2.0) and exp(0.5) exceed 1.5


def test_tis_needs_the_samplers_log_probs_and_is_validated(tiny_bundle):
    ro = make_rollout(tiny_bundle)  # hand-made: no sampler log-probs
    lik = OneStepEstimator(LikelihoodConfig(), tiny_bundle.mask_token_id)
    _, m = GRPO(GRPOConfig(beta=0.0), lik).loss(_ctx(tiny_bundle, ro))
    assert "rollout/mismatch_log_ratio" not in m
    with pytest.raises(RuntimeError, match="behaviour_correction"):
        GRPO(GRPOConfig(beta=0.0, behaviour_correction="tis"), lik).loss(_ctx(tiny_bundle, ro))
    for kw, key in [({"behaviour_correction": "is"}, "objective.behaviour_correction"), ({"tis_cap": 0.5}, "objective.tis_cap")]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            GRPOConfig(**kw).validate()


# ---------------------------------------------------------------- behaviour_correction and its metrics, by hand


def test_one_counted_unit_has_its_own_mean_and_a_zero_std():
    mismatch = torch.tensor([[0.7, -1.0], [2.0, 3.0]])
    m = mismatch_metrics(mismatch, torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    assert m["rollout/mismatch_log_ratio"].item() == pytest.approx(0.7)  # the one unit that counts
    assert m["rollout/mismatch_log_ratio_std"].item() == 0.0  # one value: no spread (not torch's nan)
    assert set(m) == {"rollout/mismatch_log_ratio", "rollout/mismatch_log_ratio_std"}  # no weights: no TIS metrics


def test_two_counted_units_have_their_sample_std():
    m = mismatch_metrics(torch.tensor([[1.0, 3.0, 9.0]]), torch.tensor([[1.0, 1.0, 0.0]]))
    assert m["rollout/mismatch_log_ratio"].item() == pytest.approx(2.0)
    assert m["rollout/mismatch_log_ratio_std"].item() == pytest.approx(math.sqrt(2.0))  # ((1-2)^2+(3-2)^2)/(2-1)


def test_a_mask_broadcasts_over_the_units():
    """A per-row mask (N, 1) counts every unit of the rows it keeps."""
    m = mismatch_metrics(torch.tensor([[1.0, 2.0], [5.0, 7.0]]), torch.tensor([[1.0], [0.0]]),
                         torch.tensor([[1.0, 0.5], [3.0, 3.0]]), 2.0)
    assert m["rollout/mismatch_log_ratio"].item() == pytest.approx(1.5)
    assert m["tis/weight_mean"].item() == pytest.approx(0.75)
    assert m["tis/clip_frac"].item() == 0.0


def test_no_counted_unit_reads_zero_mismatch_and_weight_one():
    mismatch = torch.tensor([[0.5, -0.5]], dtype=torch.float64)
    m = mismatch_metrics(mismatch, torch.zeros(1, 2), torch.tensor([[3.0, 3.0]]), 2.0)
    assert m["rollout/mismatch_log_ratio"].item() == 0.0 and m["rollout/mismatch_log_ratio_std"].item() == 0.0
    assert m["rollout/mismatch_log_ratio"].dtype == torch.float32  # float32 as when units count
    assert m["tis/weight_mean"].item() == 1.0 and m["tis/clip_frac"].item() == 0.0  # not the uncounted 3s


def _units():
    adv = torch.tensor([[1.0, -2.0, 0.5], [-1.0, 4.0, 2.0]])
    old = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.2, -1.0]], dtype=torch.float64)
    shift = torch.tensor([[0.0, math.log(2.0), -math.log(4.0)], [1.0, -0.3, 5.0]])  # log q - log pi_old per unit
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return adv, old, old.float() + shift, shift, mask


def test_tis_multiplies_each_units_advantage_by_its_capped_weight():
    adv, old, q, shift, mask = _units()
    out, m = behaviour_correction(adv, old, q, mask, "tis", 3.0)
    w = [[1.0, 0.5, 3.0], [math.exp(-1.0), math.exp(0.3), math.exp(-5.0)]]  # min(pi_old / q, 3): 4 capped at 3
    assert torch.allclose(out, adv * torch.tensor(w), atol=1e-6)
    counted = shift[mask.bool()]
    assert m["rollout/mismatch_log_ratio"].item() == pytest.approx(counted.mean().item(), abs=1e-6)
    assert m["rollout/mismatch_log_ratio_std"].item() == pytest.approx(counted.std().item(), abs=1e-6)
    kept = torch.tensor([1.0, 0.5, 3.0, math.exp(-1.0), math.exp(0.3)])
    assert m["tis/weight_mean"].item() == pytest.approx(kept.mean().item(), abs=1e-6)
    assert m["tis/clip_frac"].item() == pytest.approx(1 / 5)  # the capped unit alone


def test_none_leaves_the_advantages_and_measures_the_mismatch():
    adv, old, q, shift, mask = _units()
    out, m = behaviour_correction(adv, old, q, mask, "none", 3.0)
    assert out is adv
    counted = shift[mask.bool()]
    assert set(m) == {"rollout/mismatch_log_ratio", "rollout/mismatch_log_ratio_std"}
    assert m["rollout/mismatch_log_ratio"].item() == pytest.approx(counted.mean().item(), abs=1e-6)
    assert m["rollout/mismatch_log_ratio_std"].item() == pytest.approx(counted.std().item(), abs=1e-6)


def test_the_samplers_log_probs_are_read_in_the_old_policys_dtype():
    """log q in float64, log pi_old in float32: q is rounded to float32 first (1 + 2^-30 is 1 there), so
    the mismatch is the difference of the two as the old policy's dtype holds them."""
    old = torch.ones(1, 2)
    q = torch.tensor([[1.0 + 2.0 ** -30, 1.0 + 2.0 ** -29]], dtype=torch.float64)
    _, m = behaviour_correction(torch.ones(1, 2), old, q, torch.ones(1, 2), "none", 2.0)
    expected = q.float() - old  # (0, 0): 1 + 2^-30 and 1 + 2^-29 both round to 1 in float32
    assert m["rollout/mismatch_log_ratio"].item() == expected.mean().item() == 0.0
    assert m["rollout/mismatch_log_ratio_std"].item() == 0.0


def test_without_old_or_sampler_values_none_passes_and_tis_refuses():
    adv, old, q, _, mask = _units()
    for o, s in [(None, q), (old, None), (None, None)]:
        out, m = behaviour_correction(adv, o, s, mask, "none", 2.0)
        assert out is adv and m == {}
        with pytest.raises(RuntimeError, match="behaviour_correction=tis"):
            behaviour_correction(adv, o, s, mask, "tis", 2.0)
