"""The warm sandbox worker: runs *inside* the isolation boundary, one job at a time.

This file is executed as a script (``python -I -S -c <this source> <json settings>``) by the pool; it must
import nothing but the standard library and never import flywheel. The pool and this worker talk over the
worker's stdin/stdout with frames: a 4-byte big-endian length followed by a UTF-8 JSON object.

Per job the worker forks; the child starts a new session, drops to the unprivileged job uid (when the
worker runs with CAP_SETUID), applies rlimits (address space, CPU seconds, processes, file size, open files,
no core dumps), points stdin at /dev/null and stdout/stderr at size-capped files in a fresh private job
directory, then executes the candidate code and the tests *in this already-warm interpreter* (no new
interpreter: that is what makes a job cost about a millisecond). The worker waits on a pidfd with the
wall-clock deadline, SIGKILLs the child's process group on expiry, and after every job sends SIGKILL to
``-1`` — every other process in the worker's pid namespace (pid 1, the namespace's init, is exempt),
which removes ``setsid`` grandchildren without ever waiting on a pipe's EOF.

The pass signal is a nonce. The worker draws it *after* the fork, so it is not in the child's memory
while the candidate runs, and writes it into a pipe that the harness reads only once the candidate and
every test have finished; the harness echoes it on a separate result pipe, never on stdout. So printing
a pass line, ``exit(0)``, ``os._exit(0)``, raising ``SystemExit`` or killing the harness earns nothing.

Non-goals (what the nonce does NOT stop): candidate code runs in the harness's own process, so code that
deliberately reverse-engineers this harness — walks its stack frames, finds the nonce pipe among its file
descriptors and echoes the nonce itself, or returns objects whose ``__eq__`` always says True to an
``assert x == y`` test — can forge a pass. The python-expr verifier closes the ``__eq__`` hole by
comparing only exact builtin literal values outside the sandbox. Containment (what the candidate can
touch) does not depend on the nonce: that is the namespaces' and rlimits' job.
"""

from __future__ import annotations

import builtins
import gc
import json
import os
import resource
import select
import signal
import struct
import sys
import time
import traceback
from typing import Any

_SETTINGS = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
_JOB_UID = int(_SETTINGS.get("job_uid", -1))  # -1: do not change uid (not privileged)
_TMP_DIR = _SETTINGS.get("tmp_dir", "/tmp")
_PID_NAMESPACE = bool(_SETTINGS.get("pid_namespace", False))  # kill(-1) is safe only inside our own
_job_counter = [0]
_FRAMES_IN, _FRAMES_OUT = 0, 1  # moved to high fds by main()
_LITERAL_TYPES = (int, float, complex, str, bytes, bool, type(None))


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _send(obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    out = struct.pack(">I", len(data)) + data
    while out:
        out = out[os.write(_FRAMES_OUT, out) :]


def _is_literal(value: Any, depth: int = 0) -> bool:
    """Only exact builtin literal types (no subclasses) are reported: a subclass could lie in __repr__."""
    if depth > 20:
        return False
    kind = type(value)
    if kind in _LITERAL_TYPES:
        return True
    if kind in (list, tuple, set, frozenset):
        return all(_is_literal(v, depth + 1) for v in value)
    if kind is dict:
        return all(_is_literal(k, depth + 1) and _is_literal(v, depth + 1) for k, v in value.items())
    return False


def _failed_test(exc: BaseException, tests: str) -> str:
    """Name the failing test: the line of the tests source that raised, or the exception."""
    line_no = 0
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == "<tests>":
            line_no = lineno
    kind = type(exc).__name__
    if line_no:
        lines = tests.splitlines()
        text = lines[line_no - 1].strip() if 0 < line_no <= len(lines) else ""
        return f"test failed at tests line {line_no}: {text[:200]} ({kind}: {str(exc)[:200]})"
    return f"test raised {kind}: {str(exc)[:200]}"


def _harness(job: dict[str, Any], nonce_fd: int, result_fd: int) -> None:
    """Runs in the forked child. Reports over ``result_fd``; the nonce line is the only pass signal."""

    def report(tag: str, text: str) -> None:
        os.write(result_fd, (tag + " " + text.replace("\n", " ")[:2000] + "\n").encode("utf-8", "replace"))

    code, tests, mode = job["code"], job.get("tests") or "", job.get("mode", "exec")
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    stage = "candidate"
    try:
        if mode == "expr":
            value = eval(compile(code, "<candidate>", "eval"), namespace)
            if not _is_literal(value):
                report("D", f"the expression's value is not a plain literal (got {type(value).__name__})")
                return
            text = repr(value)
            if len(text) > 100_000:
                report("D", "the expression's value is too large to report")
                return
            report("V", text)
        else:
            exec(compile(code, "<candidate>", "exec"), namespace)
        if tests:
            stage = "tests"
            exec(compile(tests, "<tests>", "exec"), namespace)
    except MemoryError:
        report("M", "MemoryError in the " + stage)
        return
    except SystemExit as exc:
        if stage == "candidate" and not tests and exc.code in (None, 0):
            pass  # a plain program that exits cleanly has run to completion
        else:
            report("D", f"exit({exc.code!r}) called in the {stage}, before the checks finished")
            return
    except BaseException as exc:
        if stage == "tests":
            report("D", _failed_test(exc, tests))
        else:
            report("D", f"candidate raised {type(exc).__name__}: {str(exc)[:300]}")
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    nonce = os.read(nonce_fd, 64).decode("ascii", "replace")
    report("P", nonce)


def _child(job: dict[str, Any], job_dir: str, out_fd: int, err_fd: int, nonce_fd: int, result_fd: int) -> None:
    try:
        os.setsid()
        null_fd = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.dup2(out_fd, 1)  # the stdio objects made in main() write to fds 0-2: no per-job wrappers
        os.dup2(err_fd, 2)
        keep = sorted({nonce_fd, result_fd})  # closes the frame pipes, the job dir's fds and the rest
        low = 3
        for fd in keep:
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 65536)
        os.chdir(job_dir)
        if _JOB_UID >= 0:
            os.setgroups([])
            os.setgid(_JOB_UID)
            os.setuid(_JOB_UID)
        limits = job["limits"]
        for name, value in (
            ("RLIMIT_AS", limits["memory_bytes"]),
            ("RLIMIT_CPU", limits["cpu_s"]),
            ("RLIMIT_NPROC", limits["nproc"]),
            ("RLIMIT_FSIZE", limits["file_bytes"]),
            ("RLIMIT_NOFILE", limits["nofile"]),
            ("RLIMIT_CORE", 0),
        ):
            hard = value + 1 if name == "RLIMIT_CPU" else value  # SIGXCPU first, SIGKILL a second later
            resource.setrlimit(getattr(resource, name), (value, hard))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; exceeding RLIMIT_FSIZE should kill
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": job_dir, "LANG": "C.UTF-8"})
        gc.enable()
        _harness(job, nonce_fd, result_fd)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
    except BaseException:
        try:
            os.write(result_fd, b"D harness error: " + traceback.format_exc()[-500:].encode() + b"\n")
        except BaseException:
            pass
    os._exit(0)


