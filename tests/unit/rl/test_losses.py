"""The shared pieces of the objectives' losses (rl/objectives/losses.py) on hand-computed values: masked
means, the four aggregations, PPO's conditional clip and which units it holds, the per-sample check,
and the ratio metrics every ratio objective logs (docs/methods.md §6 names)."""

import math

import pytest
import torch

from diffusion_rl.rl.objectives.losses import (
    agg_loss,
    check_per_sample,
    clipped_surrogate,
    masked_mean,
    ratio_metrics,
)

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # 2, 1 and 0 units count


def test_masked_mean_over_all_and_per_row():
    assert masked_mean(X, M).item() == pytest.approx((1 + 2 + 5) / 3)
    assert masked_mean(X, M, dim=1).tolist() == pytest.approx([1.5, 5.0, 0.0])  # an empty row is 0, not NaN
    assert masked_mean(X, M, dim=0).tolist() == pytest.approx([1.0, 3.5, 0.0])


def test_the_four_aggregations_hand_computed():
    assert agg_loss(X, M, "token-mean").item() == pytest.approx(8 / 3)
    assert agg_loss(X, M, "seq-mean-token-mean").item() == pytest.approx((1.5 + 5.0 + 0.0) / 3)
    assert agg_loss(X, M, "seq-mean-token-sum").item() == pytest.approx((3 + 5 + 0) / 3)
    four = torch.cat([X, X[:1]])  # 4 rows: two groups of 2
    fm = torch.cat([M, M[:1]])
    assert agg_loss(four, fm, "group-token-mean", group_size=2).item() == pytest.approx(((1 + 2 + 5) / 3 + 3 / 2) / 2)
    # units outside the mask never count, even NaN
    nan = X.clone()
    nan[2] = math.nan
    assert agg_loss(nan, M, "token-mean").item() == pytest.approx(8 / 3)


def test_aggregations_of_more_than_two_dimensions_reduce_the_last_one_per_row():
    v = torch.arange(12.0).view(2, 2, 3)  # (B, K, U)
    m = torch.ones(2, 2, 3)
    assert agg_loss(v, m, "seq-mean-token-sum").item() == pytest.approx(v.sum().item() / 4)  # 4 rows of 3 units
    assert agg_loss(v, m, "seq-mean-token-mean").item() == pytest.approx(v.mean().item())


def test_group_token_mean_needs_whole_groups():
    with pytest.raises(ValueError, match="whole groups"):
        agg_loss(X, M, "group-token-mean")  # no group size given
    with pytest.raises(ValueError, match="whole groups"):
        agg_loss(X, M, "group-token-mean", group_size=2)  # 3 rows
    with pytest.raises(ValueError, match="unknown aggregation"):
        agg_loss(X, M, "sum")


def test_clipped_surrogate_hand_computed_and_the_units_it_holds():
    ratio = torch.tensor([[0.5, 0.5, 1.0, 2.0, 2.0, 1.1]])
    adv = torch.tensor([[-1.0, 0.5, 1.0, 0.0, 1.0, -2.0]])
    per, low, high = clipped_surrogate(ratio.log(), adv, 0.2, 0.28)
    # -min(rho A, clip(rho, 0.8, 1.28) A)
    expected = [-min(0.5 * -1, 0.8 * -1), -min(0.5 * 0.5, 0.8 * 0.5), -1.0, 0.0, -min(2.0, 1.28), -min(-2.2, -2.2)]
    assert per[0].tolist() == pytest.approx(expected)
    assert low[0].tolist() == [True, False, False, False, False, False]  # below the band with A < 0 only
    assert high[0].tolist() == [False, False, False, False, True, False]  # above it with A > 0 only
    # at the band's edge nothing is held
    one = torch.zeros(1, 2)
    _, low, high = clipped_surrogate(one, torch.tensor([[-1.0, 1.0]]), 0.0, 0.0)
    assert not low.any() and not high.any()
    # beyond the band with A = 0: no gradient to hold
    _, low, high = clipped_surrogate(torch.tensor([[0.5, 2.0]]).log(), torch.zeros(1, 2), 0.2, 0.2)
    assert not low.any() and not high.any()


def test_per_sample_advantages_pass_and_per_unit_ones_are_refused():
    check_per_sample(torch.zeros(4), "x")
    check_per_sample(torch.zeros(4, 1), "x")
    with pytest.raises(ValueError, match=r"stabledrl needs one advantage per sample, got \(4, 3\)"):
        check_per_sample(torch.zeros(4, 3), "stabledrl")


def test_ratio_metrics_names_and_values():
    log_ratio = torch.tensor([[0.1, -0.3, 9.0], [0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # 9.0 does not count
    low = torch.tensor([[False, True, True], [False, False, False]])
    high = torch.tensor([[False, False, False], [True, True, False]])
    m = ratio_metrics(log_ratio, mask, low, high)
    vals = torch.tensor([0.1, -0.3, 0.5])
    assert set(m) == {"ratio/log_mean", "ratio/log_std", "ratio/log_min", "ratio/log_max",
                      "ratio/clip_frac_low", "ratio/clip_frac_high"}
    assert m["ratio/log_mean"].item() == pytest.approx(0.1, abs=1e-6)
    assert m["ratio/log_std"].item() == pytest.approx(vals.std().item())
    assert (m["ratio/log_min"].item(), m["ratio/log_max"].item()) == pytest.approx((-0.3, 0.5))
    assert m["ratio/clip_frac_low"].item() == pytest.approx(1 / 3)  # the masked-out clip does not count
    assert m["ratio/clip_frac_high"].item() == pytest.approx(1 / 3)


def test_ratio_metrics_of_two_units_one_unit_none_and_no_clip_given():
    two = ratio_metrics(torch.tensor([[0.2, -0.2]]), torch.ones(1, 2))
    assert two["ratio/log_std"].item() == pytest.approx(torch.tensor([0.2, -0.2]).std().item())
    one = ratio_metrics(torch.tensor([[0.2, 7.0]]), torch.tensor([[1.0, 0.0]]))
    assert one["ratio/log_std"].item() == 0.0 and one["ratio/log_max"].item() == pytest.approx(0.2)
    none = ratio_metrics(torch.tensor([[0.2, 7.0]]), torch.zeros(1, 2))
    assert all(v.item() == 0.0 for v in none.values())
    half = ratio_metrics(torch.tensor([[0.2]]), torch.ones(1, 1), clipped_low=torch.ones(1, 1, dtype=torch.bool))
    assert half["ratio/clip_frac_low"].item() == 0.0 and half["ratio/clip_frac_high"].item() == 0.0
