"""Run directories: where one run of a topology keeps its logs, NATS data, state and ``run.json``.

Contract: :func:`create_run_dir` makes ``<root>/<name>-<YYYYmmdd-HHMMSS>/`` (suffixed ``-2``, ``-3`` … when
two runs start in the same second) with ``logs/``, ``state/`` and ``nats/``, and points ``<root>/latest`` at
it. ``run.json`` says how to reach the run (``bus_url``, supervisor ``pid``, ``spec_path``, ``started_at``,
the replicas to expect) and, once it ended, ``stopped_at`` and ``exit``. :func:`find_run` resolves what a
user passes to ``flywheel status`` (a run dir, a root holding ``latest``, or nothing → ``./runs``).

Non-goals: no cleanup of old runs, no locking (two supervisors never share a run dir by construction).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

RUN_JSON = "run.json"
LATEST = "latest"


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
    spec: dict[str, Any] | None = None  # the merged spec data (after includes and ${ENV}) this run used
    stopped_at: float | None = None
    exit: str | None = None  # "ok" or the reason the topology stopped

    def to_json(self) -> bytes:
        return orjson.dumps(self.__dict__, option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, data: bytes) -> RunInfo:
        raw: dict[str, Any] = orjson.loads(data)
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
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


def write_run_info(run_dir: Path, info: RunInfo) -> None:
    tmp = run_dir / f".{RUN_JSON}.tmp"
    tmp.write_bytes(info.to_json())
    tmp.replace(run_dir / RUN_JSON)


def read_run_info(run_dir: Path) -> RunInfo:
    return RunInfo.from_json((run_dir / RUN_JSON).read_bytes())


def find_run(where: Path | None = None) -> Path:
    """The run dir meant by ``where``: itself if it has run.json, else its ``latest``; default ``./runs``."""
    place = Path("runs") if where is None else where
    if (place / RUN_JSON).is_file():
        return place
    latest = place / LATEST
    if (latest / RUN_JSON).is_file():
        return latest.resolve()
    if where is None:
        raise RunNotFound(
            "no run found: ./runs/latest does not exist here; pass the run dir "
            "(flywheel status runs/<name>-<time>) or the runs folder (--run-dir DIR)"
        )
    raise RunNotFound(f"no run found at {place}: neither {place / RUN_JSON} nor {latest / RUN_JSON} exists")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
