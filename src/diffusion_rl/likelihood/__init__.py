"""Likelihood estimators: how ``log pi(x | q)`` of a diffusion LM is approximated (SPEC §3)."""

from diffusion_rl.likelihood import (
    elbo,  # noqa: F401  (registers "elbo")
    one_step,  # noqa: F401  (registers "one_step")
    staircase,  # noqa: F401  (registers "staircase")
)
from diffusion_rl.likelihood.base import (
    LIKELIHOODS,
    LikelihoodConfig,
    LikelihoodEstimator,
    mask_seeds,
    rand_rows,
)

__all__ = ["LIKELIHOODS", "LikelihoodConfig", "LikelihoodEstimator", "mask_seeds", "rand_rows"]
