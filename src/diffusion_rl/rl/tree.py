"""Tree rollouts (``rollout.tree.branches``): a prompt's completions grow as a tree of partial states.

Each prompt's tree starts from its start canvas (every position masked, the task's pinned tokens in
place). At a *branch point* a node's state is copied into ``branches[d]`` children and each child
continues the sampler's schedule on its own random numbers until the next branch point; the
children of the last branch point run to the end of the schedule and are the tree's leaves, the
prompt's group of ``prod(branches)`` completions. A branch point is a number of denoising steps
*remaining* (``branch_steps``, descending); by default the points are evenly spaced from the start,
``T, T - T/s, ..., T/s`` for ``s = len(branches)`` and ``T = sampler.steps`` (d-TreeRPO's
``tree_contraction_factor s``). With the fixed schedule the number of steps remaining fixes the
number of masked tokens remaining (``steps`` per block, ``num_transfer_tokens`` per step), so a
branch point of ``T/2`` steps is a state with half of the completion still masked. When the first
branch point is below ``T`` the roots are first decoded, one sample per prompt, down to it.

A :class:`Tree` keeps every node's state, its parent, depth and the rollout row (leaf) below it that
names its prompt; after the rewards it holds every node's value (the mean of its children's, a
leaf's its reward) and its sibling advantage (its value minus the mean of its siblings' values,
d-TreeRPO's local advantage). The leaves are the rollout's rows, prompt-major, so an objective that
reads only ``Rollout.advantages`` (GRPO with the group advantage over the leaves) trains on tree
rollouts unchanged; d-TreeRPO (``rl/objectives/dtreerpo.py``) trains on every (parent, child) edge.

Noise: node ``i`` at depth ``d`` of the tree of global prompt ``g`` draws from its own generator,
keyed by ``(seed, rollout id, d, g, i)``: the number of processes changes no tree.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.core.seeding import mix_seed
from diffusion_rl.sampling.noise import RowNoise
from diffusion_rl.sampling.sampler import SampleOutput, SamplerConfig

# (prompt ids (B, P), prompt mask (B, P), canvas (B, L), noise, start step, stop step) -> the sampler's output
Grow = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, RowNoise, int, int], SampleOutput]


@dataclass
class TreeConfig:
    """``rollout.tree:`` keys. ``branches: []`` (default) is the plain rollout: G independent samples."""

    # children of every node at each branch point, root first; the leaves (their product) are a
    # prompt's group. d-TreeRPO's public tree: [4, 4] (num_tree_samples 4, tree_branch_factor 4)
    branches: list[int] = field(default_factory=list)
    # denoising steps remaining at each branch point, descending, the first <= sampler.steps; null:
    # evenly spaced from the start (sampler.steps x [1, 1 - 1/s, ...], the public code's)
    branch_steps: list[int] | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.branches)

    @property
    def leaves(self) -> int:
        return math.prod(self.branches)

    def steps_remaining(self, total: int) -> list[int]:
        """The branch points in steps remaining, descending (the public ``branch_points`` without its 0)."""
        if self.branch_steps is not None:
            return list(self.branch_steps)
        s = len(self.branches)
        return [total - (k * total) // s for k in range(s)]

    def validate(self, sampler: SamplerConfig | None = None) -> None:
        if not self.enabled:
            if self.branch_steps:
                raise ConfigError("rollout.tree.branch_steps", self.branch_steps, "needs rollout.tree.branches")
            return
        if any(b < 1 for b in self.branches) or self.leaves < 2:
            raise ConfigError("rollout.tree.branches", self.branches,
                              "children per branch point, each >= 1, at least 2 leaves in all")
        if self.branch_steps is not None and len(self.branch_steps) != len(self.branches):
            raise ConfigError("rollout.tree.branch_steps", self.branch_steps,
                              f"one per branch point: {len(self.branches)} (as rollout.tree.branches)")
        if sampler is None:
            return
        if sampler.decode != "fixed":
            raise ConfigError("sampler.decode", sampler.decode,
                              "must be fixed with rollout.tree (a branch point is a step of the fixed schedule)")
        points = self.steps_remaining(sampler.steps)
        if not (sampler.steps >= points[0] and points[-1] >= 1 and all(a > b for a, b in zip(points, points[1:]))):
            raise ConfigError("rollout.tree.branch_steps", points,
                              f"steps remaining, strictly descending, each in 1 .. sampler.steps={sampler.steps}")


@dataclass
class Tree:
    """Every node of this process's trees, level by level (roots, their children, ...), each level
    parent-major, so the leaves come last in the rollout's row order. ``M`` nodes, ``n`` leaves."""

    states: torch.Tensor  # (M, L) each node's completion: mask id where still masked
    parent: torch.Tensor  # (M,) long: the parent node, -1 for a root
    depth: torch.Tensor  # (M,) long: 0 for a root, len(branches) for a leaf
    row: torch.Tensor  # (M,) long: the first rollout row (leaf) below the node: its prompt's row
    leaf: torch.Tensor  # (n,) long: the node of each rollout row
    values: torch.Tensor | None = None  # (M,) float: mean of the children's values (a leaf: its reward)
    advantages: torch.Tensor | None = None  # (M,) float: value - mean of the siblings' values (0 at a root)

    @property
    def edges(self) -> torch.Tensor:
        """(E,) the nodes with a parent: one (parent state, child state) training row each."""
        return (self.parent >= 0).nonzero()[:, 0]

    def score(self, rewards: torch.Tensor) -> Tree:
        """This tree with the values and sibling advantages of the leaves' rewards (n,)."""
        values = node_values(self.parent, self.leaf, rewards.to(torch.float32))
        return Tree(self.states, self.parent, self.depth, self.row, self.leaf, values,
                    sibling_advantages(self.parent, values))


