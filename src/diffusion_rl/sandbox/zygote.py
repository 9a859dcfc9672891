"""The sandbox's first process: isolate, then fork the supervisor and the runner of ``harness.py``.

``sandbox.py`` starts this file once as a fork server (``python -I -S zygote.py --zygote FD``,
an empty environment): for each program it forks a launcher that leads a new session, reads the job
(program, limits) and later hands the tests' fd to the supervisor, and reports on a pipe. (Run
without ``--zygote`` it runs one job from stdin.) Nothing here is imported by the project; it uses
only the standard library and ``ctypes`` (Python 3.11 has no ``os.unshare``).

Isolation (``isolation: auto | strict | none``; docs/methods.md §11), when the kernel lets us (we
are root, or unprivileged user namespaces are on):

1. ``unshare`` mount, network, PID, IPC and UTS namespaces (plus a user namespace when not root,
   mapping only our own uid): the new network namespace has no interface up, so nothing is
   reachable, not even the host's ``localhost``.
2. every mount read-only and ``nosuid`` (``mount_setattr(AT_RECURSIVE)``); as root also ``nodev``,
   with a fresh ``/dev`` holding only null, zero, full, random and urandom.
3. a fresh ``tmpfs`` of ``disk_mb`` as ``/tmp``, the working directory (the host's ``/tmp`` is hidden).
4. as root, the program runs as an unprivileged uid of its own (``uid`` in the job): the
   directories the interpreter's standard library sits under, when that uid could not enter them
   (``/root`` of a pyenv install), are covered by an empty ``tmpfs`` holding read-only binds of
   exactly those library folders, so root's home stays hidden while ``import`` still works.
5. a forked child is PID 1 of the new PID namespace (a fresh read-only ``/proc`` that shows only the
   sandbox); when it exits the kernel kills every process left in the namespace, so a program that
   ``setsid()``s a daemon cannot outlive its run. It drops every capability, sets ``no_new_privs``,
   makes itself non-dumpable and becomes the supervisor.

With ``auto`` and no namespaces (unprivileged, user namespaces off), programs run with only the
resource limits, a clean environment and a fresh working directory; ``sandbox.py`` says so once in
the log. ``strict`` refuses instead.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import socket
import sys
from typing import Any

STDLIB = [p for p in sys.path if os.path.isdir(p)]  # with -I -S: the standard library's folders only
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402 - next to this file; -I keeps the script's folder off sys.path

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
AT_FDCWD, AT_RECURSIVE, SYS_MOUNT_SETATTR = -100, 0x8000, 442  # 442 on every architecture (>= 5.12)
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 36, 38
DEVICES = {"null": 3, "zero": 5, "full": 7, "random": 8, "urandom": 9}  # char devices, major 1

libc = ctypes.CDLL(None, use_errno=True)


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(libc.mount(enc(source), target.encode(), enc(fstype), flags, enc(data)), f"mount {target}")


def make_readonly(path: str, nodev: bool) -> None:
    """Every mount at and below ``path`` read-only and nosuid (nodev too when asked)."""
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | (MOUNT_ATTR_NODEV if nodev else 0), 0, 0, 0)
    fn = getattr(libc, "mount_setattr", None)
    args = (AT_FDCWD, path.encode(), AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))
    ret = fn(*args) if fn is not None else libc.syscall(SYS_MOUNT_SETATTR, *args)
    _check(ret, f"mount_setattr {path}")


def _enterable(path: str) -> bool:
    """Whether any user may enter ``path`` (the 'other' execute bit)."""
    return bool(os.stat(path).st_mode & 0o001)


def expose_stdlib(dirs: list[str]) -> None:
    """Cover each ancestor of ``dirs`` that an unprivileged uid cannot enter with an empty tmpfs
    that holds read-only binds of exactly ``dirs`` (e.g. ``/root`` over a pyenv install)."""
    fds = {d: os.open(d, os.O_PATH | os.O_DIRECTORY) for d in dirs}  # before anything is covered
    blocked: list[str] = []
    for d in dirs:
        parts = d.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            anc = "/" + "/".join(parts[:i])
            if not _enterable(anc) and not any(anc.startswith(b + "/") or anc == b for b in blocked):
                blocked.append(anc)
                break
    for b in blocked:
        mount("tmpfs", b, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
    for d, fd in fds.items():
        if any(d.startswith(b + "/") for b in blocked):
            os.makedirs(d, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", d, None, MS_BIND | MS_REC)
        os.close(fd)


def fresh_dev(disk_mb: int) -> None:
    """A new ``/dev`` with only the harmless character devices (root only: needs mknod)."""
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "size=64k,mode=0755")
    for name, minor in DEVICES.items():
        os.mknod(f"/dev/{name}", 0o666 | 0o020000, os.makedev(1, minor))
        os.chmod(f"/dev/{name}", 0o666)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{name}")
    os.mkdir("/dev/shm")
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_mb}m,mode=1777")
    mount(None, "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID)


def isolate(job: dict[str, Any]) -> dict[str, Any]:
    """Enter the namespaces and build the file system view; what was applied (see the docstring)."""
    applied: dict[str, Any] = {"namespaces": False}
    if job["isolation"] == "none":
        return {**applied, "why": "isolation=none"}
    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    try:
        if root:
            os.setgroups([])
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        _check(libc.unshare(flags | (0 if root else CLONE_NEWUSER)), "unshare")
    except OSError as err:
        if job["isolation"] == "strict":
            raise
        return {**applied, "why": str(err)}
    if not root:  # only our own uid exists in the new user namespace
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    owner = job["uid"] if root else uid
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates back to the host
    if root:
        expose_stdlib(STDLIB)
    make_readonly("/", nodev=root)
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={job['limits']['disk_mb']}m,mode=0700,uid={owner},gid={owner if root else gid}")
    if root:
        fresh_dev(job["limits"]["disk_mb"])
    libc.sethostname(b"sandbox", 7)
    return {"namespaces": True, "uid": owner}


def drop_privileges(applied: dict[str, Any], root: bool) -> None:
    """Become the program's unprivileged uid (root) or drop the user namespace's capabilities."""
    if applied["namespaces"]:
        try:
            mount("proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except OSError:  # a container that masks parts of /proc forbids a new one: hide it instead
            mount("tmpfs", "/proc", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k")
        if root:
            os.setresgid(applied["uid"], applied["uid"], applied["uid"])
            os.setresuid(applied["uid"], applied["uid"], applied["uid"])  # clears every capability
        else:
            header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
            _check(libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "dumpable")


def limit(limits: dict[str, Any], fallback_nproc: bool) -> None:
    """The runner's resource limits (the supervisor keeps its own)."""
    mb = 1 << 20
    nproc = limits["max_processes"]
    if fallback_nproc:  # no namespace: the count is the whole uid's, so allow ours on top of what runs now
        nproc += sum(1 for p in os.listdir("/proc") if p.isdigit())
    for res, soft, hard in (
        (resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1),
        (resource.RLIMIT_AS, limits["memory_mb"] * mb, limits["memory_mb"] * mb),
        (resource.RLIMIT_FSIZE, limits["file_size_mb"] * mb, limits["file_size_mb"] * mb),
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_NOFILE, limits["max_open_files"], limits["max_open_files"]),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        resource.setrlimit(res, (soft, hard))


