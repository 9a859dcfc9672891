"""The output head only where a caller needs it: logits at a slice of positions, or the log-probability
of given tokens through a chunked, fused log-softmax + gather.

At LLaDA's vocabulary (126,464 ids) the head's output dwarfs the rest of a forward: 256 rows x 456
tokens of fp32 logits are 59 GB, and autograd keeps them (and their softmax) for the backward. Every
policy network of the project (the embedded model, our LLaDA / Dream / SDAR, the ``model=hf`` wrapper)
takes three keyword arguments on top of ``input_ids`` / ``attention_mask`` / ``position_ids`` and routes
them through :func:`head_outputs`:

- ``keep=slice(a, b)``: ``.logits`` covers positions ``a .. b`` only, ``(B, b - a, V)`` (the sampler's
  current block);
- ``targets`` ``(B, b - a)`` with ``keep``: ``.token_logps`` ``(B, b - a)`` fp32, ``log softmax(logits)
  [target]`` at each position, and no ``.logits``; ``select`` ``(B, b - a)`` bool limits the work to the
  positions the caller reads (the others hold 0).

:func:`token_logps_chunked` computes the head on a chunk of tokens at a time (``HEAD_CHUNK_ELEMENTS``
logits: 265 tokens at LLaDA's vocabulary) and, when a gradient is needed, recomputes each chunk's
logits in the backward (activation checkpointing of the head alone), so neither pass holds more than
one chunk's ``(chunk, V)`` fp32 logits. The values are those of the
unchunked ``log_softmax(head(h))[target]``: the same operations on the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

HEAD_CHUNK_ELEMENTS = 1 << 25  # logits per chunk: 128 MiB in fp32 (265 tokens at LLaDA's 126,464-token vocabulary)
HEAD_CHUNK: int | None = None  # tokens per chunk instead (tests set it small); None: from HEAD_CHUNK_ELEMENTS
RECOMPUTE_ELEMENTS = 1 << 20  # below this many logits a chunk is kept for the backward instead of recomputed


@dataclass
class HeadOutput:
    """What a policy network returns: logits (at ``keep``), or target log-probs instead."""

    logits: torch.Tensor | None = None  # (B, R, V)
    token_logps: torch.Tensor | None = None  # (B, R) fp32, with ``targets``
    past_key_values: object | None = None  # with use_cache=True (models/policy.py KVCacheLM)


def _chunk_logps(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(head(hidden))[targets] in fp32. (n, D), (n,) -> (n,)"""
    logits = head(hidden).float()  # (n, V)
    return logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1)


def token_logps_chunked(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                        select: torch.Tensor | None = None, chunk: int | None = None) -> torch.Tensor:
    """``log softmax(head(hidden))[targets]`` without a full (B, R, V) tensor, forward or backward.

    hidden (B, R, D), targets (B, R), select (B, R) bool or None (every position) -> (B, R) fp32, 0
    where not selected.
    """
    B, R = targets.shape
    sel = torch.ones(B, R, dtype=torch.bool, device=targets.device) if select is None else select.bool()
    h, t = hidden[sel], targets[sel]  # (n, D), (n,)
    vocab = int(getattr(head, "out_features", 0) or head(h[:0]).shape[-1])
    chunk = chunk or HEAD_CHUNK or max(1, HEAD_CHUNK_ELEMENTS // max(vocab, 1))
    grad = torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in head.parameters()))
    parts = []
    for s in range(0, h.shape[0], chunk):
        hc, tc = h[s:s + chunk], t[s:s + chunk]
        if grad and hc.shape[0] * vocab >= RECOMPUTE_ELEMENTS:  # the backward recomputes the chunk's logits
            parts.append(checkpoint(_chunk_logps, head, hc, tc, use_reentrant=False))
        else:
            parts.append(_chunk_logps(head, hc, tc))
    flat = torch.cat(parts) if parts else h.new_zeros(0, dtype=torch.float32)  # (n,)
    out = flat.new_zeros(B, R)
    return out.masked_scatter(sel, flat)


def head_outputs(hidden: torch.Tensor, head: nn.Module, keep: slice | None = None,
                 targets: torch.Tensor | None = None, select: torch.Tensor | None = None) -> HeadOutput:
    """The head applied to final hidden states (B, L, D) where asked (see the module docstring)."""
    if keep is not None:
        hidden = hidden[:, keep]  # (B, R, D)
    if targets is None:
        if select is not None:
            raise ValueError("select needs targets (it picks the target positions to score)")
        return HeadOutput(logits=head(hidden))
    if targets.shape != hidden.shape[:2]:
        raise ValueError(f"targets {tuple(targets.shape)} must cover the kept positions {tuple(hidden.shape[:2])}")
    return HeadOutput(token_logps=token_logps_chunked(head, hidden, targets, select))


def logits_outputs(logits: torch.Tensor, keep: slice | None, targets: torch.Tensor | None,
                   select: torch.Tensor | None) -> HeadOutput:
    """:func:`head_outputs` from full logits (B, L, V) a model has already computed (a model whose
    head cannot be applied apart from its body): the same values, none of the memory saved."""
    if keep is not None:
        logits = logits[:, keep]
    if targets is None:
        return HeadOutput(logits=logits)
    lf = logits.float()
    out = lf.gather(-1, targets[..., None]).squeeze(-1) - lf.logsumexp(-1)  # (B, R)
    return HeadOutput(token_logps=out if select is None else out.masked_fill(~select.bool(), 0.0))


__all__ = ["HEAD_CHUNK", "HEAD_CHUNK_ELEMENTS", "HeadOutput", "head_outputs", "logits_outputs", "token_logps_chunked"]
