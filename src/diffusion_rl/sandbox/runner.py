"""Run model-written programs against their tests, safely and in parallel (docs/methods.md §11).

Every program runs in its own process group, forked from a clean environment by a small trusted fork
server (``python -I -S zygote.py --zygote``: namespaces, read-only file system, a fresh
``tmpfs`` working directory, an unprivileged uid, no network; see that file), with resource limits on CPU seconds,
address space, file size, processes/threads and open files, and a wall-clock limit after which the
whole group is killed. The tests run in a separate supervisor process that the program cannot
reach (``harness.py``), so only the harness can say a program passed: it passes when every
test ran and passed and its process then exited with status 0.

Programs see the standard library only (``-I -S``: no site-packages). A :class:`Sandbox` keeps
``workers`` runs in flight (threads that each wait on one process), so a
batch of 512 short programs takes seconds (``python benchmarks/rewards.py``). Each
:class:`SandboxResult` says ``passed`` and a ``reason``:

=================  =====================================================================
``passed``         every test passed, the process exited 0
``failed``         a test's assertion was false
``error``          the program raised (defining itself, or in a call a test made); ``detail`` names the type
``exited``         the process ended, or raised ``SystemExit``, before the harness was done
``timeout``        the CPU-time limit, or the wall-clock limit (reward 0, but counted apart from ``failed``)
``memory``         ``MemoryError`` (the address-space limit)
``file_size``      a write past the file-size limit
``output_limit``   more than ``max_output_bytes`` written to stdout/stderr
``killed``         the process died of a signal (``detail``: e.g. ``SIGSEGV``)
``sandbox_error``  the harness itself failed (never the program's verdict; ``detail`` says why)
=================  =====================================================================

A program's CPU limit is its own (``Program.cpu_s``: the code rewards set it from the measured time of
the item's reference solution, ``sandbox/limits.py``) or ``cpu_floor_s``; its wall-clock limit grows
with it (:meth:`SandboxConfig.wall_s`). The wall clock is there for programs that wait (sleep, block)
rather than compute: at its end a program with a process that is running or waiting for a core gets another
period, up to ``WALL_EXTENSIONS`` times, so a correct program on a machine that gives it a
tenth of a core is not cut short (its CPU limit still holds). Each result reports the CPU seconds the program's process used
(``cpu_s``) and the limit it had (``cpu_limit_s``).

Limits are per process; a program may fork up to ``max_processes`` tasks, so the memory it can
hold is at most ``max_processes x memory_mb`` and a batch ``workers`` times that: size them to the
machine (the tests use 256 MB and 8 tasks).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from diffusion_rl.core.errors import ConfigError

log = logging.getLogger(__name__)

INIT = Path(__file__).with_name("zygote.py")
ISOLATION = ("auto", "strict", "none")
REASONS = ("passed", "failed", "error", "exited", "timeout", "memory", "file_size", "output_limit", "killed",
           "sandbox_error")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}  # nothing inherited
WALL_EXTENSIONS = 10  # the wall clock extends, one wall_s at a time, up to this many times while the program computes
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_SLOTS_PER_PROCESS = 256  # root: uid_base + (pid mod 2^16) * 256 + slot, a fresh uid per run in flight
_warned: set[str] = set()


@dataclass
class SandboxConfig:
    """``task.sandbox``: how programs run. Limits apply to each of the program's processes."""

    workers: int = 0  # runs in flight; 0: the machine's CPU count, at most 16
    # CPU seconds of the program's process: at least cpu_floor_s, and cpu_factor x the CPU time of the
    # item's reference solution when that was measured (sandbox/limits.py; EvalPlus's rule, 4 and 4 s
    # there). RLIMIT_CPU counts whole seconds, so the limit is rounded up. cpu_factor=0: every program
    # gets the floor and no reference is measured
    cpu_floor_s: int = 5
    cpu_factor: float = 4.0
    # wall clock per program at the floor, interpreter start included; then the group is killed. A
    # program with a higher CPU limit gets proportionally more (wall_s): waiting for a core on a busy
    # machine costs wall time, not CPU time
    timeout_s: float = 10.0
    # where measured reference times are kept, one JSON file per machine (sandbox_limits/); null: in
    # memory only. The code tasks' yaml sets ${paths.cache_dir}
    cache_dir: str | None = None
    memory_mb: int = 1024  # address space per process
    file_size_mb: int = 16  # largest file it may write
    disk_mb: int = 64  # size of its tmpfs working directory (with namespaces)
    max_processes: int = 16  # processes + threads, the harness's 2-3 included
    max_open_files: int = 64
    max_output_bytes: int = 1 << 20  # more stdout/stderr than this fails the program
    keep_output_bytes: int = 2000  # of which this much is kept in the result
    isolation: str = "auto"  # auto: namespaces when possible, else limits only (logged once) | strict | none
    uid_base: int = 1_600_000_000  # as root, programs run as uids from here (unused by real users)

    def validate(self, prefix: str = "task.sandbox") -> None:
        if self.isolation not in ISOLATION:
            raise ConfigError(f"{prefix}.isolation", self.isolation, f"allowed: {', '.join(ISOLATION)}")
        if self.workers < 0:
            raise ConfigError(f"{prefix}.workers", self.workers, "must be >= 0 (0: the CPU count)")
        if self.timeout_s <= 0:
            raise ConfigError(f"{prefix}.timeout_s", self.timeout_s, "must be > 0")
        if not 0 <= self.cpu_factor < float("inf"):
            raise ConfigError(f"{prefix}.cpu_factor", self.cpu_factor, "must be >= 0 (0: every program gets cpu_floor_s)")
        for key in ("cpu_floor_s", "memory_mb", "file_size_mb", "disk_mb", "max_open_files", "max_output_bytes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{prefix}.{key}", getattr(self, key), "must be >= 1")
        if self.max_processes < 4:
            raise ConfigError(f"{prefix}.max_processes", self.max_processes, "must be >= 4 (the harness uses 2-3)")
        if self.memory_mb < 64:
            raise ConfigError(f"{prefix}.memory_mb", self.memory_mb, "must be >= 64 (the interpreter needs it)")
        if not 0 <= self.keep_output_bytes <= self.max_output_bytes:
            raise ConfigError(f"{prefix}.keep_output_bytes", self.keep_output_bytes,
                              f"must be in [0, max_output_bytes={self.max_output_bytes}]")

    @property
    def num_workers(self) -> int:
        return self.workers or min(os.cpu_count() or 1, 16)

    def cpu_limit(self, reference_s: float | None) -> int:
        """CPU seconds for a program whose reference solution took ``reference_s`` (None: not measured):
        ``max(cpu_floor_s, cpu_factor x reference_s)``, rounded up to whole seconds."""
        if reference_s is None:
            return self.cpu_floor_s
        return max(self.cpu_floor_s, math.ceil(self.cpu_factor * reference_s))

    def wall_s(self, cpu_s: int) -> float:
        """The wall-clock limit of a program with ``cpu_s`` CPU seconds: ``timeout_s`` scaled from the floor."""
        return self.timeout_s * cpu_s / self.cpu_floor_s


