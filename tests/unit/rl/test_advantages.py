"""Advantage estimators (rl/advantages.py) on hand-computed rewards, and their fit with the objectives."""

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rl.advantages import (
    ADVANTAGES,
    AdvantageConfig,
    GroupConfig,
    LOOConfig,
    StepwiseConfig,
    stepwise_returns,
)

R = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])  # two groups of G = 4; the second has no spread


def estimator(name, **kw):
    cls = ADVANTAGES.get(name)
    return cls(cls.config_class(**kw))


def test_group_and_group_std_hand_computed():
    a, _ = estimator("group")(R, 4)
    assert torch.allclose(a, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    s, _ = estimator("group_std")(R, 4)
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item()  # the unbiased std, as TRL
    assert torch.allclose(s[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-4))
    assert torch.equal(s[4:], torch.zeros(4))  # zero-std group: no signal, no NaN


def test_leave_one_out_is_reward_minus_the_others_mean():
    a, _ = estimator("loo")(R, 4)
    for j in range(8):
        g = j // 4
        others = [R[k].item() for k in range(4 * g, 4 * g + 4) if k != j]
        assert a[j].item() == pytest.approx(R[j].item() - sum(others) / 3)


def test_stepwise_hand_computed_and_lam_zero_is_group():
    rewards = torch.tensor([1.0, 0.0])  # one group of G = 2
    values = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # (N, K = 2)
    R = stepwise_returns(rewards, values, lam=0.5, normalize=False)
    assert torch.allclose(R, torch.tensor([[1.5, 1.0], [-0.5, 0.0]]))  # (1 + lam) r - lam V
    assert torch.allclose(stepwise_returns(rewards, values, 0.5, True), R / 1.5)
    adv, m = estimator("stepwise", lam=0.5, normalize_returns=False, std_scale=False)(rewards, 2, values)
    assert torch.allclose(adv, torch.tensor([[1.0, 0.5], [-1.0, -0.5]]))  # R minus the slot's group mean
    assert m["egspo_sa/value_mean"] == pytest.approx(0.5)
    same, _ = estimator("stepwise", lam=0.0)(rewards, 2, values)  # the public code: no std
    plain, _ = estimator("group")(rewards, 2)
    assert torch.allclose(same, plain[:, None].expand(2, 2))
    scaled, _ = estimator("stepwise", lam=0.0, std_scale=True)(rewards, 2, values)
    assert torch.allclose(scaled, estimator("group_std")(rewards, 2)[0][:, None].expand(2, 2))


def test_stepwise_metrics_ignore_unused_slots_and_need_values():
    rewards = torch.tensor([1.0, 0.0])
    values = torch.tensor([[0.0, 9.0], [1.0, 9.0]])
    valid = torch.tensor([[True, False], [True, False]])
    _, m = estimator("stepwise")(rewards, 2, values, valid)
    assert m["egspo_sa/value_mean"] == pytest.approx(0.5)  # the 9s of unused slots are left out
    assert m["egspo_sa/reward_minus_value"] == pytest.approx(0.0)
    assert m["egspo_sa/adv_std"] == pytest.approx((8 / 9) ** 0.5)  # slot 0's advantages +-2/3, two of them
    with pytest.raises(ValueError, match="values"):
        estimator("stepwise")(rewards, 2)


def test_stepwise_defaults_are_the_public_codes_hand_computed():
    """lam 0.5, returns over (1 + lam), no std: R = r - V / 3 here, centred per slot; the spread metric is
    the unbiased std of the advantages of the used slots."""
    rewards = torch.tensor([1.0, 0.0])
    values = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    adv, m = estimator("stepwise")(rewards, 2, values)  # R = [[1, 2/3], [-1/3, 0]]
    assert torch.allclose(adv, torch.tensor([[2 / 3, 1 / 3], [-2 / 3, -1 / 3]]))
    assert m["egspo_sa/adv_std"] == pytest.approx((10 / 27) ** 0.5)  # mean 0, squares 10/9 over 3
    assert m["egspo_sa/reward_minus_value"] == pytest.approx(0.0)


def test_stepwise_metrics_of_one_used_slot_and_of_none():
    rewards = torch.tensor([1.0, 0.0])
    values = torch.tensor([[0.25, 9.0], [9.0, 9.0]])
    one = torch.tensor([[True, False], [False, False]])
    _, m = estimator("stepwise")(rewards, 2, values, one)
    assert m["egspo_sa/value_mean"] == pytest.approx(0.25)  # one slot: divided by 1
    assert m["egspo_sa/reward_minus_value"] == pytest.approx(0.75)
    assert m["egspo_sa/adv_std"] == 0.0  # no spread from a single advantage (not NaN)
    _, m = estimator("stepwise")(rewards, 2, values, torch.zeros_like(one))
    assert (m["egspo_sa/value_mean"], m["egspo_sa/reward_minus_value"], m["egspo_sa/adv_std"]) == (0.0, 0.0, 0.0)


def test_configs_validate_and_registry_names():
    assert ADVANTAGES.names() == ["group", "group_std", "loo", "mdpo", "stepwise", "zscore"]
    assert GroupConfig().name == "group" and LOOConfig().name == "loo" and AdvantageConfig().name == "group_std"
    with pytest.raises(ConfigError, match="advantage.lam"):
        StepwiseConfig(lam=-1).validate()
    with pytest.raises(ConfigError, match="advantage.eps"):
        AdvantageConfig(eps=0).validate()
    with pytest.raises(ConfigError, match=r"advantage.credit='cell' is invalid: allowed: sequence, token"):
        AdvantageConfig(credit="cell").validate()
    for name in ("stepwise", "mdpo"):  # per-step estimators: no per-token form
        with pytest.raises(ConfigError, match=rf"advantage.credit='token' is invalid: advantage={name} has no per-token "
                                              r"form; token credit is for advantage=group \| group_std \| loo \| zscore"):
            estimator(name, credit="token")


@pytest.mark.parametrize("likelihood,ok", [("one_step", True), ("complementary", True), ("stratified", True),
                                           ("elbo", False), ("spg_blocks", False)])
def test_per_cell_credit_takes_any_per_token_likelihood_and_the_refusal_names_them(tmp_path, likelihood, ok):
    from diffusion_rl.app.train import build
    from tests.helpers.common import compose_cfg

    cfg = compose_cfg(["objective=grpo", "advantage=per_token", f"likelihood={likelihood}"], tmp_path)
    if ok:
        assert build(cfg).objective.likelihood.per_token
    else:
        with pytest.raises(ConfigError, match=r"^advantage.credit='token' is invalid: needs a per-token likelihood: "
                                              r"likelihood=complementary \| one_step \| stratified"):
            build(cfg)


@pytest.mark.parametrize("objective,advantage,ok", [
    ("grpo", "loo", True), ("grpo", "stepwise", False), ("stabledrl", "group", True),
    ("egspo", "stepwise", True), ("egspo_sa", "group_std", False), ("egspo_sa", "stepwise", True),
    ("mdpo", "mdpo", True), ("mdpo", "group_std", False), ("egspo_sa", "mdpo", False),
])
def test_objectives_refuse_estimators_they_cannot_use(tmp_path, objective, advantage, ok):
    from diffusion_rl.app.train import build
    from tests.helpers.common import compose_cfg

    cfg = compose_cfg([f"objective={objective}", f"advantage={advantage}"], tmp_path)
    if ok:
        assert build(cfg).advantage.cfg.name == advantage
    else:
        with pytest.raises(ConfigError) as err:
            build(cfg)
        assert str(err.value).startswith(f"advantage.name='{advantage}' is invalid: objective {objective}")


@pytest.mark.parametrize("objective,ok", [("grpo", True), ("tracerl", True), ("cj_grpo", True), ("stabledrl", False),
                                          ("egspo", False), ("espo", False), ("wd1", False)])
def test_only_objectives_that_score_tokens_take_token_credit(tmp_path, objective, ok):
    from diffusion_rl.app.train import build
    from tests.helpers.common import compose_cfg

    cfg = compose_cfg([f"objective={objective}", "advantage.credit=token"], tmp_path)
    if ok:
        assert build(cfg).advantage.needs_token_rewards
    else:
        with pytest.raises(ConfigError, match=rf"^advantage.credit='token' is invalid: objective {objective} does not "
                                              "score tokens one by one: it takes advantage.credit=sequence$"):
            build(cfg)


TOKEN_R = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.5, 0.0]])  # one group of G = 2, each row sums to its reward
SEQ_R = torch.tensor([1.0, 0.5])


