"""Typed config schemas: turn Hydra's dict config into validated dataclasses, one line per error.

Each config group maps to a dataclass (the objective's, task's and likelihood's come from their
registries). :func:`from_dict` rejects unknown keys and values of the wrong type, naming the key and
what is allowed; each dataclass's ``validate()`` checks ranges. :func:`check_group_choices` turns
``objective=foo`` on the command line into the same kind of one-line error before Hydra composes.
A renamed key or value keeps working for one release: the dataclass keeps the old field (default
None) and hands its value to the new one through :func:`renamed`, which warns once in one line.
"""

from __future__ import annotations

import dataclasses
import logging
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union

from diffusion_rl.core.errors import ConfigError

log = logging.getLogger(__name__)
_WARNED: set[str] = set()

T = TypeVar("T")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(key, value, a)
            except ConfigError as e:
                errors.append(e.allowed)
        raise ConfigError(key, value, " or ".join(errors))
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_dict(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, value, "must be true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(key, value, "must be an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(key, value, "must be a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(key, value, "must be a string")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, value, "must be a list")
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(key, value, f"must have {len(args)} entries")
            return tuple(_coerce(f"{key}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args)))
        inner = args[0] if args else Any
        return origin(_coerce(f"{key}[{i}]", v, inner) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, value, "must be a mapping")
        return dict(value)
    return value


def from_dict(cls: type[T], data: Any, prefix: str) -> T:
    """Build dataclass ``cls`` from a mapping; unknown keys and wrong types raise :class:`ConfigError`.

    ``prefix`` is the config path of the mapping (``"objective"``; ``""`` for root keys); nested
    dataclass fields are built the same way.
    """
    data = _plain(data)
    if isinstance(data, dict):
        data = {str(k): v for k, v in data.items()}
    else:
        raise ConfigError(prefix or "config", data, "must be a mapping")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    key = (lambda k: f"{prefix}.{k}") if prefix else (lambda k: k)
    unknown = sorted(set(data) - set(fields) - {"_target_"})
    if unknown:
        raise ConfigError(key(unknown[0]), data[unknown[0]], f"unknown key; allowed: {', '.join(sorted(fields))}")
    kwargs = {k: _coerce(key(k), _plain(v), hints[k]) for k, v in data.items() if k in fields}
    obj = cls(**kwargs)
    if hasattr(obj, "validate"):
        obj.validate()
    return obj


def _plain(v: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(v, (DictConfig, ListConfig)):
            return OmegaConf.to_container(v, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return v


def override_key(override: str) -> str:
    """The key an override or a defaults-list entry sets: ``model.d_model`` from ``model.d_model=32``,
    ``advantage`` from ``+advantage=loo``, ``~advantage`` or ``override /advantage@_global_.advantage``."""
    key = override.lstrip("+~").split("=", 1)[0].removeprefix("override ").strip().lstrip("/")
    return key.split("@", 1)[0]


def group_options(group: str, conf_dir: Path) -> list[str] | None:
    """The options of the config group ``group`` (its ``*.yaml`` files, sorted); None where ``group`` is
    not a config group (a dotted key, or no such folder under ``conf_dir``)."""
    folder = conf_dir / group
    if "." in group or not folder.is_dir():
        return None
    return sorted(p.stem for p in folder.glob("*.yaml"))


def check_group_choices(argv: list[str], conf_dir: Path) -> None:
    """Fail in one line on ``group=name`` overrides naming a config that does not exist."""
    for arg in argv:
        if "=" not in arg or arg.startswith(("-", "+", "~", "hydra")):
            continue
        key, value = arg.split("=", 1)
        key = key.removeprefix("override ").strip()
        allowed = group_options(key, conf_dir)
        if allowed is None:
            continue
        for choice in value.split(","):  # multirun: a,b,c
            if choice and choice != "null" and choice not in allowed:
                raise ConfigError(key, choice, f"unknown {key}; allowed: {', '.join(allowed)}")


def renamed(old: str, new: str, value: T) -> T:
    """``value``, given under the deprecated key (or value) ``old``, for its new name ``new``; warns once
    per process, in one line naming the new key."""
    if old not in _WARNED:
        _WARNED.add(old)
        log.warning("%s is deprecated and goes in the next release: use %s", old, new)
    return value