@dataclass(frozen=True)
class Program:
    """A program and the tests it must pass.

    ``tests`` are statements run one by one in the harness (an MBPP ``assert``, HumanEval's
    ``check`` function and its call); names they use but do not define come from the program.
    ``setup`` runs after the program in its process (MBPP's ``test_setup_code``, which builds the
    program's own objects); ``trusted_setup`` runs in the harness before the tests (HumanEval's
    prompt, whose helpers the tests call); ``remote_names`` always come from the program even when
    ``trusted_setup`` defines them (the entry point, which the prompt declares without a body).
    ``cpu_s``: this program's CPU limit (None: the config's ``cpu_floor_s``).
    """

    code: str
    tests: tuple[str, ...]
    setup: str = ""
    trusted_setup: str = ""
    remote_names: tuple[str, ...] = ()
    cpu_s: int | None = None

    def digest(self) -> str:
        """A hash of what the program is and what it must pass (its limit aside)."""
        blob = json.dumps([self.code, self.tests, self.setup, self.trusted_setup, self.remote_names])
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class SandboxResult:
    passed: bool
    reason: str
    detail: str = ""
    tests_passed: int = 0
    tests_total: int = 0
    seconds: float = 0.0  # wall clock of the whole run
    output: str = ""
    cpu_s: float = 0.0  # CPU seconds of the program's process (0 when the wall-clock limit killed it)
    cpu_limit_s: int = 0  # the CPU limit it ran under

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Sandbox:
    """Runs programs with ``cfg.num_workers`` in flight; thread-safe, the pool is made on first use."""

    def __init__(self, cfg: SandboxConfig | None = None):
        self.cfg = cfg or SandboxConfig()
        self.cfg.validate()
        self._pool: ThreadPoolExecutor | None = None
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(self.cfg.num_workers):
            self._slots.put(slot)
        self._lock = threading.Lock()
        self._zygote = _ForkServer()

    def run(self, programs: Sequence[Program]) -> list[SandboxResult]:
        """One result per program, in order."""
        if not programs:
            return []
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.cfg.num_workers, thread_name_prefix="sandbox")
        return list(self._pool.map(self.run_one, programs))

    def run_one(self, program: Program) -> SandboxResult:
        slot = self._slots.get()
        try:
            return self._run(program, slot)
        finally:
            self._slots.put(slot)

    def close(self) -> None:
        """Stop the worker threads and the fork server (a later run starts them again)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._zygote.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def server_pid(self) -> int | None:
        """The fork server's pid while it runs (every program's launcher is its child)."""
        return self._zygote.pid

    # ---- one program ----------------------------------------------------------------------------
    def _cpu_s(self, program: Program) -> int:
        return program.cpu_s if program.cpu_s is not None else self.cfg.cpu_floor_s

    def _job(self, program: Program, slot: int, workdir: str, tests_fd: int) -> bytes:
        cfg = self.cfg
        limits = {k: getattr(cfg, k) for k in ("memory_mb", "file_size_mb", "disk_mb", "max_processes", "max_open_files")}
        limits["cpu_s"] = self._cpu_s(program)
        uid = cfg.uid_base + (os.getpid() % (1 << 16)) * _SLOTS_PER_PROCESS + slot % _SLOTS_PER_PROCESS
        return json.dumps({
            "program": program.code, "setup": program.setup, "limits": limits, "isolation": cfg.isolation,
            "uid": uid, "workdir": workdir, "tests_fd": tests_fd, "max_output": cfg.max_output_bytes,
            "keep_output": cfg.keep_output_bytes,
        }).encode()

    def _run(self, program: Program, slot: int) -> SandboxResult:
        t0 = time.perf_counter()
        workdir = tempfile.mkdtemp(prefix="drl-sandbox-")  # the working directory without namespaces
        try:
            with tempfile.TemporaryFile() as tests:
                spec = {"tests": list(program.tests), "trusted_setup": program.trusted_setup,
                        "remote_names": list(program.remote_names)}
                tests.write(json.dumps(spec).encode())
                tests.seek(0)
                stdout, stderr, timed_out = self._launch(self._job(program, slot, workdir, tests.fileno()),
                                                         tests.fileno(), self._cpu_s(program))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        result = self._result(program, stdout, stderr, timed_out)
        result.seconds = time.perf_counter() - t0
        result.cpu_limit_s = self._cpu_s(program)
        return result

    def _launch(self, job: bytes, tests_fd: int, cpu_s: int) -> tuple[bytes, bytes, bool]:
        """Have the fork server start the launcher; its report (stdout and stderr share the pipe)."""
        wall_s = self.cfg.wall_s(cpu_s)
        with tempfile.TemporaryFile() as job_file:
            job_file.write(job)
            job_file.seek(0)
            r, w = os.pipe()
            try:
                pid = self._zygote.start(job_file.fileno(), tests_fd, w)
            finally:
                os.close(w)
        with os.fdopen(r, "rb") as report:
            out, done = _read_until(report, time.monotonic() + wall_s)
            end = time.monotonic() + WALL_EXTENSIONS * wall_s
            while not done and time.monotonic() < end:
                # still computing (runnable, waiting for a core): the machine's load, not the program's fault, and
                # its CPU limit still holds; a program that sleeps or blocks is killed. More CPU than one
                # program may use: a fork bomb, killed too
                cpu, runnable = _group_state(pid)
                if not runnable or cpu > cpu_s + 1:
                    break
                more, done = _read_until(report, min(time.monotonic() + wall_s, end))
                out += more
            if done:
                return out, b"", False
            _kill_group(pid)
            more, _ = _read_until(report, time.monotonic() + 5)  # the group is dead: EOF follows
            return out + more, b"", True

    def _result(self, program: Program, stdout: bytes, stderr: bytes, timed_out: bool) -> SandboxResult:
        total = len(program.tests)
        if timed_out:
            wall = self.cfg.wall_s(self._cpu_s(program))
            return SandboxResult(False, "timeout", f"wall-clock limit of {wall:g} s", tests_total=total)
        lines = stdout.decode("utf-8", "replace").strip().splitlines()
        try:
            report = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            tail = stderr.decode("utf-8", "replace")[-300:]
            return SandboxResult(False, "sandbox_error", f"no report from the harness; stderr: {tail}", tests_total=total)
        self._warn_isolation(report.get("isolation", {}))
        reason = report.get("reason", "sandbox_error")
        passed_tests = int(report.get("tests_passed", 0))
        passed = reason == "passed" and passed_tests == total == int(report.get("tests_total", -1))
        if reason == "passed" and not passed:
            reason = "sandbox_error"  # the harness's counts disagree with ours: never call that a pass
        return SandboxResult(passed, reason if reason in REASONS else "sandbox_error", str(report.get("detail", "")),
                             passed_tests, total, output=str(report.get("output", "")),
                             cpu_s=float(report.get("cpu_s", 0.0)))

    def _warn_isolation(self, applied: dict[str, Any]) -> None:
        if applied.get("namespaces") or self.cfg.isolation == "none" or "isolation" in _warned:
            return
        _warned.add("isolation")
        log.warning(
            "sandbox: no namespaces here (%s); programs run with resource limits, a clean environment and a "
            "fresh directory only: they can reach the network and whatever this user can write. "
            "Run as root or enable user namespaces (kernel.unprivileged_userns_clone=1) to isolate them, or set "
            "task.sandbox.isolation=strict to refuse.", applied.get("why", "unknown"))


class _ForkServer:
    """The trusted ``zygote.py --zygote`` process; started on first use, restarted if it died."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def _spawn(self) -> None:
        self.close()
        mine, theirs = socket.socketpair()
        self._proc = subprocess.Popen([sys.executable, "-I", "-S", str(INIT), "--zygote", str(theirs.fileno())],
                                      pass_fds=(theirs.fileno(),), env=ENV, cwd="/", stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        theirs.close()
        self._sock = mine

    def start(self, job_fd: int, tests_fd: int, report_fd: int) -> int:
        """Fork a launcher for this job; its pid (and process group)."""
        with self._lock:
            for attempt in (0, 1):
                if self._sock is None or self._proc is None or self._proc.poll() is not None:
                    self._spawn()
                assert self._sock is not None
                try:
                    socket.send_fds(self._sock, [b"run"], [job_fd, tests_fd, report_fd])
                    reply = self._sock.recv(32)
                    if reply:
                        return int(reply)
                except OSError:
                    if attempt:
                        raise
                self._proc = None  # it died: start a fresh one and retry once
            raise RuntimeError("the sandbox fork server does not answer")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the server exits on EOF
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


def _read_until(f: Any, deadline: float, cap: int = 4 << 20) -> tuple[bytes, bool]:
    """What ``f`` yields until EOF (True) or ``deadline`` (False); at most ``cap`` bytes kept."""
    out = bytearray()
    fd = f.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return bytes(out), False
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return bytes(out), True
        out += chunk[: max(cap - len(out), 0)]


def _group_state(pgid: int, samples: int = 5) -> tuple[float, bool]:
    """CPU seconds (user + system) used so far by the processes of group ``pgid``, and whether one of
    them was running or waiting for a core (state R) in any of ``samples`` looks 10 ms apart."""
    ticks, runnable = 0, False
    for k in range(samples):
        ticks = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            if int(fields[2]) == pgid:  # after the name: state, ppid, pgrp, ..., utime (11), stime (12)
                ticks += int(fields[11]) + int(fields[12])
                runnable = runnable or fields[0] == "R"
        if runnable:
            break
        time.sleep(0.01 * (k < samples - 1))
    return ticks / _CLOCK_TICKS, runnable


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def isolation_available() -> bool:
    """Whether this process could give programs their own namespaces (root, or user namespaces on)."""
    if os.geteuid() == 0:
        return True
    try:
        return Path("/proc/sys/user/max_user_namespaces").read_text().strip() != "0"
    except OSError:
        return False
