"""math-verify in a pool of worker processes: each gold parsed once, a deadline per step, verdicts cached.

Why a pool: parsing with sympy takes ~1-20 ms warm but 100+ ms the first time an expression shape is
seen, longer on a loaded machine, and some completions never finish (``9^{9^{9}}``, ``(10^8)!``), in
C code that no signal can interrupt. So each check runs in a worker process:

* the work unit is one gold answer with its predictions (a prompt's group): the worker parses the
  gold once (and keeps it in an LRU of parsed golds, so the next step's group reuses it), then
  verifies each prediction, reporting after each step;
* every step (the gold's parse, each prediction) gets ``timeout_s``: in the worker a signal deadline
  (``math500.math_equal``'s) stops sympy's Python code and the prediction counts as wrong; if the
  worker says nothing for ``timeout_s + KILL_GRACE_S`` (C code that ignores signals) it is killed,
  the prediction counts as wrong, the rest of its unit goes to another worker, and a fresh worker
  starts;
* verdicts are cached by ``(prediction, gold)`` (LRU), so a group's repeated completions, and a
  pathological string the policy keeps writing, cost once.

``timeout_s`` defaults to :data:`DEFAULT_TIMEOUT_S`, chosen by measurement, not by a budget:
``python benchmarks/rewards.py --math`` parses and verifies every MATH-500 gold answer against
itself and equivalent rewritings, cold (first sight in a fresh worker) and warm, with both cores
busy; the slowest correct check took well under a second there (docs/scoring.md, "Rewards under load", has the figures), so
5 s leaves a wide margin for slower machines while bounding what one pathological completion costs:
at most ``timeout_s + KILL_GRACE_S`` of one worker, once per distinct string.

Workers are fresh interpreters (``python -m diffusion_rl.rewards.verify_worker``, never ``fork``: the
trainer holds CUDA and threads; not ``multiprocessing``'s spawn either, which re-imports the caller's main
script), started on first use; each imports math-verify and warms sympy up before it takes work (~2-3 s
once per process).
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
KILL_GRACE_S = 2.0  # beyond the worker's own deadline before the parent kills it
STARTUP_TIMEOUT_S = 120.0  # importing math-verify and warming sympy up, on a loaded machine
CACHE_SIZE = 16384  # verdicts; predictions and golds are at most 2000 characters each
GOLD_CACHE_SIZE = 4096  # parsed golds kept by each worker


# The worker's entry point lives in its own module (it needs math500, which needs this one).
_WORKER_MODULE = "diffusion_rl.rewards.verify_worker"
_SRC = str(Path(__file__).resolve().parents[2])  # the folder holding the diffusion_rl package


# ---- the parent side ----------------------------------------------------------------------------
@dataclass
class _Unit:
    gold: str
    preds: list[str]
    index: list[list[int]]  # positions of each prediction in the caller's list
    done: int = 0  # predictions answered so far


@dataclass
class _Worker:
    proc: Any
    conn: Connection
    ready: bool = False
    unit: _Unit | None = None
    gold_done: bool = False
    last: float = field(default_factory=time.monotonic)


class VerifyPool:
    """``workers`` math-verify processes; :meth:`verify` checks ``(prediction, gold)`` pairs."""

    def __init__(self, workers: int):
        self.size = max(1, workers)
        self._workers: list[_Worker] = []
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._lock = threading.Lock()
        self.kills = 0  # workers killed for overrunning their deadline

    def _spawn(self) -> _Worker:
        parent, child = socket.socketpair()
        path = os.pathsep.join([_SRC] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        proc = subprocess.Popen([sys.executable, "-m", _WORKER_MODULE, str(child.fileno())],
                                pass_fds=(child.fileno(),), env={**os.environ, "PYTHONPATH": path},
                                stdin=subprocess.DEVNULL)
        child.close()
        return _Worker(proc, Connection(parent.detach()))

    def _retire(self, w: _Worker) -> None:
        w.proc.kill()
        w.proc.wait()
        w.conn.close()
        self._workers.remove(w)

    def verify(self, pairs: Sequence[tuple[str, str]], timeout_s: float = DEFAULT_TIMEOUT_S) -> list[bool]:
        """Whether each ``(prediction, gold)`` pair is equivalent, ``timeout_s`` per parse and per check;
        cached pairs are not checked again."""
        with self._lock:
            out: list[bool | None] = [self._cache.get((p, g)) for p, g in pairs]
            todo: dict[str, dict[str, list[int]]] = {}  # gold -> prediction -> positions
            for i, (p, g) in enumerate(pairs):
                if out[i] is None:
                    todo.setdefault(g, {}).setdefault(p, []).append(i)
            units = deque(_Unit(g, list(preds), list(preds.values())) for g, preds in todo.items())
            if units:
                self._run(units, out, timeout_s)
            for i, (p, g) in enumerate(pairs):
                self._cache[(p, g)] = bool(out[i])
                self._cache.move_to_end((p, g))
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return [bool(v) for v in out]

    def _run(self, units: deque[_Unit], out: list[bool | None], timeout_s: float) -> None:
        while len(self._workers) < self.size:
            self._workers.append(self._spawn())
        while units or any(w.unit for w in self._workers):
            for w in self._workers:
                if w.ready and w.unit is None and units:
                    w.unit, w.gold_done, w.last = units.popleft(), False, time.monotonic()
                    w.conn.send((w.unit.gold, w.unit.preds[w.unit.done:], timeout_s))

            def deadline(w: _Worker) -> float:
                return w.last + (timeout_s + KILL_GRACE_S if w.ready else STARTUP_TIMEOUT_S)

            ready = wait([w.conn for w in self._workers],
                         timeout=max(0.0, min(deadline(w) for w in self._workers) - time.monotonic()))
            for w in list(self._workers):
                if w.conn in ready:
                    self._receive(w, units, out)
                elif time.monotonic() > deadline(w):
                    self._overrun(w, units, out)

    def _receive(self, w: _Worker, units: deque[_Unit], out: list[bool | None]) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):  # the worker died (e.g. out of memory): as an overrun
            self._overrun(w, units, out)
            return
        w.last = time.monotonic()
        if msg[0] == "ready":
            w.ready = True
            return
        unit = w.unit
        assert unit is not None
        if msg[0] == "gold":
            w.gold_done = True
            return
        for i in unit.index[unit.done]:
            out[i] = bool(msg[1])
        unit.done += 1
        if unit.done == len(unit.preds):
            w.unit = None

    def _overrun(self, w: _Worker, units: deque[_Unit], out: list[bool | None]) -> None:
        """Kill a worker that said nothing in time; its current step is wrong, the rest of its unit
        goes back in the queue, and a fresh worker replaces it."""
        unit = w.unit
        self.kills += 1
        if not w.ready:
            log.warning("a math-verify worker did not start within %.0f s; replacing it", STARTUP_TIMEOUT_S)
        self._retire(w)
        if unit is not None:
            if w.gold_done:  # a prediction overran: it is wrong; the rest go to another worker
                for i in unit.index[unit.done]:
                    out[i] = False
                unit.done += 1
                if unit.done < len(unit.preds):
                    units.appendleft(unit)
            else:  # the gold itself overran: nothing can be shown equal to it
                for idx in unit.index[unit.done:]:
                    for i in idx:
                        out[i] = False
        self._workers.append(self._spawn())

    def close(self) -> None:
        for w in list(self._workers):
            self._retire(w)


_pools: dict[int, VerifyPool] = {}


def get_pool(workers: int = 0) -> VerifyPool:
    """The process's pool of ``workers`` processes (0: the CPU count, at most 8), made on first use."""
    workers = workers or min(os.cpu_count() or 1, 8)
    if workers not in _pools:
        _pools[workers] = VerifyPool(workers)
    return _pools[workers]


@atexit.register
def _close_pools() -> None:
    for pool in _pools.values():
        pool.close()
