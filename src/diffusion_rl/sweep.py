"""Sweeps: one failed job must not stop the others.

Hydra's launchers stop a multirun at the first job that raises. :func:`run_job` runs one job; in a
multirun it catches the exception, writes ``failed.json`` (error type, message, traceback) into the
job's folder, logs one line and returns None, so the sweep goes on and the offline report lists the
job as failed. In a single run the exception propagates as usual.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
FAILED_FILE = "failed.json"


def run_job(fn: Callable[[], T], run_dir: str | Path, multirun: bool) -> T | None:
    if not multirun:
        return fn()
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - any job failure is recorded, KeyboardInterrupt still stops
        record_failure(run_dir, err)
        log.error("job failed, the sweep goes on: %s: %s (%s)", type(err).__name__, err,
                  Path(run_dir) / FAILED_FILE)
        return None


def record_failure(run_dir: str | Path, err: BaseException) -> Path:
    path = Path(run_dir) / FAILED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"error": str(err), "type": type(err).__name__,
                   "traceback": "".join(traceback.format_exception(type(err), err, err.__traceback__))}, f, indent=2)
    return path
