"""Checkpoints that survive crashes: atomic writes, safe loading, one-line refusal of a bad file.

- :func:`atomic_save` and :class:`AtomicCheckpointIO` (Lightning's ``CheckpointIO`` plugin) write
  ``<name>.tmp<pid>`` in the checkpoint's own folder, fsync it and rename it over ``<name>``, so a
  kill during a write leaves the previous file whole. Lightning 2.6's own ``_atomic_save`` writes to
  a ``tempfile.mkstemp()`` file in the system temp folder and ``shutil.move``s it: a copy, not a
  rename, whenever that folder is on another file system than the run (and a kill mid-copy leaves a
  truncated ``last.ckpt``).
- :func:`resolve_checkpoint` turns ``ckpt_path`` (``last``, a run folder or a file) into a file and
  checks that it loads with ``weights_only=True`` (memory-mapped: the tensors are not read). A
  missing, truncated or foreign file stops the run in one line naming the newest readable step
  checkpoint in the same folder.
- :func:`rng_state` / :func:`set_rng_state`: the global torch, CUDA, numpy and Python generators as
  tensors, lists and numbers, so checkpoints stay loadable with ``weights_only=True``.
- :func:`continue_csv_log`: a run resumed in its own folder keeps the CSV rows up to the checkpoint
  and drops the ones logged after it (the resumed run logs those steps again).
"""

from __future__ import annotations

import csv
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from diffusion_rl.errors import ConfigError


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to a temporary file next to ``path``, fsync, rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX and Windows within one file system
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable (POSIX); best effort
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO with :func:`atomic_save` for local paths (remote ones: Lightning's)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        atomic_save(checkpoint, path)


# ---- resolving and checking a checkpoint ----------------------------------------------------------
@dataclass
class CheckpointRef:
    path: Path
    global_step: int


class _Unreadable(Exception):
    pass


_STEP_RE = re.compile(r"(\d+)")


def _inspect(path: Path) -> int:
    """The checkpoint's ``global_step``; raises :class:`_Unreadable` with a one-line reason."""
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # noqa: BLE001 - truncated, not a zip, or not weights_only-safe
        first = (str(err).strip().splitlines() or [type(err).__name__])[0].split(". ")[0]
        raise _Unreadable(f"{type(err).__name__}: {first[:160]}") from err
    if not isinstance(blob, dict) or not isinstance(blob.get("state_dict"), dict):
        raise _Unreadable("not a Lightning checkpoint (no state_dict)")
    if not any(k.startswith("policy.") for k in blob["state_dict"]):
        raise _Unreadable("holds no 'policy.*' weights (not a diffusion_rl checkpoint?)")
    return int(blob.get("global_step", 0))


def newest_readable(folder: Path, exclude: Path | None = None) -> Path | None:
    """The readable step checkpoint (not ``last*``) with the highest step in ``folder``, if any."""
    def step_of(p: Path) -> tuple[int, float]:
        nums = _STEP_RE.findall(p.stem)
        return (int(nums[-1]) if nums else -1, p.stat().st_mtime)

    candidates = [p for p in folder.glob("*.ckpt") if not p.name.startswith("last") and p != exclude]
    for p in sorted(candidates, key=step_of, reverse=True):
        try:
            _inspect(p)
            return p
        except _Unreadable:
            continue
    return None


def checkpoint_file(value: str | Path) -> Path:
    """A checkpoint file as given, or a run folder's ``checkpoints/last.ckpt`` (``last.ckpt`` in a
    checkpoints folder); the file may not exist."""
    path = Path(value).expanduser()
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt" if (path / "checkpoints").is_dir() else path / "last.ckpt"
    return path


def resolve_checkpoint(value: str, run_dir: str | Path) -> CheckpointRef:
    """``last`` -> ``<run_dir>/checkpoints/last.ckpt``; a run folder -> its ``checkpoints/last.ckpt``.

    Raises :class:`ConfigError` (one line) for a missing or unreadable file.
    """
    path = Path(run_dir) / "checkpoints" / "last.ckpt" if value == "last" else checkpoint_file(value)
    if not path.is_file():
        raise ConfigError("ckpt_path", value, f"no checkpoint file at {path}")
    try:
        step = _inspect(path)
    except _Unreadable as err:
        good = newest_readable(path.parent, exclude=path)
        hint = f"; newest readable checkpoint there: {good}" if good else "; no readable checkpoint in that folder"
        raise ConfigError("ckpt_path", value, f"refused {path}: {err}{hint}") from None
    return CheckpointRef(path, step)


# ---- global random generators ---------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """The global generators as plain data (``weights_only``-loadable)."""
    np_state = np.random.get_state(legacy=False)
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- metrics of a resumed run -------------------------------------------------------------------
def continue_csv_log(loggers: list, global_step: int) -> None:
    """Keep a CSV logger's rows up to ``global_step``, drop later ones, and hand them to the new writer.

    The rows are replayed into the fresh logger so that it knows every column (Lightning's writer
    rewrites the file with only the columns it has seen when a new one appears).
    """
    from lightning.pytorch.loggers import CSVLogger

    for lg in loggers:
        if not isinstance(lg, CSVLogger):
            continue
        path = Path(lg.log_dir) / "metrics.csv"
        if not path.is_file():
            continue
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        path.unlink()
        for r in rows:
            step = int(float(r.get("step") or 0))
            if step > global_step:
                continue
            lg.log_metrics({k: float(v) for k, v in r.items() if k != "step" and v not in ("", None)}, step=step)
        lg.save()
