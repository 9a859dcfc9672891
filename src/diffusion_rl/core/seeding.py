"""Deterministic seeds for local random generators, derived from the run seed and an item's ids.

Library code never reseeds the global generator: each random draw (a mask, Gumbel noise, a data
order, a step selection) uses its own ``torch.Generator`` seeded with :func:`mix_seed` of the run
seed and the ids of what it draws for (rollout, sample, inner iteration, ...), so a resumed or
data-parallel run draws the same numbers as an uninterrupted single-process one.
"""

from __future__ import annotations

_MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def mix_seed(*parts: int) -> int:
    """A deterministic 63-bit hash of integers (splitmix64 steps); Python's ``hash()`` is salted."""
    h = 0
    for p in parts:
        h = (h ^ (int(p) & 0xFFFFFFFFFFFFFFFF)) * _MIX[1] & 0xFFFFFFFFFFFFFFFF
        h = (h ^ (h >> 31)) * _MIX[2] & 0xFFFFFFFFFFFFFFFF
        h = (h + _MIX[0]) & 0xFFFFFFFFFFFFFFFF
    return h & 0x7FFFFFFFFFFFFFFF
