"""Advantage estimators: rewards of a rollout batch -> advantages, registered by name (``advantage=``).

Every estimator sees the rewards of the *whole* batch ``(N,)`` (prompt-major: rows ``g*G .. g*G+G-1``
share prompt ``g``; gathered from every process under data parallelism) and returns advantages of
the same rows, ``(N,)``, ``(N, L)`` per token (``credit=token``) or ``(N, K)`` per selected denoising step
(``stepwise``):

- ``group``:     ``A_j = r_j - mean_G(r)``                       (docs/methods.md §4; Dr. GRPO's
  unscaled form)
- ``group_std``: ``A_j = (r_j - mean_G(r)) / (std_G(r) + eps)``  (TRL's ``scale_rewards``; the unbiased std.
  d1, StableDRL and EGSPO do not scale: ``group``)
- ``loo``:       ``A_j = r_j - mean_{k != j} r_k = G / (G - 1) (r_j - mean_G(r))``   (RLOO)
- ``zscore``:    ``A_j = (r_j - mean_G(r)) / std_G(r)`` with the *population* std, and ``A = 0`` for a
  group whose std is below ``zero_std`` (TraceRL's ``z_score_normalize``, ``reward/rl_reward.py``)

These four take ``credit``: ``sequence`` (the default) reads each completion's reward ``r_j``;
``token`` reads the reward each token earned itself (``Task.token_rewards``, summing to ``r_j``; Sudoku:
``1 / empty cells`` for each empty cell filled right) and applies the same formula at each position,
``A_ji = r_ji - mean_G(r_.i)`` for ``group``, over ``std_G(r_.i) + eps`` for ``group_std``: each token is
compared with the group's tokens at its position (per-cell credit; ``advantage=per_token`` is
``group_std`` with token credit). For a policy that draws the tokens independently given the prompt (d1's
one-step view) the centred credit is an unbiased, lower-variance policy gradient of the same reward; under
the iterative sampler it ignores how a token changes the distribution of the others. A position whose
tokens all earned the same (a Sudoku given, EOS, a cell every sample got right) gets no advantage: anchor
what must not drift with the KL term. Only objectives that score tokens take it (``Objective.token_credit``).
- ``stepwise``:  EGSPO-SA (docs/methods.md §4). With ``V_jk`` the reward of the greedy one-step
  completion at sample ``j``'s ``k``-th selected step, ``R_jk = (1 + lam) r_j - lam V_jk``
  (``/ (1 + lam)`` when ``normalize_returns``) and ``A_jk = R_jk - mean_G(R_.k)`` per slot ``k``
  (``/ (std + eps)`` when ``std_scale``). ``lam = 0`` gives ``group`` / ``group_std`` for every
  slot.
- ``mdpo``:      MDPO (docs/methods.md §4.16). With ``r_jt`` the reward of the sampler's one-step
  prediction at step ``t`` of sample ``j`` (every step, in order; the last one is the final
  completion), ``a_jt = (r_jt - r_j,t-1) + 1 + mean_{u > t} r_ju`` (``r_j,-1 = 0``; the last step's
  mean is ``r_j,T-1``) and ``A_jt = (a_jt - mean_G(a_.t)) / (std_G(a_.t) + eps)`` per step (the unbiased
  std). The ``+ 1`` is the public code's and cancels in the centring, as does any constant added to
  every reward.

An estimator with ``needs_values = True`` asks the rollout for the values ``V`` (the sampler then
records the one-step completions named by ``values_of``, greedy ones or its own predictions, and the
rollout scores them in the same pass as the final completions).
Objectives declare which estimators they accept (``Objective.advantage_estimators``); a mismatch fails at
start-up in one line. Pure tensor code: no Lightning, no model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.core.registry import Registry

ADVANTAGES: Registry[type[AdvantageEstimator]] = Registry("advantage.name")


CREDITS = ("sequence", "token")


@dataclass
class AdvantageConfig:
    # TRL's default; the seed objectives' own files choose theirs (d1, StableDRL, EGSPO: group, r - mean)
    name: str = "group_std"
    eps: float = 1e-4  # added to the group's std before dividing (group_std, stepwise with std_scale)
    # what a reward is compared at: sequence (each completion's reward) | token (each token's own reward,
    # Task.token_rewards, at its position: per-cell credit on Sudoku); group, group_std, loo, zscore
    credit: str = "sequence"

    def validate(self) -> None:
        if not self.eps > 0:
            raise ConfigError("advantage.eps", self.eps, "must be > 0")
        if self.credit not in CREDITS:
            raise ConfigError("advantage.credit", self.credit, f"allowed: {', '.join(CREDITS)}")


class AdvantageEstimator(ABC):
    """Subclasses register with ``@ADVANTAGES.register(name)`` and set ``config_class``."""

    config_class: type[AdvantageConfig] = AdvantageConfig
    needs_values: bool = False  # True: needs V, the rewards of one-step completions at the selected steps (N, K)
    # which one-step completions V rewards: greedy (the argmax fill, EGSPO-SA) | prediction (the sampler's
    # own draws, MDPO; sampling/trajectory.py)
    values_of: str = "greedy"
    takes_token_credit: bool = False  # True: credit=token applies the formula at each token position

    def __init__(self, cfg: AdvantageConfig):
        cfg.validate()
        if cfg.credit == "token" and not self.takes_token_credit:
            takes = [n for n in ADVANTAGES.names() if ADVANTAGES.get(n).takes_token_credit]
            raise ConfigError("advantage.credit", cfg.credit, f"advantage={cfg.name} has no per-token form; token "
                              f"credit is for advantage={' | '.join(takes)}")
        self.cfg = cfg

    @property
    def needs_token_rewards(self) -> bool:
        """Whether the estimator reads each token's own reward (N, L), ``Task.token_rewards``."""
        return self.cfg.credit == "token"

    def credited(self, rewards: torch.Tensor, token_rewards: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        """What the formula reads: the rewards (N,), or with ``credit=token`` each token's own (N, L)."""
        if not self.needs_token_rewards:
            return rewards, {}
        if token_rewards is None:
            raise ValueError("advantage.credit=token needs each token's reward (N, L)")
        return token_rewards, {"advantage/credited_token_frac": float((token_rewards != 0).float().mean())}

    @abstractmethod
    def __call__(self, rewards: torch.Tensor, group_size: int, values: torch.Tensor | None = None,
                 valid: torch.Tensor | None = None,
                 token_rewards: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """Advantages of all rows, (N,), (N, K) or (N, L), and metrics to log.

        rewards (N,); values (N, K) and valid (N, K) bool (the slots holding a selected step) only
        for estimators with ``needs_values``; token_rewards (N, L) only with ``needs_token_rewards``.
        """


def centred(rewards: torch.Tensor, group_size: int, std_eps: float | None = None) -> torch.Tensor:
    """``r - mean_G(r)``, divided by ``std_G(r) + std_eps`` unless ``std_eps`` is None, at each position of
    a row. (N,) -> (N,), (N, L) -> (N, L)

    The std is the unbiased one (``torch.std``), as TRL computes it.
    """
    r = rewards.float().view(-1, group_size, *rewards.shape[1:])  # (N/G, G, ...)
    adv = r - r.mean(1, keepdim=True)
    if std_eps is not None:
        adv = adv / (r.std(1, keepdim=True) + std_eps)
    return adv.reshape(rewards.shape)


@dataclass
class GroupConfig(AdvantageConfig):
    name: str = "group"


@ADVANTAGES.register("group")
class GroupAdvantage(AdvantageEstimator):
    config_class = GroupConfig
    takes_token_credit = True

    def __call__(self, rewards, group_size, values=None, valid=None, token_rewards=None):
        r, metrics = self.credited(rewards, token_rewards)
        return centred(r, group_size), metrics


@ADVANTAGES.register("group_std")
class GroupStdAdvantage(AdvantageEstimator):
    takes_token_credit = True

    def __call__(self, rewards, group_size, values=None, valid=None, token_rewards=None):
        r, metrics = self.credited(rewards, token_rewards)
        return centred(r, group_size, self.cfg.eps), metrics


@dataclass
class LOOConfig(AdvantageConfig):
    name: str = "loo"


@ADVANTAGES.register("loo")
class LeaveOneOutAdvantage(AdvantageEstimator):
    config_class = LOOConfig
    takes_token_credit = True

    def __call__(self, rewards, group_size, values=None, valid=None, token_rewards=None):
        r, metrics = self.credited(rewards, token_rewards)
        return centred(r, group_size) * (group_size / (group_size - 1)), metrics


@dataclass
class ZScoreConfig(AdvantageConfig):
    name: str = "zscore"
    # a group whose population std is below this counts as std 0 and gets A = 0 (TraceRL: `if std == 0`;
    # float rewards that agree up to rounding would otherwise divide rounding noise by itself). `eps`
    # is not used: the public code adds nothing to the std
    zero_std: float = 1e-6

    def validate(self) -> None:
        super().validate()
        if not self.zero_std > 0:
            raise ConfigError("advantage.zero_std", self.zero_std, "must be > 0")


def zscores(rewards: torch.Tensor, group_size: int, zero_std: float) -> torch.Tensor:
    """``(r - mean_G) / std_G`` with the population std, 0 in a group whose std is below ``zero_std``,
    at each position of a row; in float64, as the public code's Python floats. (N,) or (N, L) -> float32"""
    r = rewards.double().view(-1, group_size, *rewards.shape[1:])  # (N/G, G, ...)
    centred = r - r.mean(1, keepdim=True)
    std = centred.pow(2).mean(1, keepdim=True).sqrt()  # (N/G, 1, ...) population std
    flat = std < zero_std
    return torch.where(flat, 0.0, centred / torch.where(flat, 1.0, std)).reshape(rewards.shape).float()


@ADVANTAGES.register("zscore")
class ZScoreAdvantage(AdvantageEstimator):
    config_class = ZScoreConfig
    cfg: ZScoreConfig
    takes_token_credit = True

    def __call__(self, rewards, group_size, values=None, valid=None, token_rewards=None):
        r, metrics = self.credited(rewards, token_rewards)
        return zscores(r, group_size, self.cfg.zero_std), metrics


@dataclass
class StepwiseConfig(AdvantageConfig):
    name: str = "stepwise"
    lam: float = 0.5  # weight of the greedy-completion value baseline (the EGSPO-SA paper's 0.5)
    normalize_returns: bool = True  # divide R_k by (1 + lam)
    # divide each slot's centred returns by their group std + eps; the public EGSPO-SA code does not
    # (its advantages are the returns minus the group mean)
    std_scale: bool = False

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

    def __call__(self, rewards, group_size, values=None, valid=None, token_rewards=None):
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


@dataclass
class MDPOAdvantageConfig(AdvantageConfig):
    name: str = "mdpo"


def mdpo_step_gains(values: torch.Tensor) -> torch.Tensor:
    """MDPO's per-step score before the group z-score: ``(r_t - r_{t-1}) + 1 + mean_{u > t} r_u``, with
    ``r_{-1} = 0`` and ``r_{T-1}`` in place of the (empty) mean at the last step. (N, T) -> (N, T)"""
    r = values.float()
    T = r.shape[1]
    gain = r - torch.cat([torch.zeros_like(r[:, :1]), r[:, :-1]], 1) + 1  # (N, T)
    after = r.flip(-1).cumsum(-1).flip(-1) - r  # (N, T) sum of the rewards strictly after t
    count = torch.arange(T - 1, -1, -1, device=r.device, dtype=r.dtype)  # (T,) how many steps follow t
    future = torch.where(count > 0, after / count.clamp_min(1), r)  # (N, T)
    return gain + future


@ADVANTAGES.register("mdpo")
class MDPOAdvantage(AdvantageEstimator):
    config_class = MDPOAdvantageConfig
    needs_values = True
    values_of = "prediction"

    def __call__(self, rewards, group_size, values=None, valid=None, token_rewards=None):
        if values is None:
            raise ValueError("advantage=mdpo needs the rewards of every step's prediction (N, T)")
        if valid is not None and not bool(valid.all()):
            raise ValueError("advantage=mdpo needs a value at every recorded step, in step order")
        gains = mdpo_step_gains(values)  # (N, T)
        g = gains.view(-1, group_size, gains.shape[1])  # (N/G, G, T)
        adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + self.cfg.eps)).reshape(gains.shape)
        r = values.float()
        metrics = {
            "mdpo/value_mean": float(r.mean()),  # the predictions' reward over every step
            # how much better the best intermediate prediction was than the final completion
            # (MDPO's over-denoising: a right answer reached and then lost)
            "mdpo/best_minus_final": float((r.amax(-1) - r[:, -1]).mean()),
        }
        return adv, metrics
