"""Step selectors for EGSPO: which ``K`` of a rollout's ``T`` denoising steps each sample trains on.

Every selector is a pure function ``(entropies (B, T), K, candidates (B, T) bool | None,
generator | None) -> indices (B, K)`` registered in :data:`SELECTORS` (``objective.select``):

- ``entropy`` (EGSPO's default): the ``K`` candidate steps of highest recorded entropy ``H_s``, in
  decreasing entropy order, so slot ``k`` is the sample's ``k``-th highest-entropy step (EGSPO-SA's
  slots); ties go to the earlier step.
- ``random``: the last candidate step plus ``K - 1`` others drawn without replacement from a local
  generator; in increasing step order.
- ``uniform``: ``K`` evenly spaced candidate steps ending at the last one (``n`` candidates: the
  ``floor((k + 1) n / K) - 1``-th, e.g. steps 15, 31, ..., 127 for ``n = 128, K = 8``).
- ``low_entropy`` (an ablation, the opposite of EGSPO's rule): the ``K`` candidate steps of lowest
  entropy, lowest first. The paper's bound predicts it approximates the full gradient worst.

``candidates`` restricts the choice (``stop_at_last_content``: steps up to the last one that committed
a token of the answer, :func:`steps_up_to`); ``None`` means all steps. A sample with fewer than ``K``
candidates gets ``-1`` in its unused slots; callers mask those slots out.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from diffusion_rl.core.registry import Registry

Selector = Callable[..., torch.Tensor]
SELECTORS: Registry[Selector] = Registry("objective.select")


def steps_up_to(last: torch.Tensor, num_steps: int) -> torch.Tensor:
    """Candidate mask of steps ``0..last[b]``; a row with ``last < 0`` keeps every step. (B,) -> (B, T)"""
    last = torch.where(last < 0, torch.full_like(last, num_steps - 1), last)
    return torch.arange(num_steps, device=last.device)[None, :] <= last[:, None]


def _candidates(entropies: torch.Tensor, candidates: torch.Tensor | None) -> torch.Tensor:
    return torch.ones_like(entropies, dtype=torch.bool) if candidates is None else candidates.bool()


def _per_row(entropies: torch.Tensor, K: int, candidates: torch.Tensor | None,
             pick: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Each row's candidate steps in increasing order: all of them when there are at most ``K``, else
    ``pick(steps)``, ``K`` of them in step order; ``-1`` in the slots left over. (B, T) -> (B, K)"""
    cand = _candidates(entropies, candidates).cpu()
    out = torch.full((cand.shape[0], K), -1, dtype=torch.long, device=entropies.device)
    for b in range(cand.shape[0]):
        steps = cand[b].nonzero()[:, 0]  # (n,) increasing
        row = steps if steps.numel() <= K else pick(steps)
        out[b, : row.numel()] = row
    return out


def top_k_steps(score: torch.Tensor, K: int, candidates: torch.Tensor | None = None,
                lowest: bool = False) -> torch.Tensor:
    """The ``K`` candidate steps of highest ``score``, highest first, ties to the earlier step
    (``lowest``: of lowest score, lowest first); ``-1`` in the slots left over. (B, T) -> (B, K)

    The rule behind ``entropy`` and ``low_entropy``, and MDPO's choice of the steps of largest ``|A|``."""
    cand = _candidates(score, candidates)
    fill = float("inf") if lowest else float("-inf")
    masked = score.float().masked_fill(~cand, fill)  # (B, T)
    order = masked.argsort(dim=-1, descending=not lowest, stable=True)[:, :K]  # (B, min(K, T))
    ok = cand.gather(-1, order)
    idx = torch.full((score.shape[0], K), -1, dtype=torch.long, device=score.device)
    idx[:, : order.shape[1]] = order.masked_fill(~ok, -1)
    return idx


@SELECTORS.register("entropy")
def select_entropy(entropies: torch.Tensor, K: int, candidates: torch.Tensor | None = None,
                   generator: torch.Generator | None = None, lowest: bool = False) -> torch.Tensor:
    """Top-``K`` candidate steps by entropy, highest first (``lowest``: bottom-``K``, lowest first).
    (B, T) -> (B, K)"""
    return top_k_steps(entropies, K, candidates, lowest)


@SELECTORS.register("low_entropy")
def select_low_entropy(entropies: torch.Tensor, K: int, candidates: torch.Tensor | None = None,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """Bottom-``K`` candidate steps by entropy, lowest first. (B, T) -> (B, K)"""
    return select_entropy(entropies, K, candidates, generator, lowest=True)


@SELECTORS.register("random")
def select_random(entropies: torch.Tensor, K: int, candidates: torch.Tensor | None = None,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """The last candidate step and ``K - 1`` random others, in step order. (B, T) -> (B, K)"""

    def pick(steps: torch.Tensor) -> torch.Tensor:  # (n,) -> (K,), n > K
        others = steps[:-1][torch.randperm(steps.numel() - 1, generator=generator)[: K - 1]]
        return torch.cat([others.sort().values, steps[-1:]])

    return _per_row(entropies, K, candidates, pick)


@SELECTORS.register("uniform")
def select_uniform(entropies: torch.Tensor, K: int, candidates: torch.Tensor | None = None,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """``K`` evenly spaced candidate steps ending at the last one, in step order. (B, T) -> (B, K)"""

    def pick(steps: torch.Tensor) -> torch.Tensor:  # (n,) -> (K,), n > K
        n = steps.numel()
        return steps[(torch.arange(1, K + 1) * n) // K - 1]  # strictly increasing since n > K, last = n - 1

    return _per_row(entropies, K, candidates, pick)
