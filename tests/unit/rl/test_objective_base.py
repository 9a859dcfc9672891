"""What every objective inherits (rl/objectives/base.py): which masks each policy is scored on, which
old log-probs are taken ahead of the updates, the steps an objective without a selection trains on, the
units the KL reads, and the loss as the sum of its parts."""

import pytest
import torch

from diffusion_rl.likelihood.base import LikelihoodConfig
from diffusion_rl.likelihood.base import mask_seeds as base_seeds
from diffusion_rl.likelihood.one_step import OneStepEstimator
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import LogpUnits, StepContext
from diffusion_rl.rl.objectives.grpo import GRPO, GRPOConfig
from tests.helpers.common import make_batch, rollout_of

RUN, ROLLOUT = 5, 7  # rollout_of's rollout id is 7


def _grpo(bundle=None, **kw):
    mask_id = 99 if bundle is None else bundle.mask_token_id
    return GRPO(GRPOConfig(**kw), OneStepEstimator(LikelihoodConfig(), mask_id))


def _rollout(bundle, n=4, offset=0):
    from diffusion_rl.core.distributed import Shard

    prompt, pmask, comp, cmask = make_batch(bundle, n=n)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])[:n]
    return rollout_of(prompt, pmask, comp, cmask, adv, adv, n, shard=Shard(0, 1, offset))


def _ctx(ro, it=0, f=None):
    return StepContext(ro, it, RUN, f, f, None)


def test_shared_masks_score_every_policy_on_the_iteration_s_own_seeds(tiny_bundle):
    obj, ro = _grpo(share_masks_with_old=True), _rollout(tiny_bundle, offset=8)
    for it in (0, 1, 2):
        want = base_seeds(RUN, ROLLOUT, 4, it, offset=8)  # each sample keyed by its global row
        for role in ("old", "policy", "ref"):
            assert obj.mask_seeds(_ctx(ro, it), role) == want, (role, it)


def test_fresh_masks_score_the_old_policy_once_and_the_policy_afresh_each_iteration(tiny_bundle):
    obj, ro = _grpo(share_masks_with_old=False), _rollout(tiny_bundle)
    first = base_seeds(RUN, ROLLOUT, 4, 0)
    seen = []
    for it in (0, 1, 2):
        ctx = _ctx(ro, it)
        assert obj.mask_seeds(ctx, "old") == first  # one old forward per rollout, on the first iteration's masks
        policy = obj.mask_seeds(ctx, "policy")
        assert obj.mask_seeds(ctx, "ref") == policy  # the reference is scored as the policy
        assert not set(policy) & set(first)
        seen.append(tuple(policy))
    assert len(set(seen)) == 3
    assert [obj.old_logp_iter(it) for it in (0, 3)] == [0, 0]
    assert [_grpo(share_masks_with_old=True).old_logp_iter(it) for it in (0, 3)] == [0, 3]


class Counting(GRPO):
    """GRPO that records the inner iterations it was asked for old log-probs."""

    def __init__(self, *a):
        super().__init__(*a)
        self.asked = []

    def compute_old_logp(self, ctx):
        self.asked.append(ctx.inner_iter)
        return super().compute_old_logp(ctx)


@pytest.mark.parametrize("share,policy_is_old,asked", [(True, True, [1, 2]), (True, False, [0, 1, 2]),
                                                       (False, True, [0]), (False, False, [0])])
def test_precomputed_old_log_probs_are_taken_once_per_iteration_they_serve(tiny_bundle, share, policy_is_old, asked):
    obj = Counting(GRPOConfig(share_masks_with_old=share), OneStepEstimator(LikelihoodConfig(), tiny_bundle.mask_token_id))
    f = logits_fn(tiny_bundle.net.eval())
    ro = _rollout(tiny_bundle)
    ctx = StepContext(ro, 2, RUN, f, f, None, policy_is_old=policy_is_old)
    obj.precompute_old_logp(ctx, 3)
    assert obj.asked == asked
    assert sorted(ctx.precomputed_old_logp) == asked and ctx.inner_iter == 0
    for it in asked:  # each equals the old policy's units on that iteration's masks
        with torch.no_grad():
            want = obj.likelihood(f, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.scored_mask,
                                  obj.mask_seeds(_ctx(ro, it), "old"))
        assert torch.allclose(ctx.precomputed_old_logp[it], want)


