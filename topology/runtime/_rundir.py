"""Run directories: where one run of a topology keeps its logs, NATS data, state and ``run.json``.

Contract: :func:`create_run_dir` makes ``<root>/<name>-<YYYYmmdd-HHMMSS>/`` (suffixed ``-2``, ``-3`` … when
two runs start in the same second) with ``logs/``, ``state/`` and ``nats/``, and points ``<root>/latest`` at
it; :func:`resume_run_dir` takes an existing one back (``flywheel up --resume``) and points ``latest`` at it.
``run.json`` says how to reach the run (``bus_url``, supervisor ``pid``, ``spec_path``, ``started_at``,
the replicas to expect, where the bus credential is) and, once it ended, ``stopped_at`` and ``exit``; a resumed
run keeps ``first_started_at`` and counts ``resumes``; ``spec`` and ``records`` are what the run last started with
(what a resume compares with). :func:`find_run` resolves what a user passes to
``flywheel status`` or ``--resume`` (a run dir, a root holding ``latest``, or nothing → ``./runs``).

One supervisor per run dir: :func:`lock_run_dir` takes an exclusive ``flock`` on ``<run_dir>/.lock`` for as long
as the supervisor lives (the kernel drops it when the process dies, SIGKILL included), so a second ``up
--resume`` of a live run is refused instead of sharing its store; :func:`supervisor_alive` is how every command
tells a live run (a pid in run.json may belong to another process after a ``kill -9`` or a reboot).

The embedded bus's token lives in ``<run_dir>/nats/token``, mode 0600 (this user only); :func:`bus_token` reads
it (or the external bus's ``token_env``) for a client that connects from outside the run.

Non-goals: no cleanup of old runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import time
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

import orjson

RUN_JSON = "run.json"
LATEST = "latest"
LOCK = ".lock"
TOKEN_FILE = "nats/token"  # relative to the run dir


class RunNotFound(Exception):
    """No run directory where the user pointed; the message says where we looked."""


@dataclass
class RunInfo:
    topology: str
    bus_url: str
    pid: int
    spec_path: str
    started_at: float
    heartbeat_s: float
    replicas: dict[str, int] = field(default_factory=dict)  # actor name -> replica count
    kinds: dict[str, str] = field(default_factory=dict)  # actor name -> kind
    single_process: bool = False
    nats_pid: int | None = None  # the embedded nats-server, if any
    creds_file: str | None = None  # how to authenticate to the bus (a path / an env var name, never a secret)
    token_env: str | None = None
    token_file: str | None = None  # the embedded bus's token (a 0600 file in the run dir)
    bus_restarts: int = 0  # how often the supervisor brought a dead embedded nats-server back
    first_started_at: float | None = None  # when the run first started (started_at: this incarnation)
    resumes: int = 0  # how often `flywheel up --resume` continued this run
    spec: dict[str, Any] | None = None  # the merged spec data (after includes and ${ENV}) this run used
    # what the spec's sections wrote down of it at this start (a model dir's config hash …); None: written before
    # runs kept them
    records: dict[str, Any] | None = None
    stopped_at: float | None = None
    exit: str | None = None  # "ok" or the reason the topology stopped

    def to_json(self) -> bytes:
        return orjson.dumps(self.__dict__, option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, data: bytes) -> RunInfo:
        raw = orjson.loads(data)
        if not isinstance(raw, dict):
            raise TypeError(f"expected a JSON object, got a {type(raw).__name__}")
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        required = [
            n for n, f in cls.__dataclass_fields__.items() if f.default is MISSING and f.default_factory is MISSING
        ]
        missing = [n for n in required if n not in known]
        if missing:
            raise TypeError(f"it lacks {', '.join(missing)}")
        return cls(**known)

    def replica_keys(self) -> list[tuple[str, int]]:
        return [(actor, i) for actor, n in self.replicas.items() for i in range(n)]


def create_run_dir(root: Path, name: str, *, now: float | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    base = f"{name}-{stamp}"
    candidate, n = root / base, 1
    while True:
        try:
            candidate.mkdir()
            break
        except FileExistsError:
            n += 1
            candidate = root / f"{base}-{n}"
    for sub in ("logs", "state", "nats"):
        (candidate / sub).mkdir()
    _point_latest(root, candidate.name)
    return candidate


def _point_latest(root: Path, target: str) -> None:
    link = root / LATEST
    tmp = root / f".{LATEST}.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target)  # relative, so the runs folder can be moved whole
    tmp.replace(link)  # atomic swap: a concurrent `flywheel status` never sees no link


def resume_run_dir(run_dir: Path) -> Path:
    """An existing run dir to continue (absolute). ``RunNotFound`` when it has no ``run.json``."""
    run_dir = run_dir.resolve()
    if not (run_dir / RUN_JSON).is_file():
        raise RunNotFound(f"cannot resume {run_dir}: it has no {RUN_JSON} (not a run directory)")
    for sub in ("logs", "state", "nats"):
        (run_dir / sub).mkdir(exist_ok=True)
    return run_dir


def point_latest(run_dir: Path) -> None:
    """Point ``latest`` beside ``run_dir`` at it (a resumed run is the latest one again)."""
    _point_latest(run_dir.parent, run_dir.name)


class RunLocked(Exception):
    """Another live supervisor holds the run dir (so it cannot be resumed or shared)."""


def lock_run_dir(run_dir: Path) -> int:
    """Take the run dir's lock for this process (see the module docstring); returns the descriptor to keep open.
    ``RunLocked`` when another supervisor holds it."""
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunLocked(f"the run at {run_dir} is live (another `flywheel up` holds {run_dir / LOCK})") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def run_token(run_dir: Path) -> str:
    """The run's embedded-bus token: the one in ``<run_dir>/nats/token``, or a new random one written there 0600."""
    path = run_dir / TOKEN_FILE
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if token:
        os.chmod(path, 0o600)
        return token
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def bus_token(info: RunInfo) -> str | None:
    """The token a client outside the run presents to its bus: the embedded bus's token file, else the external
    bus's ``token_env`` from this process's environment; None when the bus takes none."""
    if info.token_file:
        try:
            return Path(info.token_file).read_text().strip() or None
        except OSError:
            return None
    if info.token_env:
        return os.environ.get(info.token_env) or None
    return None