def _remove_tree(path: str) -> None:
    """Best effort: files the job left in nested directories it owns may stay until the worker recycles."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files + dirs:
            full = os.path.join(root, name)
            try:
                if name in dirs and not os.path.islink(full):
                    os.rmdir(full)
                else:
                    os.unlink(full)
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def _fresh_job_dir() -> str:
    """A new directory per job (the previous one is removed as far as we are allowed)."""
    _job_counter[0] += 1
    previous = f"{_TMP_DIR}/fwjob-{os.getpid()}-{_job_counter[0] - 1}"
    if os.path.isdir(previous):
        _remove_tree(previous)
    path = f"{_TMP_DIR}/fwjob-{os.getpid()}-{_job_counter[0]}"
    os.mkdir(path, 0o700)
    os.chmod(path, 0o1777)
    return path


def _read_capped(path: str, cap: int) -> tuple[int, str]:
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            data = f.read(cap)
    except OSError:
        return 0, ""
    return size, data.decode("utf-8", "replace")


def _run_job(job: dict[str, Any]) -> dict[str, Any]:
    job_dir = _fresh_job_dir()
    out_path, err_path = job_dir + "/.stdout", job_dir + "/.stderr"
    out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    nonce_r, nonce_w = os.pipe()
    result_r, result_w = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(job, job_dir, out_fd, err_fd, nonce_r, result_w)
    os.close(out_fd)
    os.close(err_fd)
    os.close(nonce_r)
    os.close(result_w)
    nonce = os.urandom(16).hex()  # drawn after the fork: the child never had it in memory
    os.write(nonce_w, nonce.encode())
    os.close(nonce_w)
    timed_out, status, report = _wait_for_job(pid, result_r, float(job["timeout_s"]))
    elapsed = time.monotonic() - started
    os.close(result_r)
    stray = _kill_everything_else()
    passed, value, detail, memory = False, None, "", False
    for line in report.decode("utf-8", "replace").splitlines():
        tag, _, text = line.partition(" ")
        if tag == "P" and text == nonce:
            passed = True
            break
        if tag == "V":
            value = text
        elif tag == "D":
            detail = text
        elif tag == "M":
            memory, detail = True, text
    cap = int(job["output_cap"])
    out_size, out_text = _read_capped(out_path, cap)
    err_size, err_text = _read_capped(err_path, cap)
    return {
        "id": job["id"],
        "timed_out": timed_out,
        "exit_code": os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None,
        "passed": passed,
        "value": value,
        "detail": detail,
        "memory_error": memory,
        "stdout": out_text,
        "stderr": err_text,
        "stdout_bytes": out_size,
        "stderr_bytes": err_size,
        "elapsed_s": elapsed,
        "stray_processes": stray,
    }


_TERMINAL_TAGS = (b"P ", b"D ", b"M ")
_pending: set[int] = set()  # our children that finished their job but may not have been reaped yet


def _wait_for_job(pid: int, result_r: int, timeout_s: float) -> tuple[bool, int | None, bytes]:
    """Wait until the child exits, reports a terminal line, or the deadline passes.

    Returns (timed_out, wait status or None, raw report). A terminal line ends the wait without
    waiting for the child's exit (process teardown is slow; it is reaped later), so the result is
    known a few hundred microseconds sooner. Never waits on the pipe's EOF: a grandchild may hold it.
    """
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(result_r, select.POLLIN)
    os.set_blocking(result_r, False)
    deadline = time.monotonic() + max(0.0, timeout_s)
    report, exited, eof, timed_out = b"", False, False, False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        for fd, _ in poller.poll(remaining * 1000):
            if fd == pidfd:
                exited = True
            elif not eof:
                eof, report = _drain(result_r, report, poller)
        if exited or any(line[:2] in _TERMINAL_TAGS for line in report.splitlines()):
            break
    if exited:
        report = _drain(result_r, report, None)[1]
    os.close(pidfd)
    status = None
    if timed_out:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
        status = os.waitpid(pid, 0)[1]
    elif exited or not _PID_NAMESPACE:  # without a pid namespace, leftovers are found by uid: reap first
        status = os.waitpid(pid, 0)[1]
    else:
        _pending.add(pid)
    return timed_out, status, report


def _drain(fd: int, report: bytes, poller: select.poll | None) -> tuple[bool, bytes]:
    """Read what the pipe holds now; returns (eof, report)."""
    try:
        while len(report) < 1 << 20:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                if poller is not None:
                    poller.unregister(fd)
                return True, report
            report += chunk
    except BlockingIOError:
        pass
    return False, report


def _reap() -> None:
    for pid in list(_pending):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _pending.discard(pid)
    if _PID_NAMESPACE and os.getpid() == 1:  # unshare: we are init, orphans are ours to reap
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass


def _kill_everything_else() -> int:
    """SIGKILL whatever the job left behind, setsid grandchildren included; returns how many were found.

    Inside our own pid namespace: any pid in /proc other than ours, pid 1 and our not-yet-reaped job
    children is a leftover; then kill(-1) reaches every process but ourselves and pid 1. Without a pid
    namespace, a helper dropped to the job's private uid does kill(-1), which reaches exactly that
    uid's processes. Without either (unprivileged rlimits-only mode) only the job's process group dies.
    """
    _reap()
    if _PID_NAMESPACE:
        me = os.getpid()
        stray = [
            int(name)
            for name in os.listdir("/proc")
            if name.isdigit() and int(name) not in (1, me) and int(name) not in _pending
        ]
        if stray:
            _kill_all_visible()
        return len(stray)
    if _JOB_UID < 0:
        return 0
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(_JOB_UID)
            os.setuid(_JOB_UID)
            os._exit(min(_kill_all_visible(), 100))
        except BaseException:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 0


def _kill_all_visible() -> int:
    hits = 0
    for _ in range(5):
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:  # ESRCH: nothing left to kill
            break
        hits += 1
        time.sleep(0.002)
    return hits


def _exit_builtin(code: object = None) -> None:
    raise SystemExit(code)


def main() -> None:
    global _FRAMES_IN, _FRAMES_OUT
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # Frames move to high fds; 0-2 become /dev/null so that the stdio objects built here, once, serve
    # every job child after it dup2()s its output files over fds 1 and 2.
    _FRAMES_IN, _FRAMES_OUT = os.dup(0), os.dup(1)
    null_fd = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null_fd, fd)
    os.close(null_fd)
    # These live for the worker's lifetime and are inherited by every job child: no context manager.
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(  # noqa: SIM115
        1, "w", closefd=False, buffering=1 << 16, encoding="utf-8", errors="backslashreplace"
    )
    sys.stderr = open(2, "w", closefd=False, buffering=1, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
    # Each page a job child writes costs a copy-on-write fault; keeping the collector from walking
    # the warm heap in every child is most of the per-job cost we can remove.
    # -S skips site, which normally installs them
    builtins.exit = builtins.quit = _exit_builtin  # type: ignore[assignment]
    gc.freeze()
    gc.disable()
    _send({"ready": True, "pid": os.getpid(), "uid": os.getuid()})
    while True:
        try:
            (size,) = struct.unpack(">I", _read_exact(_FRAMES_IN, 4))
            job = json.loads(_read_exact(_FRAMES_IN, size))
        except EOFError:
            return
        try:
            result = _run_job(job)
        except Exception:
            result = {"id": job.get("id"), "internal_error": traceback.format_exc()[-2000:]}
        _send(result)


if __name__ == "__main__":
    main()
