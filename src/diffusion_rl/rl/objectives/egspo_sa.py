"""EGSPO-SA: EGSPO with stepwise advantages from one-step greedy completions (docs/methods.md §4).

The objective is EGSPO's (``rl/objectives/egspo.py``: the clipped surrogate on the ``K`` selected steps);
what differs is the advantage of each step, ``advantage=stepwise`` (``rl/advantages.py``): with
``V_s = r(xhat_s)`` the reward of the greedy one-step completion recorded at step ``s`` (no extra
forward; the rollout scores the ``N K`` greedy completions with the final ones, in one pass), slot
``k`` (the sample's ``k``-th selected step) gets ``R_k = (1 + lam) r(x_0) - lam V_{s_k}`` (divided by
``1 + lam`` when ``normalize_returns``) and ``A_k = R_k - mean_G(R_k)`` per slot. ``lam = 0`` is EGSPO
exactly. Selecting ``objective=egspo_sa`` selects ``advantage=stepwise`` (``conf/objective/egspo_sa.yaml``);
any other estimator is refused at start-up.

Source: the EGSPO paper's stepwise-advantage variant and its public code, vishnutez/egspo-dllm-rl @
a7d618b (``egspo/train.sh``: ``LAMBDA1=0.5``, ``NORMALIZE_RETURNS=true``; ``egspo_trainer.py``: the
returns minus their group mean per slot, no std), run in EGSPO's regime otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diffusion_rl.rl.objectives.base import OBJECTIVES
from diffusion_rl.rl.objectives.egspo import EGSPO, EGSPOConfig


@dataclass
class EGSPOSAConfig(EGSPOConfig):
    name: str = "egspo_sa"


@OBJECTIVES.register("egspo_sa")
class EGSPOSA(EGSPO):
    config_class = EGSPOSAConfig
    advantage_estimators: ClassVar[tuple[str, ...]] = ("stepwise",)