def test_an_objective_with_a_trajectory_likelihood_selects_no_step_and_others_refuse():
    from diffusion_rl.likelihood.trajectory import TrajectoryEstimator, TrajectoryLikelihoodConfig

    comp = torch.zeros(3, 6, dtype=torch.long)
    obj = GRPO(GRPOConfig(), TrajectoryEstimator(TrajectoryLikelihoodConfig(), -1))
    steps, metrics = obj.select_steps(None, comp, torch.ones(3, 6), 1, 0, 0)
    assert steps.shape == (3, 0) and steps.dtype == comp.dtype and metrics == {}
    with pytest.raises(NotImplementedError, match="grpo trains on no selected steps"):
        _grpo().select_steps(None, comp, torch.ones(3, 6), 1, 0, 0)


def test_kl_units_fall_back_to_the_ratio_units():
    logp, mask = torch.randn(2, 3), torch.ones(2, 3)
    assert LogpUnits(logp, mask).kl_units() == (logp, mask)
    kl = torch.randn(2, 5)
    out = LogpUnits(logp, mask, kl_logp=kl).kl_units()
    assert out[0] is kl and out[1] is mask
    kl_mask = torch.zeros(2, 5)
    assert LogpUnits(logp, mask, kl_logp=kl, kl_mask=kl_mask).kl_units()[1] is kl_mask


def test_token_units_read_pinned_tokens_as_context_and_the_kl_covers_the_completion(tiny_bundle):
    ro = _rollout(tiny_bundle)
    ro.pinned = torch.zeros_like(ro.completion_ids, dtype=torch.bool)
    ro.pinned[:, 1] = True
    obj = _grpo(tiny_bundle, share_masks_with_old=True)
    f = logits_fn(tiny_bundle.net.eval())
    with torch.no_grad():
        units = obj.token_logp(_ctx(ro, 0, f), f, "policy")  # kl_tokens: completion by default
        want = obj.likelihood(f, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.scored_mask,
                              obj.mask_seeds(_ctx(ro, 0), "policy"), pinned=ro.pinned)
    assert torch.allclose(units.logp, want) and units.kl_logp is units.logp
    assert torch.equal(units.kl_mask, ro.completion_mask * (~ro.pinned).float())


def test_the_loss_is_the_sum_of_its_parts(tiny_bundle):
    ro = _rollout(tiny_bundle)
    f = logits_fn(tiny_bundle.net.eval())
    obj = _grpo(tiny_bundle, share_masks_with_old=True)
    parts = list(obj.loss_parts(_ctx(ro, 0, f)))
    whole, metrics = obj.loss(_ctx(ro, 0, f))
    assert len(parts) == 1 and torch.allclose(parts[0][0], whole) and set(parts[0][1]) == set(metrics)


def test_the_first_update_after_a_rollout_takes_the_old_units_from_the_policy_s_own_forward(tiny_bundle):
    """While the policy holds the old weights and is scored like the old policy, no old forward runs."""
    ro = _rollout(tiny_bundle)
    f = logits_fn(tiny_bundle.net.eval())

    def no_old_forward(ids, attn):
        raise AssertionError("the old policy was run")

    obj = _grpo(tiny_bundle, share_masks_with_old=True)
    loss, m = obj.loss(StepContext(ro, 0, RUN, f, no_old_forward, None, policy_is_old=True))
    assert m["ratio/log_max"].item() == 0.0 and m["ratio/log_min"].item() == 0.0
    with pytest.raises(AssertionError, match="the old policy was run"):  # a later update reads the old policy
        obj.loss(StepContext(ro, 1, RUN, f, no_old_forward, None, policy_is_old=False))


def test_a_trajectory_likelihood_gets_the_rollout_s_trajectory():
    """GRPO on DiffusionGemma's trajectory likelihood: one unit per sequence, the log-probs of every
    accepted token as the sampler drew them."""
    from diffusion_rl.likelihood.trajectory import TrajectoryEstimator, TrajectoryLikelihoodConfig
    from tests.helpers.gemma import sharp_gemma, uniform_rollout

    b = sharp_gemma()
    ids = torch.randint(4, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    traj, comp = uniform_rollout(b, ids, mask, [1, 2])
    adv = torch.tensor([1.0, -1.0])
    ro = rollout_of(ids, mask, comp, torch.ones_like(comp, dtype=torch.float), adv, adv, 2, trajectory=traj)
    obj = GRPO(GRPOConfig(), TrajectoryEstimator(TrajectoryLikelihoodConfig(), -1))
    f = logits_fn(b.net)
    with torch.no_grad():
        units = obj.token_logp(_ctx(ro, 0, f), f, "policy")
    assert units.logp.shape == (2, 1) and torch.equal(units.mask, torch.ones(2, 1))
    assert torch.allclose(units.logp[:, 0], traj.logps.sum(-1), atol=1e-3)
