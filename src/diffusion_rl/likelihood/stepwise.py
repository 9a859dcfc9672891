"""The stepwise likelihood of EGSPO (docs/methods.md §3): ``log pi(step s)`` from the state before
step ``s``.

    log pi(step s) = sum_{i in U_s} log softmax(f(x_s))_i[x_i]      (reduce="mean": divided by |U_s|)

where ``x_s`` is the partially masked state before step ``s``, ``U_s`` the positions committed at
``s`` and ``x_i`` the committed tokens; temperature 1, as the trajectory recorder uses. The
probability of *which* positions were chosen is ignored, as in the paper's code. One batched forward
covers every (sample, selected step) row. ``reduce="token"`` keeps the terms of the sum apart, one
per committed position (CJ-GRPO's per-token ratios on every transition). Not registered in
``LIKELIHOODS``: it scores a step of a recorded trajectory, not a ``(prompt, completion)`` pair, so
EGSPO and CJ-GRPO call it directly.
"""

from __future__ import annotations

import torch

from diffusion_rl.likelihood.base import forward_logps


def stepwise_logps(
    forward,  # (ids, attention_mask) -> logits (N, P+L, V)
    states: torch.Tensor,  # (N, P+L) state before the step, one row per (sample, step)
    attn: torch.Tensor | None,  # (N, P+L) 1 = real token, or None
    committed: torch.Tensor,  # (N, P+L) bool, positions committed at the step
    tokens: torch.Tensor,  # (N, P+L) the committed tokens at those positions (others ignored)
    reduce: str = "sum",
) -> torch.Tensor:
    """Per-row log-probability of the step's committed tokens -> (N,); with ``reduce="token"`` each
    committed token's -> (N, P+L), 0 elsewhere."""
    if reduce not in ("sum", "mean", "token"):
        raise ValueError(f"reduce={reduce!r}: allowed sum, mean, token")
    logp = forward_logps(forward, states, attn, tokens, 0, select=committed)  # (N, P+L), 0 where not committed
    if reduce == "token":
        return logp
    total = logp.sum(-1)  # (N,)
    if reduce == "mean":
        total = total / committed.sum(-1).clamp_min(1).to(total.dtype)
    return total
