"""d-TreeRPO: per-token PPO on the edges of tree rollouts, with sibling advantages and a
self-distillation term toward the better children (THU-BPM/d-TreeRPO).

Rollouts are trees (``rollout.tree``, ``rl/tree.py``): a node's value ``V`` is the mean of its
children's (a leaf's is its reward) and its advantage is ``A_k = V_k - mean_{j != k} V_j`` over its
siblings. Every edge (parent state ``s``, child state ``c``) is a training row ``k``; its trained
tokens ``T_k`` are those the child decoded since the parent (masked in ``s``, decoded in ``c``), up to
and including the child's first EOS, each scored by one forward on the parent state:

    lr_i   = log pi_theta(c_i | s) - log pi_old(c_i | s)
    L_PPO  = -(1/K) sum_k |T_k|^-1 sum_{i in T_k} min(e^lr_i A_k, clip(e^lr_i, 1 - eps, 1 + eps) A_k)
    L_KL   = (1/K) sum_k |T_k|^-1 sum_{i in T_k} k3(log pi_theta, log pi_ref)
    L_SD   = (1/|P|) sum_{(g, j) in P} sum_u q_gj(u) [log(q_gj(u) + 1e-8) - log pi_theta(u | s_g)_j]
    loss   = L_PPO + beta L_KL + lambda(t) L_SD

Self-distillation: in each group ``g`` (the children of one parent, state ``s_g``) the children with
``A > 0`` get weights ``w = softmax(A / tau(t))``; at a position ``j`` that some of them decoded,
``q_gj(u) = sum_{k: c_kj = u} w_k / (sum_{k decoded j} w_k + 1e-8)`` is the weighted mix of their
tokens, and ``P`` holds the (group, position) pairs with one. The schedule over training, with
``p = min(step / distill_steps, 1)``: ``lambda(t) = lambda_max (e^{gamma p} - 1) / (e^gamma - 1)``
grows, ``tau(t) = max(tau_max (1 - p)^tau_power, 1e-6)`` shrinks. Every child of a group is scored on
the same state, so ``log pi_theta(u | s_g)_j`` is the log-prob a child with token ``u`` at ``j`` got
in its own row: the term needs no forward of its own.

Source: THU-BPM/d-TreeRPO @ 3eb6f21, ``dtreerpo/dtreerpo_trainer.py``: tree, values and sibling
advantages L238-472 (values L359-370, advantages L395-410, rows L412-469, scoring L165-214),
sampler L489-642, loss L757-928 (PPO L790-802, KL L804-812, self-distillation L814-902);
``dtreerpo/slurm_scripts/dtreerpo.yaml``: eps 0.4, beta 0.01, 12 iterations, tree_branch_factor 4,
tree_contraction_factor 2, num_tree_samples 4 (branch points [128, 64] of 128 steps, 16 leaves),
lambda_max 3e-3, gamma 2, tau_max 2, beta_tau 0.7, max_steps 30000, lr 3e-5, LoRA r128 on a 4-bit
base, temperature 0.9, block 32.

Deviations, each with its reason (the loss is transcribed: ``tests/unit/rl/test_dtreerpo.py``):

- Update schedule: one rollout (every tree of the batch) feeds ``objective.mu`` updates on all of its
  edges. The public trainer buffers the edges packed by parent and trains one parent's edges (of
  every prompt in the micro-batch) for 12 steps, then the next parent's, drawing a new tree once the
  buffer is empty, with every old log-prob taken at tree time; the PPO mean, the KL mean and the
  self-distillation mean are then over one parent's rows, here over every edge of the rollout. The
  buffer is a data-loading choice; the module has one rollout per training step.
- Trained tokens: newly decoded and up to the child's first EOS, not pinned (a task's given tokens
  are never masked, so never newly decoded). The public mask also drops a token whose log-prob is
  exactly 0 (``changed_mask = new_logps != 0``): a probability-1 token, a no-op in the PPO term but
  not in the count ``|T_k|``; here it counts. ``task.loss_mask=reward`` is not applied (edges are
  partial states the reward never read).
- The self-distillation target's log-probs come from the children's own rows on the shared parent
  state (the same values and gradients as the public extra forward on the group's first parent copy,
  ``tests/unit/rl/test_dtreerpo.py``); the public code's ``nan_to_num`` of advantages is not needed
  (rewards here are finite).
- ``t`` is the optimizer steps taken (the public ``global_step``); ``objective.distill_steps``
  stands for the public ``max_steps`` (30000) and does not follow ``trainer.max_steps``: a 200-step
  run keeps ``lambda`` below 1e-5, as the public schedule does in its first 200 steps.
- The reference of the KL is the project's reference policy (the warm start), the public code's the
  LoRA base with the adapter disabled: the same model where the run trains a LoRA on the warm start.
- No behaviour correction: a child's tokens were committed over several sampler steps, not from the
  parent state the row scores, so the sampler's log-probs are not this row's (``tis`` refused).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.trace import masked_logps
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.objectives.base import OBJECTIVES, LogpUnits, Objective, StepContext
from diffusion_rl.rl.objectives.config import LikelihoodNeed, ObjectiveConfig, check_clip
from diffusion_rl.rl.objectives.losses import agg_loss, ratio_metrics
from diffusion_rl.sampling.sampler import completion_mask

DISTILL_EPS = 1e-8  # the public q normaliser and log guard
TAU_MIN = 1e-6  # the public floor of tau(t)


@dataclass
class DTreeRPOConfig(ObjectiveConfig):
    name: str = "dtreerpo"
    mu: int = 12  # public num_iterations: 12 updates per parent's rows
    beta: float = 0.01  # public beta (k3 KL to the reference)
    eps: float = 0.4  # public epsilon, both sides
    distill: bool = True  # public enable_self_distillation_loss
    lambda_max: float = 3e-3  # public self_distillation_lambda_max
    gamma: float = 2.0  # public self_distillation_gamma: how late lambda grows
    tau_max: float = 2.0  # public self_distillation_tau_max
    tau_power: float = 0.7  # public self_distillation_beta: tau(t) = tau_max (1 - p)^tau_power
    distill_steps: int = 30000  # public max_steps: the schedule's horizon

    def validate(self) -> None:
        super().validate()
        check_clip(self.eps)
        for key in ("lambda_max", "gamma", "tau_max", "tau_power"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"objective.{key}", getattr(self, key), "must be > 0")
        if self.distill_steps < 1:
            raise ConfigError("objective.distill_steps", self.distill_steps, "must be >= 1")
        if self.behaviour_correction != "none":
            raise ConfigError("objective.behaviour_correction", self.behaviour_correction,
                              "must be none with objective=dtreerpo (a row's tokens were not committed from its state)")


def schedule(cfg: DTreeRPOConfig, step: int) -> tuple[float, float]:
    """``(lambda(t), tau(t))`` of the self-distillation term at optimizer step ``step``."""
    p = min(1.0, max(0.0, step / cfg.distill_steps))
    lam = cfg.lambda_max * (math.exp(cfg.gamma * p) - 1.0) / (math.exp(cfg.gamma) - 1.0)
    return lam, max(cfg.tau_max * max(0.0, 1.0 - p) ** cfg.tau_power, TAU_MIN)


def dtreerpo_loss(
    logp: torch.Tensor,  # (K, L) log-prob of each edge's child tokens on its parent state, with grad
    old_logp: torch.Tensor,  # (K, L) the old policy's
    advantages: torch.Tensor,  # (K, 1) each edge's sibling advantage
    mask: torch.Tensor,  # (K, L) the trained tokens
    cfg: DTreeRPOConfig,
    *,
    group_size: int,
    surrogate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """d-TreeRPO's PPO term: clipped on both sides, token mean per edge, mean over edges (a pure
    function; ``group_size`` and ``surrogate`` are not used). The KL and the self-distillation term
    are added by :class:`DTreeRPO`."""
    m = mask.bool()
    d = torch.where(m, logp - old_logp.detach(), torch.zeros_like(logp))  # (K, L)
    ratio = torch.exp(d)
    clipped = torch.clamp(ratio, 1 - cfg.eps, 1 + cfg.eps)
    surr = torch.min(ratio * advantages, clipped * advantages)  # (K, L)
    loss = -agg_loss(surr, mask, "seq-mean-token-mean")
    return loss, ratio_metrics(d, mask, ratio < 1 - cfg.eps, ratio > 1 + cfg.eps)


def self_distillation(logp: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
                      groups: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The self-distillation KL mean and its (group, position) count.

    logp (K, L) each row's log-prob of its own token under its parent state (with grad); tokens (K, L);
    mask (K, L) its trained positions; advantages (K,); groups (K,) its parent (rows with one parent
    share a state). Per group, the rows with ``A > 0`` weigh ``softmax(A / tau)``; at each position
    the KL of their weighted token mix ``q`` to the policy is ``sum_rows w/W (log(q_row + eps) - logp)``
    (``q_row``: the mix's mass on the row's token, ``W``: the weight of the rows there), which is
    ``sum_u q(u) (log(q(u) + eps) - log pi(u))`` written per row."""
    K = logp.shape[0]
    same = groups[:, None] == groups[None, :]  # (K, K)
    sizes = same.sum(-1)  # (K,)
    pos = (advantages > 0) & (sizes > 1)  # a group of one row is skipped (public idxs.numel() <= 1)
    a = torch.where(pos, advantages / tau, torch.full_like(advantages, -torch.inf))  # (K,)
    top = torch.where(same & pos[None, :], a[None, :], torch.full((K, K), -torch.inf, dtype=a.dtype,
                                                                   device=a.device)).amax(-1)  # (K,) group max
    e = torch.where(pos, torch.exp(a - top), torch.zeros_like(a))  # (K,)
    w = e / (same.to(e.dtype) @ e).clamp_min(torch.finfo(e.dtype).tiny)  # (K,) softmax within the group
    act = mask.bool() & pos[:, None]  # (K, L) rows of a positive child that decoded the position
    wa = w[:, None] * act.to(w.dtype)  # (K, L)
    W = torch.einsum("kr,rl->kl", same.to(w.dtype), wa)  # (K, L) the group's weight at each position
    match = same[:, :, None] & (tokens[:, None, :] == tokens[None, :, :])  # (K, K, L) same group, same token
    q = torch.einsum("krl,rl->kl", match.to(w.dtype), wa) / (W + DISTILL_EPS)  # (K, L) mix mass of the token
    per_row = wa / (W + DISTILL_EPS) * (torch.log(q + DISTILL_EPS) - logp)  # (K, L)
    per_row = torch.where(act, per_row, torch.zeros_like(per_row))
    # the (group, position) pairs with weight, each counted once: at the group's first row
    idx = torch.arange(K, device=logp.device)
    first = idx[None, :].expand(K, K).masked_fill(~same, K).amin(-1) == idx  # (K,)
    count = ((W > 0) & first[:, None]).sum()
    total = per_row.sum()
    return total / count.clamp_min(1), count


