"""What every objective shares: one policy-loss signature, the step context and the template that
calls the loss (the tensor helpers every loss uses, verl's ``core_algos``, are ``rl/objectives/losses.py``;
the config every objective extends and what it declares of its estimator, ``rl/objectives/config.py``).

An objective turns one rollout batch into a scalar loss for one inner update, in three parts:

1. :meth:`Objective.logp_units` asks the likelihood estimator for ``log pi`` *units* of the rollout's
   samples under one policy: ``(n, U)`` with a mask of the units that count (``U`` = completion
   tokens for d1's one-step estimator, 1 for a sequence ELBO, the selected denoising steps for EGSPO);
   a per-token objective returns :meth:`Objective.token_logp`, which scores the rollout on this
   iteration's masks for each policy, on the tokens the reward reads and never on a task's pinned ones;
2. the objective's **policy loss**, a pure function of tensors with one signature for every objective::

       loss_fn(logp, old_logp, advantages, mask, cfg, *, group_size, surrogate=None) -> (loss, metrics)

   ``logp`` (B, U) with gradients, ``old_logp`` (B, U) of the old policy (``None`` for a
   ratio-free objective that did not score it, :meth:`Objective.needs_old_logp`), ``advantages`` (B, U)
   or (B, 1), ``mask`` (B, U), ``cfg`` the objective's config, ``group_size`` G (rows ``g*G..g*G+G-1``
   share a prompt), ``surrogate`` (B, U) a term that carries the gradient in place of ``logp`` (only
   StableDRL's ``spg_mix`` passes one; the others ignore it);
3. the shared KL penalty ``beta * agg_loss(kl_penalty(logp_units, ref_units), mask, kl_agg)`` to the
   reference policy (the warm start), on the units :meth:`logp_units` gives for it (:meth:`Objective.kl_term`;
   a method with its own KL form overrides that one method);
4. the sampler's own log-probability of the rollout in the same units (:meth:`Objective.sampler_units`):
   ``rollout/mismatch_log_ratio`` against the old log-probs, and, with
   ``objective.behaviour_correction=tis``, truncated importance weights on the advantages
   (``rl/objectives/behaviour.py``), so every objective gets the correction through this template.

Every tensor the loss sees is gathered from all processes (``rollout.shard.gather``), so the loss is
the global batch's on every process (``diffusion_rl/core/distributed.py``). Objectives know nothing of
Lightning. The old policy's values come from :meth:`Objective.compute_old_logp`, which the module
either calls during each inner update with a frozen copy of the policy (``old_policy=copy``) or for
every inner iteration right after the rollout, while the policy still *is* the old policy
(``old_policy=precomputed``: no second model); :meth:`Objective.old_logp` reads whichever applies.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.core.registry import Registry
from diffusion_rl.likelihood.base import mask_seeds
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.advantages import AdvantageConfig
from diffusion_rl.rl.batch import Rollout
from diffusion_rl.rl.objectives.behaviour import behaviour_correction
from diffusion_rl.rl.objectives.config import LikelihoodNeed, ObjectiveConfig
from diffusion_rl.rl.objectives.losses import agg_loss, kl_penalty
from diffusion_rl.sampling.sampler import SamplerConfig
from diffusion_rl.sampling.uniform_trajectory import Trajectory

OBJECTIVES: Registry[type[Objective]] = Registry("objective.name")

_FRESH_MASKS = 1 << 40  # added to the inner iteration to draw the new policy's masks (share_masks_with_old=false)


@dataclass
class LogpUnits:
    """Log-likelihood units of the rollout's samples under one policy (what :meth:`Objective.logp_units` gives)."""

    logp: torch.Tensor  # (n, U) units of the ratio (tokens, sequences or steps)
    mask: torch.Tensor  # (n, U) 1 = a unit that counts
    kl_logp: torch.Tensor | None = None  # (n, ..., M) units of the KL penalty; None: logp
    kl_mask: torch.Tensor | None = None  # its mask; None: mask
    surrogate: torch.Tensor | None = None  # (n, U) carries the gradient instead of logp (spg_mix)

    def kl_units(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kl_logp is None:
            return self.logp, self.mask
        return self.kl_logp, self.mask if self.kl_mask is None else self.kl_mask


@dataclass
class RolloutTools:
    """What an objective's rollout-time hook (:meth:`Objective.revise_rollout`) may call: the rollout
    engine's own sampler, decoder and rewards, and the old policy, so a hook resamples through the
    same path as the rollout (IGPO's hinted regeneration)."""

    task: Any  # diffusion_rl.tasks.base.Task (a higher layer: not imported here)
    tokenizer: Any
    mask_id: int
    eos_id: int
    run_seed: int
    # (first row, canvas (m, L)) -> completions (m, L) and the sampler's log-prob of each token (m, L):
    # rows first .. first + m - 1 of this process, sampled from ``canvas`` with noise of their own
    sample: Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    decode: Callable[[torch.Tensor], list[str]]  # completions (m, L) -> texts up to the first EOS
    # (completions, texts, items) -> composite rewards (m,) and components, as the rollout scored its own
    score: Callable[[torch.Tensor, list[str], list[dict[str, Any]]], tuple[torch.Tensor, dict[str, torch.Tensor]]]
    old_policy: Forward  # the old policy, (ids, attention_mask) -> logits


@dataclass
class StepContext:
    """What an objective may use for one inner update."""

    rollout: Rollout
    inner_iter: int
    run_seed: int
    policy: Forward  # with gradients
    old_policy: Forward | None  # frozen old policy (None with old_policy=precomputed)
    ref_policy: Forward | None  # frozen reference policy (beta > 0)
    # the objective's per-rollout plan: a dataclass of its own, made on first use (Objective.plan) and
    # shared by the rollout's inner updates (EGSPO's selected steps, TraceRL's rounds, ...)
    plan: Any = None
    precomputed_old_logp: dict[int, Any] = field(default_factory=dict)  # inner iter -> precomputed compute_old_logp()
    # the policy holds the old policy's weights (the module sets it for the first update after a
    # rollout): old log-probs scored like the policy's are then the policy's own (old_logp_like_policy)
    policy_is_old: bool = False
    step: int = 0  # optimizer steps taken before this update (a schedule over training: d-TreeRPO's)


def check_noise(bundle, objective: Objective) -> None:
    """Fail in one line, naming what applies, when the objective or its likelihood needs a mask token
    and the model has none (``PolicyBundle.noise == "uniform"``)."""
    if bundle.noise != "uniform":
        return
    allowed = objective.uniform_likelihoods
    name = objective.cfg.name
    if not allowed:
        ok = [f"{n}" + ("" if "*" in OBJECTIVES.get(n).uniform_likelihoods
                        else f" (likelihood={'|'.join(OBJECTIVES.get(n).uniform_likelihoods)})")
              for n in OBJECTIVES.names() if OBJECTIVES.get(n).uniform_likelihoods]
        raise ConfigError("objective.name", name, "reads masked positions and this model has no mask token "
                          f"(uniform noise): use objective={', '.join(ok)}")
    lik = objective.likelihood.cfg.name
    if "*" not in allowed and lik not in allowed:
        raise ConfigError("likelihood.name", lik, f"needs a mask token and this model has none (uniform noise): "
                          f"objective={name} takes likelihood={' or '.join(allowed)}")


def as_units(advantages: torch.Tensor) -> torch.Tensor:
    """Per-sample advantages (B,) as (B, 1), which broadcasts over a sample's units; (B, U) unchanged."""
    return advantages[:, None] if advantages.dim() == 1 else advantages


# ---- the objective ----------------------------------------------------------------------
class Objective(ABC):
    """Subclasses register with ``@OBJECTIVES.register(name)``, set ``config_class`` and
    ``policy_loss`` (their pure loss function) and implement :meth:`logp_units` (per token:
    :meth:`token_logp`)."""

    config_class: ClassVar[type[ObjectiveConfig]] = ObjectiveConfig
    policy_loss: ClassVar[Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]]
    # advantage estimators (rl/advantages.py) whose output this objective can use
    advantage_estimators: ClassVar[tuple[str, ...]] = ("group", "group_std", "loo")
    # takes per-token advantages (advantage.credit=token: each token's own reward, Sudoku's cells)
    token_credit: ClassVar[bool] = False
    # the sampler records its steps (EGSPO, TraceRL, MDPO; any objective with likelihood=trajectory)
    needs_trajectory: bool = False
    needs_tree: ClassVar[bool] = False  # trains on tree rollouts' edges (rollout.tree, rl/tree.py: d-TreeRPO)
    # the recorder also keeps the sampler's one-step prediction at every step and its confidences (MDPO)
    needs_predictions: ClassVar[bool] = False
    kl_agg: str = "seq-mean-token-mean"  # how the KL units reduce to the penalty (agg_loss's modes)
    needs_likelihood: ClassVar[LikelihoodNeed | None] = None  # what it needs of the estimator (None: any)
    # a uniform-noise model (no mask token: DiffusionGemma): the likelihoods (likelihood.name) this
    # objective scores one with, ("*",) where it scores the sampler's recorded steps whatever the
    # likelihood; (): it reads masked positions and refuses such a model at start-up (check_noise)
    uniform_likelihoods: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: ObjectiveConfig, likelihood):
        cfg.validate()
        self.cfg = cfg
        self.likelihood = likelihood
        if self.needs_likelihood is not None:
            self.needs_likelihood.check(likelihood)
        if getattr(likelihood, "needs_trajectory", False):  # likelihood=trajectory scores the recorded steps
            self.needs_trajectory = True

    def bind(self, bundle) -> None:  # noqa: B027 - a deliberate no-op hook, not abstract
        """Check the objective fits the policy (a :class:`PolicyBundle`) and read what it needs from it
        (TraceRL: whether the model is a block model). Called once at build time, before any work."""

    def rollout_sampler(self, sampler: SamplerConfig) -> SamplerConfig:
        """The sampler the training rollouts use, made from the configured one (``sampler.*``), which the
        evaluation uses as it is. Unchanged here; a method that fixes its own decoding order returns the
        configured sampler with that order (JustGRPO: one token per step, left to right, temperature 1)
        and raises a :class:`ConfigError` for a configured option the order cannot take."""
        return sampler

    def check_advantage(self, cfg: AdvantageConfig) -> None:
        """Fail in one line when the configured advantage estimator does not fit this objective."""
        if cfg.name not in self.advantage_estimators:
            raise ConfigError("advantage.name", cfg.name,
                              f"objective {self.cfg.name} takes one of: {', '.join(self.advantage_estimators)}")
        if cfg.credit == "token" and not self.token_credit:
            raise ConfigError("advantage.credit", cfg.credit, f"objective {self.cfg.name} does not score tokens one "
                              "by one: it takes advantage.credit=sequence")

    # ---- rollout-time hooks (called by diffusion_rl.rl.rollout) ----------------------------
    def select_steps(self, trajectory: Trajectory, completion_ids: torch.Tensor,
                     completion_mask: torch.Tensor, eos_id: int, rollout_id: int,
                     run_seed: int) -> tuple[torch.Tensor, dict[str, float]]:
        """``(n, K)`` recorded denoising steps to train on (``-1``: unused slot) and metrics;
        objectives with ``needs_trajectory`` implement it. An objective that records the trajectory only
        for its likelihood (``likelihood=trajectory``) selects no step."""
        if getattr(self.likelihood, "needs_trajectory", False):
            return completion_ids.new_zeros(completion_ids.shape[0], 0), {}
        raise NotImplementedError(f"objective {self.cfg.name} trains on no selected steps")

    def revise_rollout(self, ro: Rollout, tools: RolloutTools) -> tuple[Rollout, dict[str, float]]:
        """The rollout this objective trains on, given the one sampled and scored (before any advantage):
        unchanged by default; IGPO replaces rows of all-wrong groups with hinted samples. Metrics are
        this process's."""
        return ro, {}

    # ---- per inner update ---------------------------------------------------------------
    @abstractmethod
    def logp_units(self, ctx: StepContext, forward: Forward, role: str) -> LogpUnits:
        """Log-likelihood units of the rollout's samples under ``forward`` for this inner update.

        ``role`` is ``"policy"`` (with gradients), ``"old"`` (the old policy) or ``"ref"``
        (the reference), so an objective can pick each one's Monte Carlo masks and caches.
        """

    def token_logp(self, ctx: StepContext, forward: Forward, role: str, kl_tokens: str = "completion") -> LogpUnits:
        """The likelihood estimator's units of the rollout under ``forward`` for this inner update, scored
        as every per-token objective scores them: this iteration's masks for ``role``
        (:meth:`mask_seeds`, so ``share_masks_with_old`` holds), the policy gradient on
        ``Rollout.scored_mask`` and the task's pinned tokens shown as context, never scored. A per-token
        estimator gives (n, L) with the KL anchor on ``kl_tokens``: ``completion`` (every token up to
        EOS) or ``ignored`` (only those the reward ignores, with ``task.loss_mask=reward``), pinned
        tokens left out; a sequence estimator (ELBO) gives one unit per sequence, (n, 1)."""
        ro = ctx.rollout
        extra = {"trajectory": ro.trajectory} if getattr(self.likelihood, "needs_trajectory", False) else {}
        logp = self.likelihood(forward, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.scored_mask,
                               self.mask_seeds(ctx, role), pinned=ro.pinned, **extra)  # (n, L) or (n,)
        if logp.dim() == 1:  # a sequence-level estimator (ELBO): one unit per sequence
            return LogpUnits(logp[:, None], torch.ones_like(logp)[:, None])
        kl_mask = ro.completion_mask
        if kl_tokens == "ignored" and ro.loss_mask is not None:
            kl_mask = ro.completion_mask * (1 - ro.loss_mask)
        if ro.pinned is not None:  # a pinned token is context, not the policy's
            kl_mask = kl_mask * (~ro.pinned).to(kl_mask.dtype)
        return LogpUnits(logp, ro.scored_mask, kl_logp=logp, kl_mask=kl_mask)

    def mask_seeds(self, ctx: StepContext, role: str) -> list[int]:
        """Mask seeds of this inner iteration for ``role``: the old policy's, or the new (and the
        reference) policy's, which are the old one's unless ``share_masks_with_old`` is false. Then the
        new policy draws fresh masks every inner iteration and the old one is scored once per rollout,
        on the first iteration's masks (:meth:`old_logp_iter`), as StableDRL's public code takes its old ELBO
        at rollout time."""
        ro = ctx.rollout
        fresh = role != "old" and not self.cfg.share_masks_with_old
        it = self.old_logp_iter(ctx.inner_iter) if role == "old" else ctx.inner_iter
        return mask_seeds(ctx.run_seed, ro.rollout_id, ro.completion_ids.shape[0],
                          it + (_FRESH_MASKS if fresh else 0), ro.shard.offset)

    def plan(self, ctx: StepContext) -> Any:
        """This rollout's plan (``ctx.plan``), made by :meth:`make_plan` at the first inner update."""
        if ctx.plan is None:
            ctx.plan = self.make_plan(ctx)
        return ctx.plan

    def make_plan(self, ctx: StepContext) -> Any:
        """The objective's per-rollout plan: what its inner updates share beyond the rollout (an
        objective that keeps one returns its own dataclass)."""
        raise NotImplementedError(f"objective {self.cfg.name} keeps no per-rollout plan")

    def old_logp_iter(self, inner_iter: int) -> int:
        """The inner iteration whose old log-probs serve ``inner_iter``: its own when the old policy shares
        the new one's masks, the first otherwise (one old forward per rollout)."""
        return inner_iter if self.cfg.share_masks_with_old else 0

    def needs_old_logp(self) -> bool:
        """Whether each inner update scores the old policy (:meth:`compute_old_logp`). True wherever the
        loss reads a ratio; a ratio-free objective (``spg``, ``wd1``) returns False unless a diagnostic
        or a behaviour correction asks for it, and then no forward is spent on the old policy, the
        module keeps no frozen copy of it and the loss gets ``old_logp=None``."""
        return True

    def compute_old_logp(self, ctx: StepContext) -> torch.Tensor:
        """What inner update ``ctx.inner_iter`` needs from the old policy ``ctx.old_policy``:
        its log-likelihood units, (n, U). Called without gradients."""
        assert ctx.old_policy is not None
        return self.logp_units(ctx, ctx.old_policy, "old").logp

    def old_logp_like_policy(self) -> bool:
        """Whether the old policy is scored exactly as the policy (the same masks:
        ``share_masks_with_old``), so that while the two hold the same weights (``ctx.policy_is_old``:
        the first update after a rollout) the old log-probs are the policy's own, detached, the ratio is 1
        by construction and the old policy's forward is skipped. An objective whose old log-probs come
        another way (EGSPO's recorded log-probs) says no."""
        return self.cfg.share_masks_with_old

    def old_logp(self, ctx: StepContext) -> torch.Tensor:
        """:meth:`compute_old_logp` for this inner update: precomputed at rollout time, or computed now (and
        kept for the later updates they serve, :meth:`old_logp_iter`)."""
        key = self.old_logp_iter(ctx.inner_iter)
        if key not in ctx.precomputed_old_logp:
            with torch.no_grad():
                ctx.precomputed_old_logp[key] = self.compute_old_logp(ctx)
        return ctx.precomputed_old_logp[key]

    def precompute_old_logp(self, ctx: StepContext, num_iters: int) -> None:
        """Fill ``ctx.precomputed_old_logp`` for inner iterations ``0 .. num_iters - 1`` (``ctx.old_policy`` must
        be the old policy now)."""
        if not self.needs_old_logp():
            return
        with torch.no_grad():
            for it in range(num_iters):
                if it == 0 and ctx.policy_is_old and self.old_logp_like_policy():
                    continue  # the first update takes them from the policy's own forward
                if self.old_logp_iter(it) not in ctx.precomputed_old_logp:
                    ctx.inner_iter = it
                    ctx.precomputed_old_logp[self.old_logp_iter(it)] = self.compute_old_logp(ctx)
        ctx.inner_iter = 0

    def unit_advantages(self, ctx: StepContext) -> torch.Tensor:
        """The rollout's advantages as (n, 1) or per unit (n, U)."""
        return as_units(ctx.rollout.advantages)

    def sampler_units(self, ctx: StepContext) -> torch.Tensor | None:
        """The sampler's own log-probability of the rollout in the units of :meth:`logp_units`, (n, U), or
        None when the rollout carries none. Default: the likelihood estimator's reduction of
        ``Rollout.sampler_logp`` (``LikelihoodEstimator.sampler_units``; what is comparable per
        estimator: ``rl/objectives/behaviour.py``)."""
        ro = ctx.rollout
        if ro.sampler_logp is None:
            return None
        q = self.likelihood.sampler_units(ro.sampler_logp, ro.completion_mask)
        return q[:, None] if q.dim() == 1 else q

    def extra_metrics(self, ctx: StepContext) -> dict[str, torch.Tensor]:
        """Objective-specific metrics of this inner update (e.g. cost accounting)."""
        return {}

    def loss(self, ctx: StepContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Scalar loss of the *global* batch for one inner update and its detached metrics."""
        ro, c = ctx.rollout, self.cfg
        s = self.logp_units(ctx, ctx.policy, "policy")
        old = None
        if self.needs_old_logp():
            alike = ctx.policy_is_old and self.old_logp_like_policy()
            old = s.logp.detach() if alike else self.old_logp(ctx)
        ref = None
        if c.beta > 0 and ctx.ref_policy is not None:
            with torch.no_grad():
                ref = self.logp_units(ctx, ctx.ref_policy, "ref")
        g = ro.shard.gather  # every process's rows (identity on one process)
        surrogate = None if s.surrogate is None else g(s.surrogate)
        old = None if old is None else g(old)
        mask, adv = g(s.mask), g(self.unit_advantages(ctx))
        q = None if old is None else self.sampler_units(ctx)  # the sampler's units: only against old ones
        adv, behaviour = behaviour_correction(adv, old, None if q is None else g(q), mask, c.behaviour_correction,
                                              c.tis_cap)
        loss, metrics = self.policy_loss(g(s.logp), old, adv, mask, c, group_size=ro.group_size, surrogate=surrogate)
        metrics.update(behaviour)
        if ref is not None:
            kl = self.kl_term(s, ref, g, ro.group_size)
            loss = loss + c.beta * kl
            metrics["train/kl"] = kl.detach()
        metrics.update(self.extra_metrics(ctx))
        return loss, metrics

    def loss_parts(self, ctx: StepContext) -> Iterator[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        """The update's loss as parts whose sum is :meth:`loss`, each with its metrics. The module
        backpropagates each part as soon as it is yielded, so only one part's graph is alive at a time:
        an objective whose loss is a sum of independent terms (BGPO: one per masked copy) keeps its
        memory flat in their number. The update's loss is the parts' sum, its metrics their union.
        Default: one part, :meth:`loss`."""
        yield self.loss(ctx)

    def kl_term(self, policy: LogpUnits, ref: LogpUnits, gather: Callable[[torch.Tensor], torch.Tensor],
                group_size: int) -> torch.Tensor:
        """The KL penalty before its weight ``beta``: the k3 estimator on the KL units, reduced by
        ``kl_agg``. An objective whose method defines another KL form overrides this (ESPO: half the
        squared ELBO difference per sequence); ``gather`` gives every process's rows."""
        units, mask = policy.kl_units()
        return agg_loss(gather(kl_penalty(units, ref.kl_units()[0])), gather(mask), self.kl_agg, group_size)
