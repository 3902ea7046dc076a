"""The Runtime protocol and what the local runtimes share: stop requests, signals, duration, the verdict.

Contract: ``await runtime.run(duration_s=...)`` brings the topology up (in a new run dir, or continuing the run dir
given as ``resume``), keeps its embedded nats-server alive, and keeps it running until a stop is
requested (:meth:`request_stop`, SIGINT/SIGTERM when ``handle_signals``, ``duration_s`` elapsed, every
replica finished by itself, or a replica exhausted its restart budget), drains it and returns a
:class:`RunResult`. A second SIGINT/SIGTERM during the drain skips the rest of the grace period. Between
``started`` being set and ``run`` returning, ``run_dir``, ``bus_url`` and :meth:`statuses` are available.

Non-goals: placement across machines here (``topology.runtime._ray.RayRuntime`` implements the same protocol).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict

import anyio
import structlog

from topology.runtime._actor import ActorState
from topology.runtime._restart import RestartPolicy
from topology.runtime._session import Session
from topology.runtime._status import ReplicaStatus, put_status, read_status

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from topology._spec import Spec

_log = structlog.get_logger("flywheel.runtime")
_LOG_TAIL_LINES = 12


def replica_log(run_dir: Path, actor: str, replica: int) -> Path:
    """Where a replica's stdout and stderr go (on the node it runs on)."""
    return run_dir / "logs" / f"{actor}-{replica}.log"


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


@dataclass(frozen=True)
class RunResult:
    """How a run ended: ``ok`` unless a replica exhausted its restarts (then ``message`` says which)."""

    ok: bool
    message: str
    run_dir: Path

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


class Runtime(Protocol):
    """What ``flywheel up`` and a test drive, whichever runtime runs the topology; see the module docstring."""

    started: anyio.Event

    @property
    def run_dir(self) -> Path | None: ...

    @property
    def bus_url(self) -> str | None: ...

    async def run(self, *, duration_s: float | None = None) -> RunResult: ...

    def request_stop(self, reason: str) -> None: ...

    async def statuses(self) -> list[ReplicaStatus]: ...


class RuntimeOptions(TypedDict, total=False):
    """The keyword arguments every runtime takes (their defaults are :class:`RuntimeBase`'s)."""

    run_root: Path | None
    drain_timeout_s: float
    handle_signals: bool
    resume: Path | None