def test_token_credit_applies_each_formula_at_each_position_hand_computed():
    # position 0: one sample earned 0.5, the other nothing; positions 1 and 2: the two agree
    adv, m = estimator("group", credit="token")(SEQ_R, 2, token_rewards=TOKEN_R)
    assert torch.allclose(adv, torch.tensor([[0.25, 0.0, 0.0], [-0.25, 0.0, 0.0]]))  # d1's r - mean, per cell
    assert m["advantage/credited_token_frac"] == pytest.approx(3 / 6)
    scale = torch.tensor([0.5, 0.0]).std().item() + 1e-4  # the unbiased std at position 0
    scaled, _ = estimator("group_std", credit="token")(SEQ_R, 2, token_rewards=TOKEN_R)
    assert torch.allclose(scaled, adv / scale)
    loo, _ = estimator("loo", credit="token")(SEQ_R, 2, token_rewards=TOKEN_R)
    assert torch.allclose(loo, torch.tensor([[0.5, 0.0, 0.0], [-0.5, 0.0, 0.0]]))  # r_j minus the other's r
    z, _ = estimator("zscore", credit="token")(SEQ_R, 2, token_rewards=TOKEN_R)
    assert torch.allclose(z, torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]))  # population std 0.25; flat -> 0
    # a sample's unscaled token advantages add up to its centred reward: the same signal, split over cells
    seq, _ = estimator("group")(SEQ_R, 2)
    assert torch.allclose(adv.sum(-1), seq)
    with pytest.raises(ValueError, match="token"):
        estimator("group", credit="token")(SEQ_R, 2)


