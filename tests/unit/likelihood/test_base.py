"""What every likelihood estimator shares (likelihood/base.py): the sampler's log-probs put in each
estimator's units."""

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import LikelihoodConfig
from diffusion_rl.likelihood.elbo import ELBOConfig, ELBOEstimator
from diffusion_rl.likelihood.one_step import OneStepEstimator
from diffusion_rl.likelihood.staircase import StaircaseConfig, StaircaseEstimator


def test_sampler_log_probs_in_each_estimators_units():
    logp = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-0.5, -0.5, -1.0, 0.0]])
    cmask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])  # row 1 ends at token 1
    assert torch.equal(OneStepEstimator(LikelihoodConfig(), 1).sampler_units(logp, cmask), logp)  # per token
    mean = ELBOEstimator(ELBOConfig(weighting="mean"), 1).sampler_units(logp, cmask)
    assert mean.tolist() == pytest.approx([-2.5, -0.5])  # mean over the scored tokens
    summed = ELBOEstimator(ELBOConfig(weighting="inverse_t", t_min=0.001), 1).sampler_units(logp, cmask)
    assert summed.tolist() == pytest.approx([-10.0, -1.0])  # the sum: 1/t at t = 1
    after = ELBOEstimator(ELBOConfig(weighting="inverse_t", t_min=0.001, score_after_eos=True), 1).sampler_units(logp, cmask)
    assert after.tolist() == pytest.approx([-10.0, -2.0])
    stair = StaircaseEstimator(StaircaseConfig(weighting="mean"), 1, block_size=2).sampler_units(logp, cmask)
    assert stair.tolist() == pytest.approx([-1.5 - 3.5, -0.5])  # sum over blocks of each block's mean


# ---- the random numbers and the forward, at their edges --------------------------------------


def test_mask_seeds_key_each_copy_by_run_rollout_copy_and_inner_iteration():
    from diffusion_rl.core.seeding import mix_seed
    from diffusion_rl.likelihood.base import mask_seeds

    assert mask_seeds(7, 3, 4, 1) == [mix_seed(7, 3, j, 1) for j in range(4)]
    assert mask_seeds(7, 3, 2, 1, offset=5) == [mix_seed(7, 3, j, 1) for j in (5, 6)]
    assert mask_seeds(8, 3, 4, 1) != mask_seeds(7, 3, 4, 1)


def test_a_batch_draw_depends_on_its_salt_and_on_every_row():
    from diffusion_rl.likelihood.base import batch_seed

    assert batch_seed([1, 2, 3], 11) != batch_seed([1, 2, 3], 12)
    assert batch_seed([1, 2, 3], 11) != batch_seed([1, 2, 4], 11) != batch_seed([2, 1, 3], 11)
    assert batch_seed([1, 2, 3], 11) == batch_seed([1, 2, 3], 11)


def test_rand_rows_draws_k_rows_of_numbers_from_each_seed():
    from diffusion_rl.likelihood.base import rand_rows

    one = rand_rows([5, 6], 3)
    assert one.shape == (1, 2, 3)
    both = rand_rows([5, 6], 3, k=2)
    for b, s in enumerate([5, 6]):  # row b: torch.rand(k, width) from its own generator seeded s
        assert torch.equal(both[:, b], torch.rand(2, 3, generator=torch.Generator().manual_seed(s)))
    assert not torch.equal(both[0], both[1]) and torch.equal(both[0], one[0])


def test_forward_logps_uses_the_fused_head_and_passes_positions():
    from diffusion_rl.likelihood.base import forward_logps

    calls = []

    class Fused:  # a forward with its own token_logps (the chunked head of models/heads.py)
        def __call__(self, *a):
            raise AssertionError("the fused head is there: no full logits")

        def token_logps(self, ids, attn, targets, start, select=None, position_ids=None):
            calls.append((ids, attn, targets, start, select, position_ids))
            return torch.full(targets.shape, -1.5)

    ids, attn, targets = torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 5), torch.ones(2, 2, dtype=torch.long)
    select, pos = torch.tensor([[True, False], [True, True]]), torch.arange(5).expand(2, 5)
    out = forward_logps(Fused(), ids, attn, targets, 3, select=select, position_ids=pos)
    assert out.tolist() == [[-1.5, -1.5]] * 2
    (i, a, t, s, sel, p), = calls
    assert i is ids and a is attn and t is targets and s == 3 and sel is select and p is pos

    seen = []
    logits = torch.randn(2, 5, 4)

    def plain(ids_, attn_, position_ids=None):
        seen.append((ids_, attn_, position_ids))
        return logits

    got = forward_logps(plain, ids, attn, targets, 3, select=select, position_ids=pos)
    assert seen[-1][0] is ids and seen[-1][1] is attn and seen[-1][2] is pos
    ref = torch.log_softmax(logits[:, 3:5], -1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(got, ref.masked_fill(~select, 0.0))
    forward_logps(plain, ids, attn, targets, 3)
    assert seen[-1][2] is None  # no positions: the two-argument call


def test_p_mask_prompt_stays_below_one():
    LikelihoodConfig(p_mask_prompt=0.999).validate()
    with pytest.raises(ConfigError, match=r"^likelihood\.p_mask_prompt=1\.0 is invalid"):
        LikelihoodConfig(p_mask_prompt=1.0).validate()
