"""GRPO loss, the shared loss helpers and the advantage estimators on hand-computed tensors."""

import math

import pytest
import torch

from diffusion_rl.rl.objectives.base import agg_loss, kl_penalty
from diffusion_rl.rl.objectives.grpo import GRPOConfig, grpo_loss


def _grpo(logp, old, adv, mask, eps, eps_high):
    """grpo_loss with per-sample advantages (B,) as the objectives pass them, (B, 1)."""
    return grpo_loss(logp, old, adv[:, None], mask, GRPOConfig(eps=eps, eps_high=eps_high), group_size=1)


def test_grpo_loss_and_gradient_hand_computed():
    # one sequence of two tokens, A = 2; token ratios exp(0.1), exp(-0.2) inside [0.5, 1.5]
    logp = torch.tensor([[0.1, -0.2]], requires_grad=True)
    old = torch.zeros(1, 2)
    adv = torch.tensor([2.0])
    mask = torch.ones(1, 2)
    loss, metrics = _grpo(logp, old, adv, mask, 0.5, 0.5)
    expected = -(math.exp(0.1) * 2 + math.exp(-0.2) * 2) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # d/dlogp of -(rho * A)/2 = -rho * A / 2
    assert torch.allclose(logp.grad, torch.tensor([[-math.exp(0.1), -math.exp(-0.2)]]), atol=1e-6)
    assert metrics["ratio/clip_frac_low"].item() == 0 and metrics["ratio/clip_frac_high"].item() == 0


def test_grpo_clips_on_both_sides():
    # positive advantage and ratio above 1+eps_high: clipped, zero gradient
    logp = torch.tensor([[math.log(2.0)]], requires_grad=True)
    loss, m = _grpo(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), 0.2, 0.3)
    assert loss.item() == pytest.approx(-1.3)
    loss.backward()
    assert logp.grad.abs().item() == 0
    assert m["ratio/clip_frac_high"].item() == 1
    # negative advantage and ratio below 1-eps: clipped, zero gradient
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, m = _grpo(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), 0.2, 0.3)
    assert loss.item() == pytest.approx(0.8)
    loss.backward()
    assert logp.grad.abs().item() == 0
    assert m["ratio/clip_frac_low"].item() == 1
    # negative advantage and ratio above 1+eps_high: NOT clipped (conditional clipping)
    logp = torch.tensor([[math.log(2.0)]], requires_grad=True)
    loss, _ = _grpo(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), 0.2, 0.3)
    assert loss.item() == pytest.approx(2.0)
    loss.backward()
    assert logp.grad.item() == pytest.approx(2.0)


def test_grpo_ratio_one_means_nothing_clipped_and_mask_respected():
    logp = torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float)
    adv = torch.tensor([1.0, -1.0, 0.5])
    loss, m = _grpo(logp, logp.clone(), adv, mask, 0.2, 0.2)
    assert loss.item() == pytest.approx(-adv.mean().item())  # ratio 1 everywhere
    assert m["ratio/clip_frac_low"].item() == 0 and m["ratio/clip_frac_high"].item() == 0
    # changing masked-out tokens changes nothing
    logp2 = logp.clone()
    logp2[0, 3:] += 5
    loss2, _ = _grpo(logp2, logp, adv, mask, 0.2, 0.2)
    assert loss2.item() == pytest.approx(loss.item())


def test_grpo_all_masked_is_finite_and_sequence_level():
    loss, _ = _grpo(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3), 0.2, 0.2)
    assert torch.isfinite(loss)
    seq = torch.tensor([[0.3], [-0.1]], requires_grad=True)  # one unit per sequence
    loss, _ = _grpo(seq, torch.zeros(2, 1), torch.tensor([1.0, 1.0]), torch.ones(2, 1), 0.5, 0.5)
    assert loss.item() == pytest.approx(-(math.exp(0.3) + math.exp(-0.1)) / 2)


def test_kl_penalty_properties_hand_computed():
    x = torch.randn(100)
    assert torch.all(kl_penalty(x, x) == 0)
    assert torch.all(kl_penalty(x, x + torch.randn(100)) >= 0)
    logp = torch.tensor([[0.0]], requires_grad=True)
    kl = kl_penalty(logp, torch.tensor([[1.0]]))
    assert kl.item() == pytest.approx(math.e - 2)  # exp(1) - 1 - 1
    kl.sum().backward()
    assert logp.grad.item() == pytest.approx(1 - math.e)  # d/dx [exp(1 - x) - (1 - x) - 1] at 0


def test_agg_loss_modes_hand_computed():
    v = torch.tensor([[1.0, 2.0, 100.0], [3.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert agg_loss(v, m, "token-mean").item() == pytest.approx((1 + 2 + 3) / 3)
    assert agg_loss(v, m, "seq-mean-token-mean").item() == pytest.approx((1.5 + 3) / 2)
    assert agg_loss(v, m, "seq-mean-token-sum").item() == pytest.approx((3 + 3) / 2)
    v[0, 2] = float("inf")  # a unit outside the mask never counts, whatever it holds
    assert agg_loss(v, m, "token-mean").item() == pytest.approx(2.0)
    assert agg_loss(v, torch.zeros_like(m), "seq-mean-token-mean").item() == 0  # all masked: finite
    with pytest.raises(ValueError):
        agg_loss(v, m, "bogus")
