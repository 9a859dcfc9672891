"""What every likelihood estimator shares (likelihood/base.py): the sampler's log-probs put in each
estimator's units."""

import pytest
import torch

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