@dataclass
class TreeEdges:
    """Every edge of one rollout's trees, a row each, shared by its inner updates."""

    row: torch.Tensor  # (K,) the prompt row of each edge
    child: torch.Tensor  # (K, L) the child state
    masked: torch.Tensor  # (K, L) the positions masked in the parent state
    trained: torch.Tensor  # (K, L) those the child commits, up to its EOS
    advantages: torch.Tensor  # (K,) each edge's advantage
    groups: torch.Tensor  # (K,) the parent of each edge, unique over the processes
    policy_logp: torch.Tensor | None = None  # (K, L) the policy's, with gradients, of this inner update


@OBJECTIVES.register("dtreerpo")
class DTreeRPO(Objective):
    config_class = DTreeRPOConfig
    cfg: DTreeRPOConfig
    policy_loss = staticmethod(dtreerpo_loss)
    # the rollout's leaf advantages are not used: the edges' come from the tree (rl/tree.py)
    advantage_estimators: ClassVar[tuple[str, ...]] = ("group", "group_std", "loo")
    needs_tree = True
    needs_likelihood = LikelihoodNeed("objective=dtreerpo scores each edge on its parent state in one forward; "
                                      "leave likelihood at one_step", one_step=True)
    eos_id: int | None = None  # the model's (bind)

    def bind(self, bundle) -> None:
        self.eos_id = int(bundle.eos_token_id)

    # ---- the edges of the rollout's trees -----------------------------------------------
    def edges(self, ctx: StepContext) -> TreeEdges:
        """Every edge of the rollout's trees (the plan its inner updates share)."""
        return self.plan(ctx)

    def make_plan(self, ctx: StepContext) -> TreeEdges:
        tree = ctx.rollout.tree
        assert tree is not None and tree.advantages is not None, "objective=dtreerpo needs a tree rollout"
        k = tree.edges  # (K,)
        child, parent = tree.states[k], tree.states[tree.parent[k]]  # (K, L)
        mask_id = self.likelihood.mask_id
        assert self.eos_id is not None, "DTreeRPO.bind was not called"
        trained = (parent == mask_id) & (child != mask_id) & completion_mask(child, self.eos_id).bool()
        groups = tree.parent[k] + ctx.rollout.shard.rank * tree.states.shape[0]  # unique over processes
        return TreeEdges(tree.row[k], child, parent == mask_id, trained, tree.advantages[k].float(), groups)

    def logp_units(self, ctx: StepContext, forward: Forward, role: str) -> LogpUnits:
        e, ro = self.edges(ctx), ctx.rollout
        r = e.row
        logp = masked_logps(forward, ro.prompt_ids[r], ro.prompt_mask[r], e.child, e.masked, e.trained,
                            self.likelihood.mask_id)  # (K, L)
        mask = e.trained.to(logp.dtype)
        if role == "policy":
            e.policy_logp = logp
        return LogpUnits(logp, mask)

    def unit_advantages(self, ctx: StepContext) -> torch.Tensor:
        return self.edges(ctx).advantages[:, None]  # (K, 1)

    def sampler_units(self, ctx: StepContext) -> torch.Tensor | None:
        return None  # a child's tokens were committed over several steps, not from the parent state

    def loss(self, ctx: StepContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, metrics = super().loss(ctx)
        lam, tau = schedule(self.cfg, ctx.step)
        e, g = self.edges(ctx), ctx.rollout.shard.gather
        metrics.update({"dtreerpo/lambda": torch.tensor(lam), "dtreerpo/tau": torch.tensor(tau),
                        "dtreerpo/edges": torch.tensor(float(e.row.numel())),
                        "dtreerpo/adv_abs": g(e.advantages).abs().mean()})
        if self.cfg.distill:
            assert e.policy_logp is not None, "the template scores the policy before the loss"
            sd, count = self_distillation(g(e.policy_logp), g(e.child), g(e.trained),
                                          g(e.advantages), g(e.groups), tau)
            loss = loss + lam * sd
            metrics.update({"dtreerpo/distill": sd.detach(), "dtreerpo/distill_pairs": count.float()})
        return loss, metrics
