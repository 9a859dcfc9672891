"""A name -> object registry, one per extension point (objectives, likelihoods, tasks, ...).

An unknown name fails with the list of valid names, so a typo in a config is a one-line error.
:func:`discover` imports every module of an extension package, so a new objective (or task, or
estimator) is one new file that registers itself: no list of modules to edit. Packages installed
beside this one add theirs through the entry-point group ``diffusion_rl.<package>`` (e.g.
``diffusion_rl.rl.objectives``), whose modules are imported the same way.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from diffusion_rl.core.errors import ConfigError

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


def discover(package: str, path: Iterable[str]) -> None:
    """Import every module of ``package`` (its ``__path__``) and the entry points of
    ``diffusion_rl.<last part of package>``, so that their ``@REGISTRY.register`` calls run."""
    for info in sorted(pkgutil.iter_modules(list(path)), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")
    for ep in entry_points(group=f"diffusion_rl.{package.rsplit('.', 1)[-1]}"):
        ep.load()