def test_per_token_is_group_std_with_token_credit(tmp_path):
    from diffusion_rl.app.train import build
    from tests.helpers.common import compose_cfg

    c = build(compose_cfg(["objective=grpo", "advantage=per_token"], tmp_path))
    assert (c.advantage.cfg.name, c.advantage.cfg.credit) == ("group_std", "token")
    adv, _ = c.advantage(SEQ_R, 2, token_rewards=TOKEN_R)
    scale = torch.tensor([0.5, 0.0]).std().item() + 1e-4
    assert torch.allclose(adv, torch.tensor([[0.25, 0.0, 0.0], [-0.25, 0.0, 0.0]]) / scale)


def test_stepwise_reward_minus_value_is_the_mean_over_the_used_slots():
    rewards = torch.tensor([1.0, 0.0])
    values = torch.tensor([[0.5, 0.25], [0.5, 9.0]])
    valid = torch.tensor([[True, True], [True, False]])
    _, m = estimator("stepwise")(rewards, 2, values, valid)
    assert m["egspo_sa/reward_minus_value"] == pytest.approx((0.5 + 0.75 - 0.5) / 3)
    assert m["egspo_sa/value_mean"] == pytest.approx((0.5 + 0.25 + 0.5) / 3)


def test_credited_token_frac_is_the_share_of_tokens_with_a_reward_of_their_own():
    token_r = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.5]])
    _, m = estimator("group", credit="token")(torch.tensor([1.0, 0.5]), 2, token_rewards=token_r)
    assert m["advantage/credited_token_frac"] == pytest.approx(2 / 6)


def test_zscore_is_zero_only_below_zero_std():
    r = torch.tensor([0.0, 2.0, 0.0, 0.5])  # population std 1.0 and 0.25
    z, _ = estimator("zscore", zero_std=1.0)(r, 2)
    assert torch.allclose(z, torch.tensor([-1.0, 1.0, 0.0, 0.0]))  # std 1.0 is not below 1.0; 0.25 is


def test_mdpo_step_gains_hand_computed():
    from diffusion_rl.rl.advantages import mdpo_step_gains

    # (r_t - r_{t-1}) + 1 + mean of the later steps' rewards; the last step takes its own reward
    values = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.5, 0.5]])
    expected = torch.tensor([[1 + 1 + 0.5, -1 + 1 + 1.0, 1 + 1 + 1.0],
                             [0 + 1 + 0.5, 0.5 + 1 + 0.5, 0 + 1 + 0.5]])
    assert torch.allclose(mdpo_step_gains(values), expected)


def test_mdpo_best_minus_final_is_each_row_s_best_step_over_its_final_one():
    values = torch.tensor([[0.0, 0.5, 0.0], [1.0, 1.0, 1.0]])  # row 0 lost 0.5 at the end; row 1 nothing
    _, m = estimator("mdpo")(torch.tensor([0.0, 1.0]), 2, values)
    assert m["mdpo/best_minus_final"] == pytest.approx(0.25)
    assert m["mdpo/value_mean"] == pytest.approx(3.5 / 6)
