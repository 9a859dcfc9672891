"""Per-task CPU limits: how long each item's reference solution takes on this machine, measured once.

One global CPU limit is wrong in both directions: a correct program whose problem is slow (MBPP 123,
amicable numbers below 9999, about 6 CPU seconds on a loaded 2-core machine) fails it, while a 5 s
limit lets an infinite loop burn 5 s where the reference takes milliseconds. As EvalPlus does, each
item gets its own limit from its reference solution, ``SandboxConfig.cpu_limit``::

    limit = ceil(max(cpu_floor_s, cpu_factor x t_ref))

where ``t_ref`` is the CPU time of the item's reference program in this sandbox, the largest of
``repeats`` runs (CPU time, not wall time: it is what ``RLIMIT_CPU`` counts, and it moves far less
than wall time with the machine's load). A reference whose first run is under a quarter of
``cpu_floor_s / cpu_factor`` is not run again: no plausible repeat could lift its limit above the floor.

:class:`ReferenceTimes` measures the references it has not seen and keeps the times in
``<cache_dir>/sandbox_limits/<machine>.json``, keyed by each reference program's digest (its code and
tests), so any file, subset or hub copy of a benchmark shares the entries, an edited item is
measured again, and a machine (host, CPU model, core count, Python version: :func:`machine_id`)
never uses another's times. Writes replace the file atomically; two processes measuring at once
lose at most each other's new entries, which are measured again later.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from diffusion_rl.sandbox.runner import Program, Sandbox

log = logging.getLogger(__name__)

REPEATS = 3
MEASURE_CPU_S = 60  # the CPU limit a reference is measured under; one that needs more is taken as this
_SKIP_REPEAT = 0.25  # of cpu_floor_s / cpu_factor: a faster first run is not repeated


def machine_id() -> str:
    """The host name and a hash of what sets a program's speed here: CPU model, core count, Python."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    blob = json.dumps([model, os.cpu_count(), sys.version])
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in platform.node()) or "host"
    return f"{host}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


class ReferenceTimes:
    """CPU seconds of reference programs on this machine, measured in ``sandbox`` on first sight."""

    def __init__(self, sandbox: Sandbox, cache_dir: str | None, repeats: int = REPEATS):
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, not {repeats}")
        self.sandbox, self.repeats = sandbox, repeats
        self.path = Path(cache_dir) / "sandbox_limits" / f"{machine_id()}.json" if cache_dir else None
        self._known: dict[str, float] = self._read()

    def seconds(self, programs: Sequence[Program], labels: Sequence[str] | None = None) -> list[float]:
        """Each program's measured CPU seconds (the most of its runs), measuring the unknown ones now;
        ``labels`` name them in the log line that lists the slowest."""
        names = dict(zip((p.digest() for p in programs), labels or ()))
        todo = {p.digest(): p for p in programs}
        todo = {k: p for k, p in todo.items() if k not in self._known}
        if todo:
            self._measure(todo, names)
        return [self._known[p.digest()] for p in programs]

    def _measure(self, todo: dict[str, Program], names: dict[str, str]) -> None:
        cfg = self.sandbox.cfg
        skip_below = _SKIP_REPEAT * cfg.cpu_floor_s / cfg.cpu_factor if cfg.cpu_factor > 0 else math.inf
        keys = list(todo)
        runs: dict[str, list[float]] = {k: [] for k in keys}
        failed: list[str] = []
        for rnd in range(self.repeats):
            batch = keys if rnd == 0 else [k for k in keys if max(runs[k]) >= skip_below]
            results = self.sandbox.run([replace(todo[k], cpu_s=MEASURE_CPU_S) for k in batch])
            for k, res in zip(batch, results):
                # killed by the wall clock: no CPU time was reported, and it needed at least the cap
                runs[k].append(MEASURE_CPU_S if res.reason == "timeout" and not res.cpu_s else res.cpu_s)
                if rnd == 0 and not res.passed:
                    failed.append(f"{res.reason} ({res.detail[:80]})")
        new = {k: max(v) for k, v in runs.items()}
        self._known.update(new)
        self._write(new)
        slowest = sorted(new, key=new.__getitem__, reverse=True)[:3]
        log.info("sandbox: measured %d reference solution(s) on %s (%d run %d times); slowest: %s", len(new),
                 machine_id(), sum(len(v) > 1 for v in runs.values()), self.repeats,
                 ", ".join(f"{names.get(k, k[:8])} {new[k]:.2f} CPU s -> limit {cfg.cpu_limit(new[k])} s" for k in slowest))
        if failed:
            log.warning("sandbox: %d reference solution(s) did not pass while being timed, e.g. %s; their limits "
                        "still follow their CPU time", len(failed), failed[0])

    def _read(self) -> dict[str, float]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            return {str(k): float(v) for k, v in json.loads(self.path.read_text())["seconds"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            log.warning("sandbox: unreadable reference times in %s; measuring again", self.path)
            return {}

    def _write(self, new: dict[str, float]) -> None:
        if self.path is None:
            return
        merged = {**self._read(), **new}  # another process may have added entries since we read
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps({"machine": machine_id(), "seconds": merged}, indent=0, sort_keys=True))
        os.replace(tmp, self.path)