def supervise(job: dict[str, Any], applied: dict[str, Any]) -> dict[str, Any]:
    """Fork the runner, run the tests against it, and say what happened."""
    cmd_r, cmd_w = os.pipe()
    resp_r, resp_w = os.pipe()
    out_r, out_w = os.pipe()
    workdir = "/tmp" if applied["namespaces"] else job["workdir"]
    os.chdir(workdir)
    os.environ.update({"HOME": workdir, "TMPDIR": workdir})
    pid = os.fork()
    if pid == 0:  # the runner: the program's process
        try:
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            low = 3
            for fd in sorted({cmd_r, resp_w}):  # close everything else, the tests' fd among them
                os.closerange(low, fd)
                low = fd + 1
            os.closerange(low, 1 << 16)
            limit(job["limits"], fallback_nproc=not applied["namespaces"])
        except BaseException:  # noqa: BLE001 - never fall through into the supervisor's code
            os._exit(70)
        try:
            harness.runner(job["program"], job.get("setup", ""), cmd_r, resp_w)
        finally:  # the runner never returns into the supervisor's code, whatever the program did
            os._exit(71)
    for fd in (cmd_r, resp_w, out_w):
        os.close(fd)
    with os.fdopen(job["tests_fd"], "rb") as f:  # read only now: the runner never had the tests in its memory
        spec = json.loads(f.read())
    sup = harness.Supervisor(pid, cmd_w, resp_r, out_r, job["max_output"], job["keep_output"])
    try:
        report = harness.run_tests(sup, spec)
        status = sup.finish()
    except harness.OutputLimit:
        os.kill(pid, signal.SIGKILL)
        report, status = {"reason": "output_limit", "detail": f"more than {job['max_output']} bytes of output"}, sup.reap()
    except harness.RunnerGone:  # dead, or alive after SystemExit in a call: tell it to go
        report, status = {}, sup.finish()
    report.setdefault("tests_total", len(spec["tests"]))
    return {**_verdict(report, status, sup, job["limits"]["cpu_s"]), "output": sup.output.decode("utf-8", "replace"),
            "cpu_s": round(sup.cpu_s, 4)}


