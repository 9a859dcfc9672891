"""What an objective declares before it runs: its config (:class:`ObjectiveConfig`, the keys every
objective shares, ``objective.*``) and what it needs of the likelihood estimator (:class:`LikelihoodNeed`),
both checked when the objective is built, each refusal one line naming the key, the value and what is
allowed. The template that runs an objective is ``rl/objectives/base.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from diffusion_rl.core.errors import ConfigError, check_choice
from diffusion_rl.rl.objectives.behaviour import BEHAVIOUR_CORRECTIONS


@dataclass
class ObjectiveConfig:
    name: str = "grpo"
    # inner updates per rollout batch (d1: up to 12, StableDRL: 2); on the embedded Sudoku job one
    # update per rollout did at least as well as 2-4
    mu: int = 1
    # weight of the k3 KL to the reference policy, the warm start (d1: 0.04; 0 holds no reference
    # model). The Sudoku reward ignores the given cells: without this anchor their copying drifts
    beta: float = 0.04
    # objectives whose estimator draws random masks (one_step with prompt masking, elbo, staircase):
    # true scores the old and the new policy on the same masks, so the log-ratio is exactly 0 at
    # theta = theta_old; false draws fresh masks for the new policy, the StableDRL code's regime of
    # largest ratio noise (docs/methods.md §3)
    share_masks_with_old: bool = True
    # rollouts from an approximate sampler (sampler.kv_cache, ...): none | tis (truncated importance
    # weights min(pi_old / q_sampler, tis_cap) per unit of the ratio; rl/objectives/behaviour.py)
    behaviour_correction: str = "none"
    tis_cap: float = 2.0  # the cap of autoregressive RL's TIS (Yao et al. 2025)

    def validate(self) -> None:
        if self.mu < 1:
            raise ConfigError("objective.mu", self.mu, "must be >= 1")
        if self.beta < 0:
            raise ConfigError("objective.beta", self.beta, "must be >= 0")
        check_choice("objective.behaviour_correction", self.behaviour_correction, BEHAVIOUR_CORRECTIONS)
        if not self.tis_cap >= 1:
            raise ConfigError("objective.tis_cap", self.tis_cap, "must be >= 1")


def check_clip(eps: float, eps_high: float = math.inf) -> None:
    """PPO's clip range ``[1 - eps, 1 + eps_high]``, the same check for every objective that clips its
    ratio: ``0 < eps < 1``, ``eps_high > 0`` (not given: the objective clips ``eps`` both sides)."""
    if not 0 < eps < 1:
        raise ConfigError("objective.eps", eps, "must be in (0, 1)")
    if eps_high <= 0:
        raise ConfigError("objective.eps_high", eps_high, "must be > 0")


@dataclass(frozen=True)
class LikelihoodNeed:
    """What an objective needs of its likelihood estimator (``likelihood=``), checked when the objective is
    built: an estimator that does not fit stops the run in one line naming ``likelihood.name``, with
    ``why`` (what the objective does, and what to set). ``per_token``: per-token log-probs; ``one_step``:
    ``likelihood=one_step`` alone, for an objective that scores units of its own (decoding rounds,
    transitions, tree edges) and reads nothing of the estimator but its mask token; ``kinds``: one of
    these estimator classes."""

    why: str
    per_token: bool = False
    one_step: bool = False
    kinds: tuple[type, ...] = ()

    def check(self, likelihood: Any) -> None:
        fits = ((likelihood.per_token or not self.per_token)
                and (getattr(likelihood.cfg, "name", "one_step") == "one_step" or not self.one_step)
                and (isinstance(likelihood, self.kinds) or not self.kinds))
        if not fits:
            raise ConfigError("likelihood.name", likelihood.cfg.name, self.why)
