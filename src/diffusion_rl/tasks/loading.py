"""Benchmark data through ``datasets``: a local JSONL file, or a Hugging Face hub dataset by name.

Every failure a user can fix (a missing file, an unreadable file, a missing column, no network for
the hub) is a one-line :class:`ConfigError` naming the config key and the value.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from diffusion_rl.core.errors import ConfigError

OFFLINE_HINT = "offline? point task.data_path / task.train_data_path at local JSONL files"


def load_jsonl(path: str | Path, key: str, columns: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Rows of a local JSONL file (``datasets``' json builder), checking ``columns`` are present."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(key, str(path), "no such file")
    from datasets import load_dataset

    try:
        ds = load_dataset("json", data_files=str(p.resolve()), split="train")
    except Exception as err:  # noqa: BLE001 - malformed JSON, wrong encoding, ...: one clear line
        raise ConfigError(key, str(path), f"not a readable JSONL file ({type(err).__name__})") from err
    missing = sorted(set(columns) - set(ds.column_names))
    if missing:
        raise ConfigError(
            key, str(path), f"missing column(s) {', '.join(missing)}; has {', '.join(ds.column_names)}"
        )
    return ds.to_list()


def load_hub(hub_id: str, config: str | None, split: str, key: str) -> Any:
    """``datasets.load_dataset(hub_id, config, split=split)``; no network is a one-line error."""
    from datasets import load_dataset

    try:
        return load_dataset(hub_id, config, split=split)
    except Exception as err:  # noqa: BLE001 - ConnectionError, offline mode, unknown id, ...
        where = f"{hub_id}" + (f" ({config})" if config else "")
        raise ConfigError(
            key, hub_id, f"could not load split {split!r} of {where} from the hub "
            f"({type(err).__name__}); {OFFLINE_HINT}"
        ) from err


def load_rows(path: str | None, path_key: str, columns: Iterable[str], hub_id: str, hub_config: str | None,
              split: str) -> list[dict[str, Any]]:
    """The rows of the local JSONL at ``path`` (config key ``path_key``) if given, else of the hub's
    ``split`` of ``hub_id`` (config key ``task.hub_id``)."""
    if path:
        return load_jsonl(path, path_key, columns)
    return list(load_hub(hub_id, hub_config, split, "task.hub_id"))


def seeded_subset(items: Sequence[dict[str, Any]], n: int | None, seed: str) -> list[dict[str, Any]]:
    """All items in order when ``n`` is None or covers them, else ``n`` drawn by a seeded generator."""
    if n is None or n >= len(items):
        return list(items)
    idx = sorted(random.Random(seed).sample(range(len(items)), n))
    return [items[i] for i in idx]
