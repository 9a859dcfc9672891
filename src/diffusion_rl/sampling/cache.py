"""Where a denoising step's logits come from: a full forward, or a prefix / dual key-value cache
(Fast-dLLM; docs/methods.md §10). Used by :func:`~diffusion_rl.sampling.sampler.generate`.

- ``kv_cache=none``: one forward over the whole sequence every step (the exact sampler of
  docs/methods.md §2).
- ``kv_cache=prefix``: at a block's first step, one full forward (it serves as that step) whose keys
  and values of everything *before* the block are kept; the block's later steps run the block and
  the masked suffix after it against them.
- ``kv_cache=dual``: the same full forward also keeps the keys and values of the suffix *after* the
  block; later steps run only the block's tokens, against the cached prefix and suffix.

For a bidirectional model both are approximations: the cached states of the prefix would change if
recomputed (its tokens attend to the block, which is being filled in) and so would the suffix's.
They are refreshed by a full forward at each block start, and every ``sampler.kv_cache_refresh``
steps inside a block when that is set (``kv_cache_refresh=1`` recomputes everything every step: the
exact sampler, token for token). ``benchmarks/rollout.py`` measures how far the logits move.

The network must follow the cache convention of :class:`~diffusion_rl.models.policy.KVCacheLM`;
``dual`` concatenates the prefix's and the suffix's cached keys and runs the block after them, which
a full-attention model computes exactly as if the block sat between them (attention has no notion of
order beyond the positions, which are passed explicitly).

A step returns ``(offset, logits (B, R, V))``: the logits of positions ``offset .. offset + R``, which
cover the current block. Only the block's logits are computed (the head runs at those positions
alone: ``keep``, ``models/heads.py``) unless a recorder needs every position's (``keep_full``: EGSPO-SA's
greedy completions read the argmax at every masked position); then a step computes the whole
sequence at a refresh and :meth:`StepLogits.widen` gives the recorder full-width tensors, the logits
of positions a cached step did not compute being the latest ones computed there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from diffusion_rl.models.policy import KVCache, check_cache_support

Count = Callable[[int, int], None]  # (query positions per row, model rows per sample) of one model call


class StepLogits:
    """``kv_cache=none``: every step is a full forward (``full(x) -> logits (B, T, V)``, with classifier-free
    guidance if configured: ``passes = 2`` model rows per sample)."""

    def __init__(self, full: Callable[[torch.Tensor, slice | None], torch.Tensor] | None, passes: int, count: Count,
                 refresh_every: int = 0, keep_full: bool = False):
        self.full_forward, self.passes, self.count = full, passes, count
        self.refresh_every, self.keep_full = refresh_every, keep_full
        self.full: torch.Tensor | None = None  # (B, T, V) latest logits at every position (recorders)

    def __call__(self, x: torch.Tensor, start: int, end: int, i: int) -> tuple[int, torch.Tensor]:
        """Logits of step ``i`` of the block ``[start, end)`` for the state ``x`` (B, T)."""
        assert self.full_forward is not None
        self.count(x.shape[1], self.passes)
        if self.keep_full:
            return 0, self.full_forward(x, None)
        return start, self.full_forward(x, slice(start, end))

    def refresh_now(self, i: int) -> bool:
        return i == 0 or (self.refresh_every > 0 and i % self.refresh_every == 0)

    def widen(self, x: torch.Tensor, logits: torch.Tensor, offset: int, start: int, cand: torch.Tensor,
              commit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Full-width (B, T, V) logits, (B, T) candidates and committed positions of a step whose
        logits cover ``offset ..`` and whose candidates / commits (B, n) the block ``start .. start + n``."""
        T, R = x.shape[1], logits.shape[1]
        if R == T:
            self.full = logits
        else:
            assert self.full is not None, "a cached step follows a refresh"
            self.full[:, offset:offset + R] = logits
        end = start + cand.shape[1]
        full_cand, full_commit = x.clone(), torch.zeros_like(x, dtype=torch.bool)
        full_cand[:, start:end] = cand
        full_commit[:, start:end] = commit
        return self.full, full_cand, full_commit


