"""The exact log-probability of a completion decoded left to right, one token per forward.

A masked diffusion model sampled with blocks of one token (``sampler.block_length = 1``, ``steps =
gen_length``) draws token ``t`` from its distribution at position ``t`` of the input
``[prompt | x_<t | MASK ...]``: the earlier tokens visible, ``x_t`` and every later one masked. That
distribution is the policy's, exactly, so the log-probability of a completion is a sum of these
conditionals, each read from its own input (:func:`left_to_right_logps`)::

    log pi(x_t | prompt, x_<t) = log softmax(f([prompt | x_<t | MASK_{L-t}]))_{P+t}[x_t]

A task's pinned tokens (Sudoku's givens: in the canvas from the start, ``Task.pinned_completion``) are
visible in every input and are never scored, as the sampler never draws them.

No single forward gives every position's conditional: the inputs differ for each ``t``, and in a
bidirectional model the logits at ``t`` depend on whether the tokens after it are masked
(``tests/unit/likelihood/test_left_to_right.py`` shows the tiny model's do). A completion of ``L`` scored tokens costs
``L`` rows; the rows of a batch go through the model as one batch, or ``rows_per_forward`` at a time,
each chunk under activation checkpointing so that a backward holds one chunk's activations at a time
(the public code backpropagates position by position for the same reason).

Not registered in ``LIKELIHOODS``: the value is the policy's log-probability only for completions a
left-to-right sampler drew (``objective=justgrpo`` makes its rollouts so), not for any
``(prompt, completion)`` pair.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from diffusion_rl.likelihood.trace import masked_logps


def left_to_right_rows(score: torch.Tensor, pinned: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor,
                                                                                 torch.Tensor, torch.Tensor]:
    """One row per scored position, sample-major: its sample (M,), position (M,), the completion
    positions the row masks (M, L: the position itself and every later one that is not pinned) and the
    one it reads (M, L). ``score`` (n, L) bool, ``pinned`` (n, L) bool or None."""
    sample, pos = score.nonzero(as_tuple=True)  # (M,) each
    ar = torch.arange(score.shape[1], device=score.device)  # (L,)
    masked = ar[None, :] >= pos[:, None]  # (M, L)
    if pinned is not None:
        masked = masked & ~pinned[sample]
    return sample, pos, masked, ar[None, :] == pos[:, None]


def left_to_right_logps(forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion: torch.Tensor,
                        score: torch.Tensor, mask_id: int, pinned: torch.Tensor | None = None,
                        rows_per_forward: int = 0) -> torch.Tensor:
    """``log pi(x_t | prompt, x_<t)`` at every position of ``score``, 0 elsewhere, fp32.

    prompt (n, P), completion / score / pinned (n, L) -> (n, L). ``rows_per_forward`` (0: all rows in
    one call) cuts the rows into chunks; with gradients each chunk is checkpointed (its forward runs
    again in the backward), so the activations of one chunk are held at a time.
    """
    n, L = completion.shape
    sample, pos, masked, select = left_to_right_rows(score.bool(), pinned)
    if sample.numel() == 0:  # nothing to score: one row keeps the result on the graph, with value and gradient 0
        sample, pos = sample.new_zeros(1), pos.new_zeros(1)
        masked, select = torch.ones(1, L, dtype=torch.bool, device=completion.device), select.new_zeros(1, L)
        select[:, 0] = True
        empty = True
    else:
        empty = False

    def rows(s: torch.Tensor, m: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:  # (m,) the chunk's log-probs
        return masked_logps(forward, prompt_ids[s], prompt_mask[s], completion[s], m, sel, mask_id).sum(-1)

    M = sample.numel()
    size = rows_per_forward or M
    parts = []
    for a in range(0, M, size):
        args = (sample[a:a + size], masked[a:a + size], select[a:a + size])
        if rows_per_forward and torch.is_grad_enabled():
            parts.append(checkpoint(rows, *args, use_reentrant=False))
        else:
            parts.append(rows(*args))
    lp = torch.cat(parts)  # (M,)
    if empty:
        return torch.zeros(n, L, dtype=lp.dtype, device=lp.device) + 0.0 * lp.sum()
    return torch.zeros(n, L, dtype=lp.dtype, device=lp.device).index_put((sample, pos), lp)  # (n, L)
