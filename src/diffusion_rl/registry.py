"""A name -> object registry, one per extension point (objectives, likelihoods, tasks, ...).

An unknown name fails with the list of valid names, so a typo in a config is a one-line error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from diffusion_rl.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        if name not in self._items:
            raise ConfigError(self.kind, name, f"allowed: {', '.join(sorted(self._items))}")
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
