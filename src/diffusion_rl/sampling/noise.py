"""The sampler's random numbers, keyed per row: a sample is a function of its seed and its own ids.

Each row of a sampler call draws from its own ``torch.Generator``, seeded from the row's key (the
rollouts: ``(run seed, rollout id, global row)``, as the likelihood masks are keyed in
``likelihood/base.py``), and it draws only at the steps where it has a position to commit. So a
row's Gumbel noise and random-remasking confidences do not depend on which rows share its call:
``sampler.rollout_batch_size``, the number of processes and the evaluation batch size change no
sample (tests/unit/sampling/test_row_noise.py).

The generators live on the device of the logits, so the same seed gives the same numbers on every
run of one device type (a CUDA generator's stream is not the CPU's). A row's draw is one
``torch.rand`` into its slice of the batch's buffer: the same numbers are drawn as by one call over
the batch, in ``B`` calls (``benchmarks/sampler.py`` measures the cost).

Without keys (``noise=None``) the sampler draws from the global generator, one call per step over
the batch: quick use and benchmarks, not reproducible across batchings.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diffusion_rl.core.seeding import mix_seed


class RowNoise:
    """Per-row random streams for one sampler call (``seeds[b]`` keys row ``b``); stateful: a
    call consumes it, so build a fresh one per call."""

    def __init__(self, seeds: Sequence[int]):
        self.seeds = [int(s) for s in seeds]
        self._gens: list[torch.Generator] | None = None

    @classmethod
    def rows(cls, key: int, first: int, n: int) -> RowNoise:
        """Rows ``first .. first + n`` of a batch keyed by ``key``: row ``j`` seeded ``mix_seed(key, j)``."""
        return cls([mix_seed(key, j) for j in range(first, first + n)])

    def __len__(self) -> int:
        return len(self.seeds)

    def _generators(self, device: torch.device) -> list[torch.Generator]:
        if self._gens is None:
            self._gens = [torch.Generator(device=device).manual_seed(s) for s in self.seeds]
        elif self._gens and self._gens[0].device.type != device.type:
            raise ValueError(f"RowNoise drew on {self._gens[0].device} before; now asked for {device}")
        return self._gens

    def generators(self, device: torch.device) -> list[torch.Generator]:
        """Each row's generator on ``device``, for a sampler that draws other numbers than uniforms (the
        uniform-noise sampler's tokens, ``uniform_sampler.py``)."""
        return self._generators(device)

    def uniform(self, shape: tuple[int, ...], active: torch.Tensor, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
        """Uniform numbers in ``[0, 1)``, ``(B, *shape)``: row ``b`` from its own generator where
        ``active[b]`` (B,) bool, 0.5 elsewhere (an inactive row commits nothing; its generator does
        not advance)."""
        B = len(self.seeds)
        if active.shape != (B,):
            raise ValueError(f"RowNoise keys {B} rows; the step has {tuple(active.shape)}")
        gens = self._generators(device)
        out = torch.empty((B, *shape), dtype=dtype, device=device)
        rows = active.nonzero()[:, 0].tolist()
        for b in rows:
            torch.rand(shape, generator=gens[b], dtype=dtype, device=device, out=out[b])
        if len(rows) < B:
            out[~active.to(device)] = 0.5
        return out


def uniform(noise: RowNoise | None, shape: tuple[int, ...], active: torch.Tensor, dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
    """``(B, *shape)`` uniforms: per row from ``noise``, or from the global generator when it is None."""
    if noise is None:
        return torch.rand((active.shape[0], *shape), dtype=dtype, device=device)
    return noise.uniform(shape, active, dtype, device)
