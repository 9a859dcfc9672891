"""Errors the user can act on: each renders as one line naming the key, the value and what is allowed."""


class ConfigError(ValueError):
    """A configuration value is invalid. ``str(err)`` is a single line meant for the user."""

    def __init__(self, key: str, value: object, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!r} is invalid: {allowed}")