def _verdict(report: dict[str, Any], status: int, sup: harness.Supervisor, cpu_s: int) -> dict[str, Any]:
    """Passed only if every test passed, the runner was still there for all of them, and it exited 0
    when told to."""
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        if report.get("reason") == "output_limit":
            return report
        if sig == "SIGXCPU" or (sig == "SIGKILL" and sup.cpu_s >= cpu_s):  # SIGKILL: past the hard limit (SIGXCPU ignored)
            return {**report, "reason": "timeout", "detail": f"CPU time limit of {cpu_s} s"}
        return {**report, "reason": "killed", "detail": f"the program's process died of {sig}"}
    code = os.WEXITSTATUS(status)
    if sup.lost == "output_limit":
        return {**report, "reason": "output_limit", "detail": "output limit"}
    if sup.lost or code != 0 or "reason" not in report:
        ran = f"{report.get('tests_run', 0)} of {report['tests_total']} tests"
        return {**report, "reason": "exited", "detail": f"the program's process ended (status {code}) after {ran}"}
    return report


def launch(job: dict[str, Any]) -> None:
    """Run one job in this process (fds 0-2 taken, the report going to fd 1); never returns."""
    root = os.geteuid() == 0
    try:
        applied = isolate(job)
    except BaseException as err:  # noqa: BLE001 - strict isolation refused, or a mount failed
        report = {"reason": "sandbox_error", "detail": f"isolation failed: {err}"[:500], "isolation": {}}
        os.write(1, (json.dumps(report) + "\n").encode())
        os._exit(0)
    if applied["namespaces"]:
        pid = os.fork()  # the child is PID 1 of the new PID namespace
        if pid:
            libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
            os.close(job["tests_fd"])
            _, status = os.waitpid(pid, 0)
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
    try:
        drop_privileges(applied, root)
        result = supervise(job, applied)
    except BaseException as err:  # noqa: BLE001 - the harness itself failed: say so, never "passed"
        result = {"reason": "sandbox_error", "detail": f"{type(err).__name__}: {err}"[:500]}
    result["isolation"] = applied
    os.write(1, (json.dumps(result) + "\n").encode())
    os._exit(0)


def zygote(sock: socket.socket) -> None:
    """Fork one launcher per request: a message on ``sock`` brings three fds (the job, the tests, the
    report pipe); the answer is the launcher's pid, which leads a new session (the trainer kills its
    group on timeout). Forking this small, already-imported process saves an interpreter start per
    program. A subreaper, it reaps its launchers and whatever they orphan."""
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    while True:
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if not select.select([sock], [], [], 0.2)[0]:
            continue
        msg, fds, _, _ = socket.recv_fds(sock, 16, 3)
        if not msg:
            os._exit(0)  # the trainer closed its end
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                os.setsid()
                job_fd, tests_fd, report_fd = fds
                for target in (1, 2):
                    os.dup2(report_fd, target)
                os.close(report_fd)
                with os.fdopen(job_fd, "rb") as f:
                    job = json.loads(f.read())
                job["tests_fd"] = tests_fd
            except BaseException:  # noqa: BLE001 - never fall back into the server loop
                os._exit(70)
            launch(job)
        for fd in fds:
            os.close(fd)
        sock.sendall(str(pid).encode())


if __name__ == "__main__":
    one_job = None if sys.argv[1:2] == ["--zygote"] else json.loads(sys.stdin.buffer.read())
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # keep fds 0-2 taken: new pipes must not land there
    if one_job is None:
        zygote(socket.socket(fileno=int(sys.argv[2])))
    else:  # one job on stdin (the tests use this to run it as another user)
        launch(one_job)