class RuntimeBase:
    """What the runtimes share: stop bookkeeping, the watchers beside the replicas, crash accounting."""

    def __init__(
        self,
        spec: Spec,
        *,
        run_root: Path | None = None,
        drain_timeout_s: float = 10.0,
        handle_signals: bool = True,
        resume: Path | None = None,
    ) -> None:
        self.spec = spec
        self.run_root = run_root
        self.resume = resume  # an existing run dir to continue instead of a new one
        self.drain_timeout_s = drain_timeout_s
        self.handle_signals = handle_signals
        self.started = anyio.Event()
        self.policy = RestartPolicy.from_spec(spec.runtime.restart)
        self.session: Session | None = None
        self._stop = anyio.Event()
        self._stop_reason = ""
        self._failure: str | None = None
        self._hurry = anyio.Event()  # set by a second signal: skip the rest of the drain grace period
        self._finished: set[tuple[str, int]] = set()

    @property
    def run_dir(self) -> Path | None:
        return self.session.run_dir if self.session else None

    @property
    def bus_url(self) -> str | None:
        return self.session.bus_url if self.session else None

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def replica_keys(self) -> list[tuple[str, int]]:
        return [(name, i) for name, actor in self.spec.actors.items() for i in range(actor.replicas)]

    def request_stop(self, reason: str) -> None:
        if not self._stop.is_set():
            self._stop_reason = reason
            _log.info("stopping topology", topology=self.spec.name, reason=reason)
            self._stop.set()

    def fail(self, message: str) -> None:
        """Stop the whole topology because of ``message`` (the first failure wins)."""
        if self._failure is None:
            self._failure = message
        self.request_stop("failure")

    def replica_finished(self, key: tuple[str, int]) -> None:
        """A replica ended cleanly on its own (not asked to); when all did, the run is over."""
        self._finished.add(key)
        if len(self._finished) == len(self.replica_keys()):
            self.request_stop("every actor finished")

    async def statuses(self) -> list[ReplicaStatus]:
        if self.session is None:
            return []
        return await read_status(
            self.session.bus, self.spec.name, self.replica_keys(), since=self.session.info.started_at
        )

    async def watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if self._stop.is_set():
                    _log.warning("second signal: not waiting for the drain", signal=name)
                    self._hurry.set()
                else:
                    self.request_stop(f"{name} received")

    def start_watchers(self, tg: TaskGroup, session: Session, duration_s: float | None) -> None:
        """Start what runs beside the replicas: the bus's supervision, the signal handler, the duration timer."""
        tg.start_soon(self.keep_bus_up, session)
        if self.handle_signals:
            tg.start_soon(self.watch_signals)
        if duration_s is not None:
            tg.start_soon(self.stop_after, duration_s)

    async def after_crash(
        self,
        session: Session,
        key: tuple[str, int],
        *,
        pid: int,
        restarts: int,
        started_at: float,
        how: str | None,
        log: Path | None,
    ) -> bool:
        """Count a crash against the restart policy, record it, and wait the backoff: True to restart the replica.

        False when the replica crashed too often: the topology is failed with a message quoting ``log``'s last
        lines (when the replica has a log of its own).
        """
        actor, replica = key
        delay = self.policy.on_crash(key)
        state = ActorState.FAILED if delay is None else ActorState.RESTARTING
        await self.put_status(session, key, state, pid, restarts + (delay is not None), started_at, how)
        if delay is None:
            message = (
                f"actor '{actor}' replica {replica} crashed {self.policy.max_restarts + 1} times within "
                f"{self.policy.window_s:g}s (last: {how}); stopping the topology."
            )
            if log is not None:
                tail = "\n".join(f"  | {line}" for line in log_tail(log))
                message += f"\nLast lines of {log}:\n{tail}"
            self.fail(message)
            return False
        _log.warning("replica crashed", actor=actor, replica=replica, how=how, restart_in_s=round(delay, 2))
        await anyio.sleep(delay)
        return True

    async def put_status(
        self,
        session: Session,
        key: tuple[str, int],
        state: ActorState,
        pid: int,
        restarts: int,
        started_at: float,
        error: str | None,
    ) -> None:
        """Record a replica's state on its behalf (it is not running to beat); a bus that is away is only logged."""
        actor, replica = key
        record = ReplicaStatus(
            actor=actor,
            replica=replica,
            kind=self.spec.actors[actor].kind,
            state=state.value,
            pid=pid,
            restarts=restarts,
            started_at=started_at,
            ts=time.time(),
            error=error,
        )
        try:
            await put_status(session.bus, self.spec.name, record)
        except Exception as exc:
            _log.warning("could not record replica status", error=f"{type(exc).__name__}: {exc}")

    async def keep_bus_up(self, session: Session) -> None:
        """Supervise the embedded nats-server (:meth:`Session.keep_bus_up`) with this runtime's restart policy."""
        await session.keep_bus_up(self.policy, self.fail)

    async def stop_after(self, duration_s: float) -> None:
        await anyio.sleep(duration_s)
        self.request_stop(f"--duration {duration_s:g}s elapsed")

    async def wait_stop(self) -> None:
        await self._stop.wait()

    def result(self, session: Session) -> RunResult:
        ok = self._failure is None
        message = self._failure if self._failure is not None else f"stopped cleanly ({self._stop_reason})"
        session.info.exit = "ok" if ok else message.splitlines()[0]
        return RunResult(ok=ok, message=message, run_dir=session.run_dir)

    def drain_deadline(self) -> float:
        return time.monotonic() + self.drain_timeout_s
