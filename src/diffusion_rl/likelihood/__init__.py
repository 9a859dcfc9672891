"""Likelihood estimators: how ``log pi(x | q)`` of a diffusion LM is approximated
(docs/methods.md §3).

One file per estimator, registered by name and found by :func:`discover`.
"""

from diffusion_rl.core.registry import discover
from diffusion_rl.likelihood.base import (
    LIKELIHOODS,
    LikelihoodConfig,
    LikelihoodEstimator,
    mask_seeds,
    rand_rows,
)

discover(__name__, __path__)

__all__ = ["LIKELIHOODS", "LikelihoodConfig", "LikelihoodEstimator", "mask_seeds", "rand_rows"]
