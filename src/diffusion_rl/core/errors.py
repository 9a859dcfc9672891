"""Errors the user can act on: each renders as one line naming the key, the value and what is allowed."""

from __future__ import annotations

from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration value is invalid. ``str(err)`` is a single line meant for the user."""

    def __init__(self, key: str, value: object, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!r} is invalid: {allowed}")


def check_choice(key: str, value: object, allowed: Iterable[str]) -> None:
    """Refuse a value that is none of ``allowed``: ``<key>=<value> is invalid: allowed: a, b``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(key, value, f"allowed: {', '.join(allowed)}")
