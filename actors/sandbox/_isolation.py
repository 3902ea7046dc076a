"""Isolation levels and the command lines that start a sandbox worker under each.

Levels, strongest first:

- ``bwrap``   bubblewrap: new pid (the worker is its pid 1), net, ipc, uts (and cgroup) namespaces, a
  read-only filesystem made only of /usr (+ /lib*, /bin symlinks) and the Python prefix, a fresh /proc, a
  /dev whose only writable part is a size-capped /dev/shm, a private size-capped tmpfs at /tmp, cleared
  environment, ``--die-with-parent``, ``--new-session``. The worker empties /tmp and /dev/shm after every job.
- ``unshare`` util-linux unshare: new pid (with a private /proc), net, ipc, uts and mount namespaces,
  cleared environment, but the host filesystem stays visible (read with the job uid's permissions) and
  /dev/shm is the host's. As a normal user it maps only our own uid (``--map-current-user``), so the
  worker holds no capabilities over the jobs.
- ``rlimits`` no namespaces: rlimits, a private session, a private uid when we are root. Network and the
  host filesystem are reachable, and as a normal user so is every process of our uid.

The pool refuses to start below its ``min_isolation`` (``bwrap`` unless the caller opts in to less), and the level
in force is part of every verdict.

Unprivileged uid: when the pool runs as root, a user namespace would map the job's uid to host root, and
the kernel does not apply RLIMIT_NPROC to root — a fork bomb would be bounded by nothing but pid_max.
So as root we do *not* unshare the user namespace: the worker keeps only CAP_SETUID, CAP_SETGID and
CAP_KILL, and each job drops to a private host uid (one per worker slot, so process counts of different
slots never mix) before running. As a normal user, bwrap uses ``--unshare-all`` (user namespace
included) and jobs keep our own non-root uid, to which RLIMIT_NPROC applies.

Scratch space outside bubblewrap is a directory per slot under a private directory of the pool (owned by the
slot's job uid when we are root), so that a worker empties only its own.

Non-goals: no seccomp filter and no cgroup limits (memory is bounded by RLIMIT_AS per process and the
tmpfs sizes, process count by RLIMIT_NPROC, the tmpfs's inode count only by the job's time); kernel
exploits are out of scope.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path


class Isolation(IntEnum):
    RLIMITS = 1
    UNSHARE = 2
    BWRAP = 3

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, name: str) -> Isolation:
        try:
            return cls[name.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown isolation level {name!r}; expected one of bwrap, unshare, rlimits") from None


class IsolationRefused(RuntimeError):
    """The best isolation available here is weaker than the spec demands."""


WORKER_SOURCE = (Path(__file__).with_name("_worker.py")).read_text()
IS_ROOT = os.geteuid() == 0


def default_python() -> str:
    """The interpreter that runs workers: this one's real executable (not a venv shim)."""
    return os.path.realpath(sys.executable)


def python_prefix(python: str) -> str:
    """The installation prefix to bind read-only: ``<prefix>/bin/python`` → ``<prefix>``."""
    return str(Path(os.path.realpath(python)).parent.parent)


@dataclass(frozen=True)
class WorkerCommand:
    argv: list[str]
    isolation: Isolation
    job_uid: int  # -1: jobs keep the worker's uid
    tmp_dir: str  # where job directories are made (inside the sandbox's view)


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("lib", "lib64", "lib32", "bin", "sbin"):
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{name}"]
    return args


def slot_tmp_dir(host_tmp: str, slot: int) -> str:
    """The scratch directory of one worker slot outside bubblewrap (see the module docstring)."""
    return os.path.join(host_tmp, f"slot-{slot}")


