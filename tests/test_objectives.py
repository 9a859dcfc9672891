"""GRPO loss, advantages and k3 KL on hand-computed tensors."""

import math

import pytest
import torch

from diffusion_rl.objectives.base import group_advantages, k3_kl
from diffusion_rl.objectives.grpo import grpo_loss


def test_advantages_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    a = group_advantages(r, 4)
    assert torch.allclose(a, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    s = group_advantages(r, 4, "group")
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item()
    assert torch.allclose(s[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-4))
    assert torch.allclose(s[4:], torch.zeros(4))  # zero-std group: no signal, no NaN


def test_grpo_loss_and_gradient_hand_computed():
    # one sequence of two tokens, A = 2; token ratios exp(0.1), exp(-0.2) inside [0.5, 1.5]
    logp = torch.tensor([[0.1, -0.2]], requires_grad=True)
    old = torch.zeros(1, 2)
    adv = torch.tensor([2.0])
    mask = torch.ones(1, 2)
    loss, metrics = grpo_loss(logp, old, adv, mask, eps=0.5, eps_high=0.5)
    expected = -(math.exp(0.1) * 2 + math.exp(-0.2) * 2) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # d/dlogp of -(rho * A)/2 = -rho * A / 2
    assert torch.allclose(logp.grad, torch.tensor([[-math.exp(0.1), -math.exp(-0.2)]]), atol=1e-6)
    assert metrics["ratio/clip_frac_low"].item() == 0 and metrics["ratio/clip_frac_high"].item() == 0


def test_grpo_clips_on_both_sides():
    # positive advantage and ratio above 1+eps_high: clipped, zero gradient
    logp = torch.tensor([[math.log(2.0)]], requires_grad=True)
    loss, m = grpo_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), 0.2, 0.3)
    assert loss.item() == pytest.approx(-1.3)
    loss.backward()
    assert logp.grad.abs().item() == 0
    assert m["ratio/clip_frac_high"].item() == 1
    # negative advantage and ratio below 1-eps: clipped, zero gradient
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, m = grpo_loss(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), 0.2, 0.3)
    assert loss.item() == pytest.approx(0.8)
    loss.backward()
    assert logp.grad.abs().item() == 0
    assert m["ratio/clip_frac_low"].item() == 1
    # negative advantage and ratio above 1+eps_high: NOT clipped (conditional clipping)
    logp = torch.tensor([[math.log(2.0)]], requires_grad=True)
    loss, _ = grpo_loss(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), 0.2, 0.3)
    assert loss.item() == pytest.approx(2.0)
    loss.backward()
    assert logp.grad.item() == pytest.approx(2.0)


def test_grpo_ratio_one_means_nothing_clipped_and_mask_respected():
    logp = torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float)
    adv = torch.tensor([1.0, -1.0, 0.5])
    loss, m = grpo_loss(logp, logp.clone(), adv, mask, 0.2, 0.2)
    assert loss.item() == pytest.approx(-adv.mean().item())  # ratio 1 everywhere
    assert m["ratio/clip_frac_low"].item() == 0 and m["ratio/clip_frac_high"].item() == 0
    # changing masked-out tokens changes nothing
    logp2 = logp.clone()
    logp2[0, 3:] += 5
    loss2, _ = grpo_loss(logp2, logp, adv, mask, 0.2, 0.2)
    assert loss2.item() == pytest.approx(loss.item())


def test_grpo_all_masked_is_finite_and_sequence_level():
    loss, _ = grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3), 0.2, 0.2)
    assert torch.isfinite(loss)
    seq = torch.tensor([0.3, -0.1], requires_grad=True)
    loss, _ = grpo_loss(seq, torch.zeros(2), torch.tensor([1.0, 1.0]), None, 0.5, 0.5)
    assert loss.item() == pytest.approx(-(math.exp(0.3) + math.exp(-0.1)) / 2)


def test_k3_kl_properties_and_grpo_kl_term():
    x = torch.randn(100)
    assert torch.all(k3_kl(x, x) == 0)
    assert torch.all(k3_kl(x, x + torch.randn(100)) >= 0)
    logp = torch.tensor([[0.0]], requires_grad=True)
    ref = torch.tensor([[1.0]])
    loss, m = grpo_loss(logp, torch.zeros(1, 1), torch.tensor([0.0]), torch.ones(1, 1), 0.2, 0.2, ref, beta=0.5)
    assert loss.item() == pytest.approx(0.5 * (math.e - 1 - 1))
    assert m["train/kl"].item() == pytest.approx(math.e - 2)