class CachedStepLogits(StepLogits):
    """``kv_cache=prefix|dual`` on a network following the :class:`~diffusion_rl.models.policy.KVCacheLM`
    convention; ``attn`` (B, T) the padding mask or None."""

    def __init__(self, net: nn.Module, attn: torch.Tensor | None, mode: str, count: Count,
                 refresh_every: int = 0, keep_full: bool = False):
        super().__init__(None, 1, count, refresh_every, keep_full)  # its full steps also fill the cache
        self.net, self.attn, self.mode = net, attn, mode
        self.past: KVCache | None = None
        self.block = (-1, -1)
        self.shift = int(getattr(net, "logits_shift", 0))

    def positions(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T) position ids, as the model derives them from the padding mask in a full forward
        (a model with ``mask_padding = False``, LLaDA as released, counts the padding)."""
        if self.attn is None or not getattr(self.net, "mask_padding", True):
            return torch.arange(x.shape[1], device=x.device).expand_as(x)
        return (self.attn.long().cumsum(-1) - 1).clamp(min=0)

    def __call__(self, x: torch.Tensor, start: int, end: int, i: int) -> tuple[int, torch.Tensor]:
        T = x.shape[1]
        # a shifted-logits model (Dream: the output at i - 1 predicts token i) also runs the token
        # before the block, so that the block's first logits are computed, not cached
        lo = start - self.shift
        if self.refresh_now(i) or self.block != (start, end):
            # the exact step's forward; its head runs at lo .. end unless a recorder needs every position
            first, stop = (0, T) if self.keep_full else (lo, end)
            out = self.net(input_ids=x, attention_mask=self.attn, use_cache=True, keep=slice(first, stop))
            self.count(T, 1)
            ranges = [(0, lo)] if self.mode == "prefix" else [(0, lo), (end, T)]
            self.past = type(out.past_key_values)((_slices(k, ranges), _slices(v, ranges)) for k, v in out.past_key_values)
            if self.shift:  # what the cache predicts for the first new token (position lo; dropped below)
                self.past.next_logits = out.logits[:, lo - first]  # type: ignore[union-attr]
            self.block = (start, end)
            return first, out.logits.float()
        pos = self.positions(x)
        keep = None
        if self.mode == "prefix":  # the block and the masked suffix against the cached prefix
            ids, attn, new = x[:, lo:], self.attn, slice(lo, T)
            keep = None if self.keep_full else slice(0, end - lo)  # the suffix's logits only for a recorder
        else:  # the block alone, against the cached prefix then suffix (keys in that order)
            ids, new = x[:, lo:end], slice(lo, end)
            attn = None if self.attn is None else torch.cat(
                [self.attn[:, :lo], self.attn[:, end:], self.attn[:, lo:end]], 1)
        out = self.net(input_ids=ids, attention_mask=attn, position_ids=pos[:, new], past_key_values=self.past,
                       keep=keep)
        self.count(ids.shape[1], 1)
        return start, out.logits[:, self.shift:].float()


def _slices(t: torch.Tensor, ranges: list[tuple[int, int]]) -> torch.Tensor:
    """The positions ``ranges`` of a cached (B, H, S, Dh) tensor, concatenated along S."""
    parts = [t[:, :, a:b] for a, b in ranges if b > a] or [t[:, :, :0]]
    return parts[0] if len(parts) == 1 else torch.cat(parts, 2)


def step_logits(cache: str, full: Callable[[torch.Tensor, slice | None], torch.Tensor], passes: int, net: nn.Module | None,
                attn: torch.Tensor | None, count: Count, refresh_every: int = 0,
                keep_full: bool = False) -> StepLogits:
    """The step-logits source ``sampler.kv_cache`` asks for: ``full(x, keep)`` runs the exact step
    (``passes`` model rows per sample; logits at ``keep`` or everywhere); the caches need ``net``;
    ``count`` is told of every model call."""
    if cache == "none":
        return StepLogits(full, passes, count, refresh_every, keep_full)
    if net is None:
        raise ValueError(f"sampler.kv_cache={cache} needs the network (generate(..., net=...))")
    check_cache_support(net, cache)
    return CachedStepLogits(net, attn, cache, count, refresh_every, keep_full)
