"""Sweeps: one failed job must not stop the others; a run folder says why its run stopped.

Hydra's launchers stop a multirun at the first job that raises. :func:`run_job` runs one job; in a
multirun it catches the exception, writes ``failed.json`` (error type, message, traceback) into the
job's folder, logs one line and returns None, so the sweep goes on and the offline report lists the
job as failed. In a single run the exception propagates; a run that crashed after it started still
leaves ``failed.json``, and a :class:`ConfigError` (nothing ran) removes the folder Hydra created for
it when it holds only Hydra's own files, so ``src/report.py`` does not list a run that never was.
"""

from __future__ import annotations

import json
import logging
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from diffusion_rl.core.errors import ConfigError

log = logging.getLogger(__name__)

T = TypeVar("T")
FAILED_FILE = "failed.json"


def run_job(fn: Callable[[], T], run_dir: str | Path, multirun: bool) -> T | None:
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - any job failure is recorded, KeyboardInterrupt still stops
        if not multirun:
            if not (isinstance(err, ConfigError) and discard_unstarted(run_dir)):
                record_failure(run_dir, err)
            raise
        record_failure(run_dir, err)
        log.error("job failed, the sweep goes on: %s: %s (%s)", type(err).__name__, err,
                  Path(run_dir) / FAILED_FILE)
        return None


def discard_unstarted(run_dir: str | Path) -> bool:
    """Delete ``run_dir`` if it holds only what Hydra writes before a job runs (``.hydra/`` and the
    job's ``.log``); True if it is gone. A folder with anything else (a resumed run's checkpoints) stays."""
    path = Path(run_dir)
    if not path.is_dir():
        return True
    entries = list(path.iterdir())
    if any(p.name != ".hydra" and not (p.suffix == ".log" and p.is_file()) for p in entries):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()


def record_failure(run_dir: str | Path, err: BaseException) -> Path:
    path = Path(run_dir) / FAILED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"error": str(err), "type": type(err).__name__,
                   "traceback": "".join(traceback.format_exception(type(err), err, err.__traceback__))}, f, indent=2)
    return path