def worker_command(
    level: Isolation,
    *,
    python: str,
    slot: int,
    job_uid_base: int,
    tmp_mb: int,
    host_tmp: str | None = None,
    max_message_bytes: int = 8 << 20,
    as_root: bool = IS_ROOT,
) -> WorkerCommand:
    """The argv that starts one worker under ``level``; ``slot`` picks the job's private uid.

    ``as_root`` says whether the worker will be started by root (the default: whether we are root); a caller that
    starts it under another uid says so.
    """
    job_uid = job_uid_base + slot if as_root else -1
    python = os.path.realpath(python)
    settings: dict[str, object] = {"job_uid": job_uid, "max_message_bytes": max_message_bytes}
    if level is Isolation.BWRAP:
        bwrap = shutil.which("bwrap") or "bwrap"
        if as_root:
            ns = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
            caps = ["--cap-drop", "ALL"] + [a for c in ("SETUID", "SETGID", "KILL") for a in ("--cap-add", f"CAP_{c}")]
        else:
            ns, caps = ["--unshare-all"], []
        prefix = python_prefix(python)
        binds = _system_binds()
        if not prefix.startswith("/usr/"):
            # bubblewrap makes the missing parents of a bind with the host's modes: under /root (0700) the job uid
            # could not reach the standard library, so they are made traversable first
            for parent in reversed(Path(prefix).parents[:-1]):
                binds += ["--perms", "0755", "--dir", str(parent)]
            binds += ["--ro-bind", prefix, prefix]
        argv = [
            bwrap,
            *ns,
            # the worker is the namespace's pid 1: bubblewrap's own init would hold the pool's pipe, and as a normal
            # user a job could open it through /proc/1/fd (the worker itself is non-dumpable)
            "--as-pid-1",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            *binds,
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            # /dev is a tmpfs that a non-root sandbox may write to, with no size cap: only /dev/shm stays writable,
            # capped like /tmp (and emptied after every job, like /tmp)
            "--perms",
            "1777",
            "--size",
            str(tmp_mb << 20),
            "--tmpfs",
            "/dev/shm",
            "--remount-ro",
            "/dev",
            "--perms",
            "1777",
            "--size",
            str(tmp_mb << 20),
            "--tmpfs",
            "/tmp",
            # the sandbox's root is a tmpfs that a non-root sandbox owns: read-only, like everything but the two above
            "--remount-ro",
            "/",
            *caps,
            "--chdir",
            "/tmp",
            "--",
        ]
        settings.update(tmp_dir="/tmp", pid_namespace=True, private_shm=True)
        tmp_dir = "/tmp"
    elif level is Isolation.UNSHARE:
        unshare = shutil.which("unshare") or "unshare"
        user = [] if as_root else ["--map-current-user"]
        argv = [
            unshare,
            *user,
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--net",
            "--ipc",
            "--uts",
            "--",
        ]
        tmp_dir = slot_tmp_dir(host_tmp or tempfile.gettempdir(), slot)
        settings.update(tmp_dir=tmp_dir, pid_namespace=True)
    else:
        argv = []
        tmp_dir = slot_tmp_dir(host_tmp or tempfile.gettempdir(), slot)
        settings.update(tmp_dir=tmp_dir, pid_namespace=False)
    argv += [python, "-I", "-S", "-B", "-c", WORKER_SOURCE, json.dumps(settings)]
    return WorkerCommand(argv=argv, isolation=level, job_uid=job_uid, tmp_dir=tmp_dir)


_probe_cache: dict[str, tuple[Isolation, list[str]]] = {}


def probe_isolation(python: str, *, job_uid_base: int = 61000, tmp_mb: int = 16) -> tuple[Isolation, list[str]]:
    """The strongest level that actually starts here, and why each stronger one did not (cached)."""
    key = os.path.realpath(python)
    if key in _probe_cache:
        return _probe_cache[key]
    reasons: list[str] = []
    host_tmp = tempfile.mkdtemp(prefix="fw-probe-")
    try:
        for level in (Isolation.BWRAP, Isolation.UNSHARE):
            tool = "bwrap" if level is Isolation.BWRAP else "unshare"
            if shutil.which(tool) is None:
                reasons.append(f"{level}: `{tool}` is not installed")
                continue
            cmd = worker_command(
                level, python=python, slot=0, job_uid_base=job_uid_base, tmp_mb=tmp_mb, host_tmp=host_tmp
            )
            try:
                proc = subprocess.run(cmd.argv, input=b"", capture_output=True, timeout=10, env={})
            except (OSError, subprocess.TimeoutExpired) as exc:
                reasons.append(f"{level}: {exc}")
                continue
            if proc.returncode == 0 and b'"ready":true' in proc.stdout:
                _probe_cache[key] = (level, reasons)
                return level, reasons
            err = proc.stderr.decode(errors="replace").strip().splitlines()
            reasons.append(f"{level}: exit {proc.returncode}: {err[-1] if err else 'no output'}")
    finally:
        shutil.rmtree(host_tmp, ignore_errors=True)
    _probe_cache[key] = (Isolation.RLIMITS, reasons)
    return Isolation.RLIMITS, reasons