def write_run_info(run_dir: Path, info: RunInfo) -> None:
    """Write ``run.json`` atomically; after a failed write (a full disk) the previous one stays, no temporary left."""
    tmp = run_dir / f".{RUN_JSON}.tmp"
    try:
        tmp.write_bytes(info.to_json())
        tmp.replace(run_dir / RUN_JSON)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def read_run_info(run_dir: Path) -> RunInfo:
    """The ``run.json`` of ``run_dir`` (``FileNotFoundError`` when it has none; :class:`RunNotFound` naming the file
    when it is not a flywheel run.json: not JSON, not an object, or without the fields every run writes)."""
    path = run_dir / RUN_JSON
    data = path.read_bytes()
    try:
        return RunInfo.from_json(data)
    except orjson.JSONDecodeError as exc:
        raise RunNotFound(f"{path} is not a flywheel run.json: not JSON ({exc})") from None
    except TypeError as exc:  # not an object, or fields missing
        raise RunNotFound(f"{path} is not a flywheel run.json: {exc}") from None


def find_run(where: Path | None = None, example: str = "flywheel status /srv/runs") -> Path:
    """The run dir meant by ``where``: itself if it has run.json, else its ``latest``; default ``./runs``.
    ``example``: the calling command with a runs folder where its RUN_DIR goes, for the error when none is found."""
    place = Path("runs") if where is None else where
    if (place / RUN_JSON).is_file():
        return place
    latest = place / LATEST
    if (latest / RUN_JSON).is_file():
        return latest.resolve()
    if where is None:
        raise RunNotFound(
            "no run found: ./runs/latest does not exist here; name the run dir (runs/<name>-<time>) or the runs "
            f"folder that holds it, e.g. {example}"
        )
    raise RunNotFound(f"no run found at {place}: neither {place / RUN_JSON} nor {latest / RUN_JSON} exists")


def supervisor_alive(run_dir: Path, pid: int) -> bool:
    """Whether the run in ``run_dir`` has a live supervisor: a non-blocking try at the run dir's lock, which its
    supervisor holds for as long as it lives. The supervisor's ``pid`` in run.json alone does not say it — after a
    ``kill -9`` or a reboot another process may have that pid — and is asked only where the lock cannot be opened
    (another user's run)."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except PermissionError:
        return pid_alive(pid)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: two readers asking at once do not see each other
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock this try took
    return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
