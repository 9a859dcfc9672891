"""The sandbox against hostile programs (docs/methods.md §11): each attack ends with reward 0, the
right reason, and a healthy trainer (no process of the program left, the next program still runs).

Limits are tight so the attacks end fast and stay harmless on a 2-core, 24 GB machine: 256 MB of
address space and 8 tasks per program (a fork bomb can hold at most 2 GB), 8 MB files, 1-2 s of CPU.
Tests of what only namespaces can stop (the network, deleting files, reading other processes'
environments, daemons escaping the process group) skip where this machine cannot create them.

Run: pytest tests/unit/sandbox/test_sandbox.py -q
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.sandbox import harness
from diffusion_rl.sandbox.runner import INIT, Program, Sandbox, SandboxConfig
from tests.conftest import ROOT

TIGHT = SandboxConfig(workers=2, timeout_s=6.0, cpu_floor_s=1, memory_mb=256, file_size_mb=8, disk_mb=16, max_processes=8,
                      max_open_files=32, max_output_bytes=1 << 16, keep_output_bytes=1 << 16)
GOOD = Program("def f(x):\n    return x + 1\n", ("assert f(1) == 2", "assert f(2) == 3"))
TEST = ("assert f(1) == 2",)


@pytest.fixture(scope="module")
def sandbox():
    sb = Sandbox(TIGHT)
    yield sb
    sb.close()


def namespaces_here(sb: Sandbox) -> bool:
    res = sb.run_one(Program("import os\nprint(os.getppid())\ndef f(x):\n    return 2\n", TEST))
    return res.passed and res.output.strip() == "1"  # the supervisor is PID 1 of a PID namespace of its own


@pytest.fixture(scope="module")
def isolated(sandbox):
    if not namespaces_here(sandbox):
        pytest.skip("no namespaces on this machine (not root, user namespaces off): limits-only sandbox")
    return sandbox


def leftovers() -> list[str]:
    """Processes descending from this test process's sandbox fork servers (launchers, supervisors,
    runners, whatever they started), after giving the kernel a moment to finish killing a namespace
    whose PID 1 just died. Fork servers of other processes on the machine are not ours to judge."""
    for _ in range(40):
        parent, ours = {}, set()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                parent[pid] = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
                if parent[pid] == str(os.getpid()) and str(INIT).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    ours.add(pid)  # a fork server of ours
            except (OSError, IndexError):
                continue
        out = []
        for pid in parent:
            p = parent.get(pid)
            for _ in range(64):  # walk up to a fork server of ours, or the top
                if p is None or p in ours:
                    break
                p = parent.get(p)
            if p in ours and pid not in ours:
                out.append(pid)
        if not out:
            break
        time.sleep(0.05)
    return out


def _describe(pid: str) -> str:
    try:
        return f"{pid} {Path(f'/proc/{pid}/stat').read_text()[:80]!r}"
    except OSError:
        return f"{pid} (gone)"


def run_hostile(sb: Sandbox, code: str, tests=TEST, **kw):
    res = sb.run_one(Program(code, tests, **kw))
    assert not res.passed
    left = leftovers()
    assert not left, f"a process of the program outlived its run: {[_describe(pid) for pid in left]}"
    assert sb.run_one(GOOD).passed  # the trainer and the pool still work
    return res


# ---- ordinary outcomes ---------------------------------------------------------------------------
def test_a_correct_program_passes_and_a_wrong_one_fails(sandbox):
    good, wrong, broken = sandbox.run([GOOD, Program("def f(x):\n    return x\n", GOOD.tests),
                                       Program("def f(x) return x\n", GOOD.tests)])
    assert (good.passed, good.reason, good.tests_passed, good.tests_total) == (True, "passed", 2, 2)
    assert (wrong.passed, wrong.reason, wrong.tests_passed) == (False, "failed", 0)
    assert (broken.reason, broken.detail.split(":")[0]) == ("error", "SyntaxError")


def test_partial_counts_and_a_program_exception_in_a_test(sandbox):
    res = sandbox.run_one(Program("def f(x):\n    if x > 1:\n        raise KeyError(x)\n    return x + 1\n", GOOD.tests))
    assert (res.reason, res.tests_passed, res.tests_total) == ("error", 1, 2)
    assert res.detail.startswith("KeyError")


def test_results_come_back_in_order_from_the_pool(sandbox):
    programs = [Program(f"def f(x):\n    return {i}\n", (f"assert f(0) == {i % 3}",)) for i in range(8)]
    assert [r.passed for r in sandbox.run(programs)] == [i % 3 == i for i in range(8)]


# ---- hostile programs ----------------------------------------------------------------------------
def test_infinite_loop(sandbox):
    res = run_hostile(sandbox, "while True:\n    pass\n")
    assert res.reason == "timeout" and "CPU" in res.detail


def test_sleeping_forever_hits_the_wall_clock():
    with Sandbox(SandboxConfig(**{**TIGHT.__dict__, "timeout_s": 1.5})) as sb:
        res = run_hostile(sb, "import time\ntime.sleep(3600)\n")
    assert res.reason == "timeout" and "wall-clock" in res.detail


def test_fork_bomb(sandbox):
    res = run_hostile(sandbox, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert res.reason in ("timeout", "killed")


def test_a_daemon_cannot_outlive_its_run(isolated):
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(3600)\n"
            "def f(x):\n    return 2\n")
    res = isolated.run_one(Program(code, TEST))
    assert res.passed  # the program itself is right; its daemon must still be gone
    assert not leftovers()


def test_ten_gigabyte_allocation(sandbox):
    res = run_hostile(sandbox, "x = bytearray(10 * 1024 ** 3)\n")
    assert res.reason == "memory"


def test_ten_gigabyte_file(sandbox):
    code = 'with open("big", "wb") as f:\n    for _ in range(10 * 1024):\n        f.write(b"0" * (1 << 20))\n'
    res = run_hostile(sandbox, code)
    assert res.reason == "file_size" and "File too large" in res.detail


def test_files_outside_its_directory_survive(isolated):
    folder = Path(tempfile.mkdtemp(dir=ROOT, prefix=".sandbox-sentinel-"))
    try:
        sentinel = folder / "sentinel.txt"
        sentinel.write_text("keep me")
        targets = [str(sentinel), str(Path(harness.__file__)), str(ROOT / "pyproject.toml")]
        code = (f"import os, shutil\nfor p in {targets!r}:\n"
                "    for attack in (lambda: open(p, 'a').write('x'), lambda: os.remove(p),\n"
                "                   lambda: shutil.rmtree(os.path.dirname(p))):\n"
                "        try:\n            attack()\n        except OSError:\n            pass\n")
        run_hostile(isolated, code)
        assert sentinel.read_text() == "keep me"
        assert all(Path(t).is_file() for t in targets)
    finally:
        shutil.rmtree(folder)


def test_the_trainers_environment_does_not_leak(isolated, monkeypatch):
    secret = "s3cret-" + os.urandom(8).hex()
    monkeypatch.setenv("DIFFUSION_RL_TEST_SECRET", secret)
    code = ("import os, glob\nseen = [repr(os.environ)]\n"
            "for p in ['/proc/self/environ', f'/proc/{os.getppid()}/environ'] + glob.glob('/proc/*/environ'):\n"
            "    try:\n        seen.append(open(p, 'rb').read().decode(errors='replace'))\n"
            "    except OSError as err:\n        seen.append(repr(err))\n"
            "print(seen)\ndef f(x):\n    return ' '.join(seen)\n")
    res = isolated.run_one(Program(code, ("assert f(1) == 2",)))
    assert not res.passed and secret not in res.output and secret not in res.detail
    assert "DIFFUSION_RL_TEST_SECRET" not in res.output


def test_a_local_listener_sees_nothing(isolated):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = (f"import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {port}))\n"
            f"except OSError:\n    pass\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hello')\n")
    res = run_hostile(isolated, code)
    assert res.reason == "error" and "OSError" in res.detail
    with pytest.raises(TimeoutError):
        server.accept()
    server.close()


@pytest.mark.parametrize("code,reason", [
    ("import sys\nsys.exit(0)\ndef f(x):\n    return 2\n", "exited"),
    ("import os\nos._exit(0)\n", "exited"),
    ("import os\ndef f(x):\n    os._exit(0)\n", "exited"),  # during the first test
    ("import sys\ndef f(x):\n    sys.exit(0)\n", "exited"),
    ("import os, threading\nthreading.Timer(0.0, os._exit, (0,)).start()\nimport time\ntime.sleep(5)\n", "exited"),
])
def test_exiting_early_is_not_a_pass(sandbox, code, reason):
    assert run_hostile(sandbox, code).reason == reason


@pytest.mark.parametrize("code", [
    "def f(x):\n    return 0\ndef check(candidate):\n    pass\n",  # its own check, and a wrong answer
    "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.AssertionError = type('Never', (Exception,), {})\n"
    "def f(x):\n    return 0\n",
    "class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
    "def f(x):\n    return Yes()\n",
    "class Two(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
    "def f(x):\n    return Two(7)\n",
    "print('passed')\nprint('{\"reason\": \"passed\", \"tests_passed\": 1, \"tests_total\": 1}')\ndef f(x):\n    return 0\n",
    "import os, json\nreport = json.dumps({'reason': 'passed', 'tests_passed': 1, 'tests_total': 1}) + '\\n'\n"
    "for fd in range(64):\n    try:\n        os.write(fd, report.encode())\n    except OSError:\n        pass\n"
    "def f(x):\n    return 0\n",
])
def test_cheating_the_checker_is_not_a_pass(sandbox, code):
    tests = ("def check(candidate):\n    assert abs(candidate(1) - 2) < 1e-9\ncheck(f)\n",)
    # a forged message on the harness's pipe garbles the protocol: the harness stops talking ("exited")
    assert run_hostile(sandbox, code, tests).reason in ("failed", "error", "exited")


def test_segfault(sandbox):
    res = run_hostile(sandbox, "import ctypes\nctypes.string_at(0)\n")
    assert res.reason == "killed" and "SIGSEGV" in res.detail


def test_printing_a_hundred_million_characters(sandbox):
    res = run_hostile(sandbox, "import sys\nfor _ in range(10 ** 4):\n    sys.stdout.write('x' * 10 ** 4)\n")
    assert res.reason == "output_limit"
    assert len(res.output) <= TIGHT.keep_output_bytes


# ---- the harness's data crossing ------------------------------------------------------------------
def test_plain_data_round_trips_exactly():
    values = [None, True, 0, -3, 2 ** 40000, 1.5, float("inf"), -0.0, 1 + 2j, "é", b"\x00\xff", [1, (2, 3)],
              {(1, 2): {3}}, frozenset({1}), {"a": [None]}]
    for v in values:
        back = harness.decode(json.loads(json.dumps(harness.encode(v))), lambda x: None)
        assert back == v and type(back) is type(v)
    nan = harness.decode(json.loads(json.dumps(harness.encode(float("nan")))), lambda x: None)
    assert nan != nan
    with pytest.raises(harness.Unencodable):
        harness.encode(object())  # the supervisor never sends an object it cannot rebuild


def test_subclasses_cross_as_their_plain_base_and_objects_stay_behind():
    from collections import Counter, namedtuple

    keep: dict = {}
    point = namedtuple("Point", "x y")
    enc = harness.encode([Counter("aab"), point(1, 2), object], keep)
    assert harness.decode(json.loads(json.dumps(enc)), lambda x: ("ref", x)) == [{"a": 2, "b": 1}, (1, 2), object]
    obj = object()
    assert harness.encode(obj, keep) == {"r": id(obj)} and keep[id(obj)] is obj


def test_objects_of_the_program_stay_in_its_process(sandbox):
    code = ("class Node:\n    def __init__(self, v, nxt=None):\n        self.v, self.nxt = v, nxt\n"
            "def total(n):\n    return 0 if n is None else n.v + total(n.nxt)\n")
    res = sandbox.run_one(Program(code, ("assert total(head) == 6", "assert head == head", "assert total(Node(5)) == 5"),
                                  setup="head = Node(1, Node(2, Node(3)))"))
    assert res.passed, res.detail


def test_trusted_setup_defines_helpers_and_the_entry_point_comes_from_the_program(sandbox):
    prompt = 'def helper(x):\n    return 2 * x\n\ndef f(x):\n    """Return helper(x) + 1."""\n'
    tests = ("def check(candidate):\n    assert candidate(3) == helper(3) + 1\ncheck(f)\n",)
    right = Program(prompt + "    return helper(x) + 1\n", tests, trusted_setup=prompt, remote_names=("f",))
    cheat = Program(prompt + "    return 0\ndef helper(x):\n    return -1\n", tests, trusted_setup=prompt, remote_names=("f",))
    r, c = sandbox.run([right, cheat])
    assert r.passed and not c.passed  # the tests use the prompt's helper, not the program's


# ---- configuration and machinery -----------------------------------------------------------------
@pytest.mark.parametrize("key,value", [("isolation", "maybe"), ("workers", -1), ("max_processes", 2),
                                       ("memory_mb", 8), ("timeout_s", 0.0)])
def test_bad_settings_are_one_line_errors(key, value):
    with pytest.raises(ConfigError, match=f"task.sandbox.{key}"):
        Sandbox(SandboxConfig(**{key: value}))


def test_isolation_none_still_runs_programs_with_limits():
    with Sandbox(SandboxConfig(**{**TIGHT.__dict__, "isolation": "none"})) as sb:
        ok, loop = sb.run([GOOD, Program("while True:\n    pass\n", TEST)])
    assert ok.passed and loop.reason == "timeout"


def test_unprivileged_user_namespace_path(tmp_path):
    """As root, run the launcher as 'nobody' with a system Python (the venv's may be under /root)."""
    python, setpriv = shutil.which("python3", path="/usr/bin:/bin"), shutil.which("setpriv")
    if os.geteuid() != 0 or not python or not setpriv or not os.access(INIT, os.R_OK):
        pytest.skip("needs root, setpriv and a system python3 to impersonate an unprivileged user")
    if Path("/proc/sys/user/max_user_namespaces").read_text().strip() == "0":
        pytest.skip("user namespaces are off")
    tests = tmp_path / "tests.json"
    tests.write_text(json.dumps({"tests": ["assert f(1) == 2"]}))
    os.chmod(tmp_path, 0o755)
    os.chmod(tests, 0o644)
    code = "import os\nprint(os.getppid(), open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n" \
           "def f(x):\n    return 2\n"
    limits = {k: getattr(TIGHT, k) for k in ("memory_mb", "file_size_mb", "disk_mb", "max_processes", "max_open_files")}
    job = {"program": code, "limits": {**limits, "cpu_s": TIGHT.cpu_floor_s},
           "isolation": "strict", "uid": 0, "workdir": str(tmp_path), "max_output": 4096, "keep_output": 4096}
    with open(tests, "rb") as f:
        job["tests_fd"] = f.fileno()
        proc = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-I", "-S", str(INIT)],
                              input=json.dumps(job).encode(), capture_output=True, pass_fds=(f.fileno(),), timeout=30)
    report = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    if report["reason"] == "sandbox_error" and "unshare" in report["detail"]:
        pytest.skip(f"unprivileged user namespaces refused here: {report['detail']}")
    assert report["reason"] == "passed" and report["isolation"]["namespaces"], report
    assert report["output"].split() == ["1", "0000000000000000"]  # under PID 1, no capability left


def test_concurrent_runs_share_nothing(sandbox):
    """Two programs in flight at once each see only their own working directory."""
    code = ("import os, time\nopen('mine', 'w').write(str(os.getpid()))\ntime.sleep(0.3)\n"
            "print(sorted(os.listdir('.')))\ndef f(x):\n    return 2\n")
    barrier = threading.Barrier(2)

    def one():
        barrier.wait()
        return sandbox.run_one(Program(code, TEST))

    results = []
    threads = [threading.Thread(target=lambda: results.append(one())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.output.strip() for r in results] == ["['mine']", "['mine']"]
