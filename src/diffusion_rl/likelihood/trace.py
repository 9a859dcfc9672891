"""TraceRL's trace likelihood: per-token log-probs along the sampler's own decoding order.

The rollout's :class:`~diffusion_rl.sampling.trajectory.TrajectoryRecorder` gives the step at which
every completion position was committed. Within a *segment* (the whole completion of a masked model,
each model block of a block model) the distinct steps, in order, are merged ``shrink`` at a time
into *rounds*; :func:`trace_rounds` gives each position its round. A training row ``(sample, r)``
masks every position whose round is ``>= r`` and trains on the positions of round ``r``:

    log pi_theta(x_i | state of round r)     for every i in round r            (one row per round)

- masked model (one segment): the row's input is the recorded state before the round's first step
  (``TrajectoryRecorder.state_before``), prompt + partially masked completion, one forward
  (:func:`masked_logps`);
- block model (one segment per block): round ``r`` of every block at once. Block ``b`` of the row is
  block ``b`` as the sampler saw it before its ``r``-th (merged) step, the sampler's context is the
  clean earlier blocks, and block ``b`` never attends later blocks; so one staircase forward
  ``[prompt ; clean ; noisy]`` (``likelihood/staircase.py``) scores every block of the row against
  its clean prefix (:func:`block_logps`). Per token this is the recorded state-before-step of the
  step that committed it (with ``shrink = 1``): the later blocks the recorded state holds masked are
  never attended by the block being decoded; only the batching into rows differs.

Positions the sampler never committed at a step (filled with EOS by ``sampler.stop_after_eos``, or
still masked) are masked in every row and trained in none. Not registered in ``LIKELIHOODS``: it
scores rounds of a recorded trajectory, not a ``(prompt, completion)`` pair (as ``stepwise.py``).

Source: TraceRL (Wang et al. 2025, arXiv:2509.06949), Gen-Verse/dLLM-RL @ 10b4fd1:
``train/rl_llada.py`` (``collapse_k_unique`` over the whole response, one row per merged step),
``train/rl_sdar.py`` (the same per block, ``one_round_vectorized`` and its staircase input).
"""

from __future__ import annotations

import torch

from diffusion_rl.likelihood.base import forward_logps
from diffusion_rl.likelihood.staircase import staircase_logps
from diffusion_rl.sampling.block import align_prompt
from diffusion_rl.sampling.trajectory import FILLED

NO_ROUND = torch.iinfo(torch.int32).max  # round of a position no step committed: masked in every row


def trace_rounds(commit_step: torch.Tensor, segment: int, shrink: int) -> torch.Tensor:
    """Round of every completion position. commit_step (n, L) -> (n, L) long.

    ``segment``: positions per segment (the block size of a block model, ``L`` for a masked one); a
    position's round is the rank of its step among the distinct steps of its segment, integer-divided
    by ``shrink``. Positions no step committed (``< 0`` or ``>= FILLED``) get :data:`NO_ROUND`.
    """
    n, L = commit_step.shape
    s = commit_step.long()
    valid = (s >= 0) & (s < FILLED)  # (n, L)
    key = torch.where(valid, s, torch.full_like(s, FILLED)).view(n, L // segment, segment)  # (n, nseg, w)
    ordered, idx = key.sort(-1)
    new = torch.ones_like(ordered, dtype=torch.long)
    new[..., 1:] = (ordered[..., 1:] != ordered[..., :-1]).long()  # 1 where a new distinct step starts
    rank = torch.empty_like(ordered).scatter_(-1, idx, new.cumsum(-1) - 1).view(n, L)  # (n, L)
    return torch.where(valid, rank // shrink, torch.full_like(rank, NO_ROUND))


def round_rows(rounds: torch.Tensor, trainable: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The training rows of every sample, sample-major, round-minor (the public code's order): the
    rounds that hold at least one trainable position. rounds, trainable (n, L) -> sample (M,), round (M,)"""
    if rounds.numel() == 0:
        return rounds.new_zeros(0), rounds.new_zeros(0)
    top = int(torch.where(rounds == NO_ROUND, -1, rounds).max().clamp_min(0)) + 1
    r = torch.arange(top, device=rounds.device)  # (R,)
    has = ((rounds[:, None, :] == r[None, :, None]) & trainable.bool()[:, None, :]).any(-1)  # (n, R)
    sample, rnd = has.nonzero(as_tuple=True)  # row-major: sample-major
    return sample, rnd


def row_masks(rounds: torch.Tensor, sample: torch.Tensor, rnd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the positions masked (round >= r) and decoded in the round (round == r). -> (M, L) bool each"""
    rr = rounds[sample]  # (M, L)
    r = rnd[:, None]  # (M, 1)
    return rr >= r, rr == r


def masked_logps(forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion: torch.Tensor,
                 masked: torch.Tensor, select: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Masked model: ``log p(completion_i)`` from one forward of ``[prompt ; completion masked where
    masked]``, read at ``select``. prompt (M, P), completion / masked / select (M, L) -> (M, L)"""
    noisy = completion.masked_fill(masked, mask_id)
    ids = torch.cat([prompt_ids, noisy], 1)  # (M, P+L)
    attn = None
    if not bool(prompt_mask.all()):  # as the sampler: an attention mask only with padding
        attn = torch.cat([prompt_mask.long(), torch.ones_like(completion)], 1)
    return forward_logps(forward, ids, attn, completion, prompt_ids.shape[1], select=select)


def block_logps(forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion: torch.Tensor,
                masked: torch.Tensor, select: torch.Tensor, mask_id: int, block_size: int) -> torch.Tensor:
    """Block model: every block of each row against its clean prefix, in one staircase forward.
    prompt (M, P), completion / masked / select (M, L) -> (M, L)"""
    prompt_ids, prompt_mask, _ = align_prompt(prompt_ids, prompt_mask, block_size, mask_id)
    noisy = completion.masked_fill(masked, mask_id)
    return staircase_logps(forward, prompt_ids, prompt_mask, completion, noisy, block_size, select=select)