def node_values(parent: torch.Tensor, leaf: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """(M,) each node's value: a leaf's reward, else the mean of its children's values (bottom-up)."""
    M = parent.shape[0]
    values = torch.zeros(M, dtype=rewards.dtype, device=rewards.device)
    values[leaf] = rewards
    done = torch.zeros(M, dtype=torch.bool, device=parent.device)
    done[leaf] = True
    while not bool(done.all()):
        has_child = (parent >= 0) & done  # children whose value is known
        sums = torch.zeros_like(values).index_add_(0, parent[has_child], values[has_child])
        counts = torch.zeros_like(values).index_add_(0, parent[has_child], torch.ones_like(values[has_child]))
        pending = torch.zeros(M, dtype=torch.bool, device=parent.device)
        pending[parent[(parent >= 0) & ~done]] = True  # a node waits for every child
        ready = ~done & ~pending & (counts > 0)
        if not bool(ready.any()):
            raise ValueError("a node without children is not a leaf: the tree is incomplete")
        values[ready] = sums[ready] / counts[ready]
        done |= ready
    return values


def sibling_advantages(parent: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(M,) ``value - mean of the other children of the same parent`` (0 for a root or an only child)."""
    has = parent >= 0
    idx = parent.clamp_min(0)
    sums = torch.zeros_like(values).index_add_(0, idx[has], values[has])
    counts = torch.zeros_like(values).index_add_(0, idx[has], torch.ones_like(values[has]))
    others = (counts[idx] - 1).clamp_min(1)
    mean_others = torch.where(counts[idx] > 1, (sums[idx] - values) / others, torch.zeros_like(values))
    return torch.where(has, values - mean_others, torch.zeros_like(values))


def grow_trees(cfg: TreeConfig, total_steps: int, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
               start: torch.Tensor, grow: Grow, key: int,
               first_prompt: int) -> tuple[Tree, list[SampleOutput | None]]:
    """Grow one tree per prompt. ``prompt_ids`` / ``prompt_mask`` (n, P) and ``start`` (n, L), the
    start canvas, are the rollout's rows (``prod(branches)`` consecutive rows per prompt); ``grow`` runs
    the sampler over a part of the schedule; ``first_prompt`` is the global index of this process's
    first prompt (the noise keys). -> the tree (no values yet) and the sampler's output of each level,
    roots first (None for the roots unless a trunk was decoded)."""
    n, G = start.shape[0], cfg.leaves
    if n % G:
        raise ValueError(f"{n} rows are not whole trees of {G} leaves")
    R = n // G
    points = cfg.steps_remaining(total_steps)
    roots = torch.arange(R, device=start.device) * G  # (R,) the first row of each prompt
    states, parents, depths, rows = [start[roots]], [torch.full((R,), -1, device=start.device)], [0], [roots]
    outputs: list[SampleOutput | None] = [None]
    if points[0] < total_steps:  # one trunk per prompt down to the first branch point
        noise = RowNoise([mix_seed(key, 0, first_prompt + g, 0) for g in range(R)])
        trunk = grow(prompt_ids[roots], prompt_mask[roots], states[0], noise, 0, total_steps - points[0])
        outputs[0], states[0] = trunk, trunk.completion
    first = 0  # index of the current level's first node
    for d, (b, at) in enumerate(zip(cfg.branches, points)):
        width = states[-1].shape[0]  # nodes at depth d
        per_tree = width // R
        parent = first + torch.arange(width, device=start.device).repeat_interleave(b)  # (width * b,)
        local = torch.arange(width * b, device=start.device)  # child index in its level
        below = G // (per_tree * b)  # leaves below each child
        row = (local // (per_tree * b)) * G + (local % (per_tree * b)) * below  # (width * b,)
        noise = RowNoise([mix_seed(key, d + 1, first_prompt + int(r) // G, int(i) % (per_tree * b))
                          for r, i in zip(row.tolist(), local.tolist())])
        stop = total_steps - (points[d + 1] if d + 1 < len(points) else 0)
        out = grow(prompt_ids[row], prompt_mask[row], states[-1].repeat_interleave(b, 0), noise,
                   total_steps - at, stop)
        outputs.append(out)
        first += width
        states.append(out.completion)
        parents.append(parent)
        depths.append(d + 1)
        rows.append(row)
    depth = torch.cat([torch.full((s.shape[0],), d, dtype=torch.long, device=start.device)
                       for s, d in zip(states, depths)])
    M = depth.shape[0]
    return Tree(torch.cat(states), torch.cat(parents).long(), depth, torch.cat(rows).long(),
                torch.arange(M - n, M, device=start.device)), outputs
