"""The order of training items: seeded per epoch, resumable mid-epoch, checkpointed by Lightning.

Epoch ``e`` visits the items in the order ``randperm(n)`` drawn from a generator seeded with
``(seed, e)``: it depends only on the seed and the epoch, not on how many epochs this process ran.
:class:`ResumableLoader` is a ``DataLoader`` with ``state_dict`` / ``load_state_dict`` (epoch, items
already served this epoch); Lightning stores that in every checkpoint
(``loops.fit_loop.state_dict.combined_loader``) and hands it back on resume, so a resumed run draws
the same next batches as an uninterrupted one.

Written by hand: ``torch.utils.data`` has no resumable sampler, and torchdata's
``StatefulDataLoader`` would be a new dependency for these few lines. Several processes each read
this same order; if Lightning wrapped the sampler in a distributed one
(``use_distributed_sampler=true``), that wrapper would restart the epoch on resume.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from diffusion_rl.core.seeding import mix_seed

_SALT = 0xDA7A


class EpochOrder(Sampler[int]):
    """``randperm(n)`` seeded by ``(seed, epoch)``; the next pass skips ``start`` items (resume)."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls this before every epoch, also right after restoring a checkpoint."""
        if epoch != self.epoch:
            self.epoch, self.start = epoch, 0

    def order(self, epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(mix_seed(self.seed, epoch, _SALT))
        return torch.randperm(self.n, generator=gen).tolist()

    def __iter__(self) -> Iterator[int]:
        # a generator: the body (epoch, start) is read at the first batch, after set_epoch
        start, self.start = self.start, 0
        yield from self.order(self.epoch)[start:]

    def __len__(self) -> int:
        return self.n


class ResumableLoader(DataLoader):
    """Batches in :class:`EpochOrder`; ``state_dict()`` is the position after the last batch served."""

    def __init__(self, dataset: Dataset, batch_size: int, seed: int, drop_last: bool,
                 collate_fn: Callable[[list[Any]], Any] | None = None):
        # the generator only seeds worker processes; passing one keeps the global RNG untouched
        super().__init__(dataset, batch_size=batch_size, sampler=EpochOrder(len(dataset), seed),  # type: ignore[arg-type]
                         drop_last=drop_last, collate_fn=collate_fn, generator=torch.Generator().manual_seed(seed))
        self._position = {"epoch": 0, "served": 0}

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # yields batches, as the base
        order: EpochOrder = self.sampler  # type: ignore[assignment]
        served = order.start  # read before the sampler's first item resets it
        for batch in super().__iter__():
            served = min(served + self.batch_size, order.n)  # type: ignore[operator]
            self._position = {"epoch": order.epoch, "served": served}
            yield batch

    def state_dict(self) -> dict[str, int]:
        return dict(self._position)

    def load_state_dict(self, state: dict[str, int]) -> None:
        order: EpochOrder = self.sampler  # type: ignore[assignment]
        order.epoch, order.start = int(state["epoch"]), int(state["served"])
        self._position = {"epoch": order.epoch, "served": order.start}
