"""Advantage estimators: rewards of a rollout batch -> advantages, registered by name (``advantage=``).

Every estimator sees the rewards of the *whole* batch ``(N,)`` (prompt-major: rows ``g*G .. g*G+G-1``
share prompt ``g``; gathered from every process under data parallelism) and returns advantages of
the same rows, ``(N,)``, or ``(N, K)`` per selected denoising step (``stepwise``):

- ``group``:     ``A_j = r_j - mean_G(r)``                       (SPEC §4; Dr. GRPO's unscaled form)
- ``group_std``: ``A_j = (r_j - mean_G(r)) / (std_G(r) + eps)``  (d1 / TRL's default; the unbiased std)
- ``loo``:       ``A_j = r_j - mean_{k != j} r_k = G / (G - 1) (r_j - mean_G(r))``   (RLOO)
- ``stepwise``:  EGSPO-SA (SPEC §4). With ``V_jk`` the reward of the greedy one-step completion at
  sample ``j``'s ``k``-th selected step, ``R_jk = (1 + lam) r_j - lam V_jk`` (``/ (1 + lam)`` when
  ``normalize_returns``) and ``A_jk = R_jk - mean_G(R_.k)`` per slot ``k`` (``/ (std + eps)`` when
  ``std_scale``). ``lam = 0`` gives ``group`` / ``group_std`` for every slot.

An estimator with ``needs_values = True`` asks the rollout for the values ``V`` (the sampler then
records greedy completions and the rollout scores them in the same pass as the final completions).
Objectives declare which estimators they accept (``Objective.advantages``); a mismatch fails at
start-up in one line. Pure tensor code: no Lightning, no model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from diffusion_rl.errors import ConfigError
from diffusion_rl.registry import Registry

ADVANTAGES: Registry[type[AdvantageEstimator]] = Registry("advantage.name")


@dataclass
class AdvantageConfig:
    name: str = "group_std"  # the default of every objective but egspo_sa (d1 and TRL scale by the std)
    eps: float = 1e-4  # added to the group's std before dividing (group_std, stepwise with std_scale)

    def validate(self) -> None:
        if not self.eps > 0:
            raise ConfigError("advantage.eps", self.eps, "must be > 0")


class AdvantageEstimator(ABC):
    """Subclasses register with ``@ADVANTAGES.register(name)`` and set ``config_class``."""

    config_class: type[AdvantageConfig] = AdvantageConfig
    needs_values: bool = False  # True: needs V, the rewards of greedy one-step completions (N, K)

    def __init__(self, cfg: AdvantageConfig):
        cfg.validate()
        self.cfg = cfg

    @abstractmethod
    def __call__(self, rewards: torch.Tensor, group_size: int, values: torch.Tensor | None = None,
                 valid: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """Advantages of all rows, (N,) or (N, K), and metrics to log.

        rewards (N,); values (N, K) and valid (N, K) bool (the slots holding a selected step) only
        for estimators with ``needs_values``.
        """


def centred(rewards: torch.Tensor, group_size: int, std_eps: float | None = None) -> torch.Tensor:
    """``r - mean_G(r)``, divided by ``std_G(r) + std_eps`` unless ``std_eps`` is None. (N,) -> (N,)

    The std is the unbiased one (``torch.std``), as d1 and TRL compute it.
    """
    r = rewards.float().view(-1, group_size)  # (N/G, G)
    adv = r - r.mean(-1, keepdim=True)
    if std_eps is not None:
        adv = adv / (r.std(-1, keepdim=True) + std_eps)
    return adv.reshape(-1)


@dataclass
class GroupConfig(AdvantageConfig):
    name: str = "group"


@ADVANTAGES.register("group")
class GroupAdvantage(AdvantageEstimator):
    config_class = GroupConfig

    def __call__(self, rewards, group_size, values=None, valid=None):
        return centred(rewards, group_size), {}


@ADVANTAGES.register("group_std")
class GroupStdAdvantage(AdvantageEstimator):
    def __call__(self, rewards, group_size, values=None, valid=None):
        return centred(rewards, group_size, self.cfg.eps), {}


@dataclass
class LOOConfig(AdvantageConfig):
    name: str = "loo"


@ADVANTAGES.register("loo")
class LeaveOneOutAdvantage(AdvantageEstimator):
    config_class = LOOConfig

    def __call__(self, rewards, group_size, values=None, valid=None):
        return centred(rewards, group_size) * (group_size / (group_size - 1)), {}


@dataclass
class StepwiseConfig(AdvantageConfig):
    name: str = "stepwise"
    lam: float = 0.5  # weight of the greedy-completion value baseline (the EGSPO-SA paper's 0.5)
    normalize_returns: bool = True  # divide R_k by (1 + lam)
    std_scale: bool = True  # divide each slot's centred returns by their group std + eps

    def validate(self) -> None:
        super().validate()
        if self.lam < 0:
            raise ConfigError("advantage.lam", self.lam, "must be >= 0")


def stepwise_returns(rewards: torch.Tensor, values: torch.Tensor, lam: float, normalize: bool) -> torch.Tensor:
    """``R_k = (1 + lam) r - lam V_k`` (``/ (1 + lam)`` if ``normalize``). (N,), (N, K) -> (N, K)"""
    R = (1 + lam) * rewards[:, None] - lam * values
    return R / (1 + lam) if normalize else R


@ADVANTAGES.register("stepwise")
class StepwiseAdvantage(AdvantageEstimator):
    config_class = StepwiseConfig
    cfg: StepwiseConfig
    needs_values = True

    def __call__(self, rewards, group_size, values=None, valid=None):
        if values is None:
            raise ValueError("advantage=stepwise needs the greedy-completion values V (N, K)")
        c = self.cfg
        returns = stepwise_returns(rewards.float(), values, c.lam, c.normalize_returns)  # (N, K)
        eps = c.eps if c.std_scale else None
        adv = torch.stack([centred(returns[:, k], group_size, eps) for k in range(returns.shape[1])], 1)
        v = torch.ones_like(values, dtype=torch.bool) if valid is None else valid.bool()
        n = v.sum().clamp_min(1)
        metrics = {
            "egspo_sa/value_mean": float(torch.where(v, values, 0).sum() / n),
            "egspo_sa/reward_minus_value": float(torch.where(v, rewards.float()[:, None] - values, 0).sum() / n),
            "egspo_sa/adv_std": float(adv[v].std()) if int(v.sum()) > 1 else 0.0,
        }
        return adv, metrics
