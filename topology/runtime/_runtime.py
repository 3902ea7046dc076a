"""The Runtime protocol and what the local runtimes share: stop requests, signals, duration, the verdict.

Contract: ``await runtime.run(duration_s=...)`` brings the topology up (in a new run dir, or continuing the run dir
given as ``resume``), keeps its embedded nats-server alive, and keeps it running until a stop is
requested (:meth:`request_stop`, SIGINT/SIGTERM when ``handle_signals``, ``duration_s`` elapsed, every
replica finished by itself, or a replica exhausted its restart budget), drains it and returns a
:class:`RunResult`. A second SIGINT/SIGTERM during the drain skips the rest of the grace period. Between
``started`` being set and ``run`` returning, ``run_dir``, ``bus_url`` and :meth:`statuses` are available.

Crashes are told as they happen: each ``replica crashed`` warning carries the exception line the replica's log
ends with. The verdict is not ``ok`` when a replica exhausted its restart budget, nor when the stop came while a
replica in a crash loop (two crashes or more within the restart policy's ``window_s``) had not been running again
for ``_RECOVERED_S``: a run whose learner crash-looped until ``--duration`` ran out did not run cleanly. A
clean stop names the crashes replicas recovered from, and the embedded nats-server's restarts.

Non-goals: placement across machines here (``topology.runtime._ray.RayRuntime`` implements the same protocol).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import anyio
import structlog

from topology._graph import build_graph
from topology.runtime._actor import ActorState
from topology.runtime._restart import RestartPolicy
from topology.runtime._session import Session
from topology.runtime._status import ReplicaStatus, put_status, read_status
from topology.runtime._trim import AckedTrimmer

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from topology._spec import Spec

_log = structlog.get_logger("flywheel.runtime")
_LOG_TAIL_LINES = 12
_LIFE_BANNER = "--- flywheel: "  # opens each life of a replica in its log
_REASON_CHARS = 160
_REASON_LINES = 3  # a life's reason is among its last lines: a crash's traceback is the last thing it writes
_TRACEBACK = "Traceback (most recent call last):"
# The last line of a Python traceback: ``[package.module.]SomeError[: message]``, maybe behind an exception group's `|`.
_EXCEPTION_LINE = re.compile(r"^[\s|]*(?:[A-Za-z_]\w*\.)*([A-Z]\w*(?::\s.*|(?<=Error)|(?<=Exception)|(?<=Interrupt)))$")
_ALIVE = frozenset({ActorState.RUNNING.value, ActorState.DRAINING.value, ActorState.STOPPING.value})
# A replica in a crash loop (two crashes or more within the restart policy's window) counts as recovered at the stop
# only once a later life has run this long — one that crashes right after it starts is seen "running" for a moment of
# each life, and a stop landing in that moment must not call it recovered. A single crash (a kill, say) is never a
# loop, whatever state the stop finds the replica in.
_RECOVERED_S = 2.0
_STATUS_READ_S = 2.0  # at most this long reading the replicas' states at the stop


def replica_log(run_dir: Path, actor: str, replica: int) -> Path:
    """Where a replica's stdout and stderr go (on the node it runs on)."""
    return run_dir / "logs" / f"{actor}-{replica}.log"


def life_banner(actor: str, replica: int, restarts: int, detail: str = "") -> str:
    """The line written to a replica's log before each of its lives (``crash_reason`` reads back to the last one)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"{_LIFE_BANNER}{actor}[{replica}] start #{restarts + 1} at {stamp}{f' ({detail})' if detail else ''} ---\n"


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def disk_full(path: Path) -> str | None:
    """``the disk holding PATH is full (N KiB free)`` when less than 1 MiB and less than 0.5 % of it is free, else
    None: a replica that crashes then most likely failed to write (its checkpoint, its log), and its log may be cut
    short."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    if usage.free >= min(1 << 20, usage.total // 200):
        return None
    return f"the disk holding {path} is full ({usage.free // 1024} KiB free)"


def crash_reason(path: Path) -> str | None:
    """Why the last life in the log at ``path`` ended, when its last lines say: the exception line of a traceback
    (``StateDictError: no …``, without the exception's module path) or an ``[error]`` line, cut to one short line.
    None when the life ended otherwise (killed, or its last words are older than its end: a traceback logged and
    handled long before is no reason)."""
    lines = log_tail(path, lines=400)
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(_LIFE_BANNER):
            lines = lines[i + 1 :]
            break
    traceback = any(_TRACEBACK in line for line in lines)
    for line in reversed(lines[-_REASON_LINES:]):
        found = _EXCEPTION_LINE.match(line) if traceback else None
        reason = found.group(1).strip() if found is not None else None
        if reason is None and "[error" in line:  # a structured log line: ``12:00:00 [error    ] what happened …``
            reason = line.split("]", 1)[1].strip()
        if reason:
            return reason if len(reason) <= _REASON_CHARS else reason[: _REASON_CHARS - 1] + "…"
    return None


@dataclass
class _Crashes:
    """One replica's crashes in this run: how many, the last one's description, and the life it ended."""

    count: int
    last: str
    restarts: int


@dataclass(frozen=True)
class RunResult:
    """How a run ended: ``ok`` unless a replica exhausted its restarts or was still crashing when the run was
    stopped (then ``message`` says which, and why)."""

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
        self._crashes: dict[tuple[str, int], _Crashes] = {}
        self._still_crashing: list[tuple[str, int]] = []  # in a crash loop, and not running again when the stop came
        self._killed: tuple[list[str], str] | None = None  # replicas killed at the stop, without a drain, and why

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
        tg.start_soon(self.trim_acked, session)
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
        signalled = bool(how) and str(how).startswith("killed by")  # its log cannot say why
        reason = crash_reason(log) if log is not None and not signalled else None
        if how and reason and reason in how:  # a Ray actor's error came with its status record already
            reason = None
        full = disk_full(session.run_dir)
        if full is not None:
            reason = f"{reason}; {full}" if reason else full
        described = f"{how}: {reason}" if how and reason else (how or reason)
        crashes = self._crashes.setdefault(key, _Crashes(count=0, last="", restarts=0))
        crashes.count, crashes.last, crashes.restarts = crashes.count + 1, described or "no reason given", restarts
        delay = self.policy.on_crash(key)
        state = ActorState.FAILED if delay is None else ActorState.RESTARTING
        await self.put_status(session, key, state, pid, restarts + (delay is not None), started_at, described)
        if delay is None:
            message = (
                f"actor '{actor}' replica {replica} crashed {self.policy.max_restarts + 1} times within "
                f"{self.policy.window_s:g}s (last: {how}{'; ' + full if full else ''}); stopping the topology."
            )
            if log is not None:
                tail = "\n".join(f"  | {line}" for line in log_tail(log))
                message += f"\nLast lines of {log}:\n{tail}"
            self.fail(message)
            return False
        why = {"error": reason} if reason else {}
        _log.warning("replica crashed", actor=actor, replica=replica, how=how, **why, restart_in_s=round(delay, 2))
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

    async def trim_acked(self, session: Session) -> None:
        """Drop what every consumer group of a channel acknowledged (``_trim``), unless ``bus.retention.trim_acked``
        is off: an always-on run's channels stay as large as what is in flight, not a week of traffic."""
        spec = session.spec
        if not spec.bus.retention.trim_acked:
            return
        trimmer = AckedTrimmer(session.bus, build_graph(spec).channels, window_s=spec.bus.dedupe_window_s)
        while True:
            await anyio.sleep(trimmer.every_s)
            try:
                dropped = await trimmer.tick(time.monotonic())
            except Exception as exc:  # the bus is away (a restart): look again next time
                _log.debug("bus.trim_skipped", error=f"{type(exc).__name__}: {exc}")
                continue
            if dropped:
                _log.debug("bus.trimmed", dropped=dropped)

    async def stop_after(self, duration_s: float) -> None:
        await anyio.sleep(duration_s)
        self.request_stop(f"--duration {duration_s:g}s elapsed")

    async def wait_stop(self) -> None:
        """Wait for the stop; then note which replicas in a crash loop were not running again (before they are
        stopped)."""
        await self._stop.wait()
        if not self._crashes or self._failure is not None:
            return
        looping = {
            key: c
            for key, c in self._crashes.items()
            if key not in self._finished and self.policy.crashes_in_window(key) >= 2
        }
        if not looping:
            return
        records: dict[tuple[str, int], ReplicaStatus] = {}
        with anyio.move_on_after(_STATUS_READ_S):  # the bus may be away (a restart): the stop must not wait on it
            try:
                records = {(r.actor, r.replica): r for r in await self.statuses()}
            except Exception:  # no evidence either way: no replica is called crash-looping
                return
        if not records:
            return
        now = time.time()
        for key, crashes in looping.items():
            record = records.get(key)
            recovered = (
                record is not None
                and record.state in _ALIVE
                and record.restarts > crashes.restarts
                and now - record.started_at >= _RECOVERED_S
            )
            if not recovered:
                self._still_crashing.append(key)

    def killed_at_stop(self, replicas: list[str], **log: Any) -> None:
        """Replicas the stop is about to kill without their drain (the drain timeout ran out, or a second signal):
        logged (with ``log``'s fields), and the final message names them instead of calling the stop clean."""
        why = "second signal" if self._hurry.is_set() else f"no drain within {self.drain_timeout_s:g}s"
        _log.warning("killing replicas", replicas=replicas, why=why, **log)
        self._killed = (replicas, why)

    def _crash_summary(self, keys: list[tuple[str, int]]) -> str:
        parts = []
        for actor, replica in keys:
            crashes = self._crashes[(actor, replica)]
            times = "once" if crashes.count == 1 else f"{crashes.count} times"
            parts.append(f"{actor}[{replica}] crashed {times} (last: {crashes.last})")
        return "; ".join(parts)

    def _recoveries(self, bus_deaths: list[str]) -> tuple[list[str], list[str]]:
        """What a clean stop recovered from: ``(["2 replica crashes", "1 nats-server restart"], [their details])``."""
        survived, summaries = [], []
        if self._crashes:
            count = sum(c.count for c in self._crashes.values())
            survived.append(f"{count} replica crash{'es' if count != 1 else ''}")
            summaries.append(self._crash_summary(sorted(self._crashes)))
        if bus_deaths:
            count = len(bus_deaths)
            survived.append(f"{count} nats-server restart{'s' if count != 1 else ''}")
            times = "once" if count == 1 else f"{count} times"
            summaries.append(f"nats-server died {times} (last: {bus_deaths[-1]})")
        return survived, summaries

    def result(self, session: Session) -> RunResult:
        """The verdict: failed when a replica exhausted its restarts or was still crashing at the stop; a clean
        stop names the crashes its replicas recovered from."""
        if self._failure is None and self._still_crashing:
            logs = session.run_dir / "logs"
            self._failure = (
                f"stopped ({self._stop_reason}) with replicas that were crashing, not running: "
                f"{self._crash_summary(self._still_crashing)}. Their logs: {logs}/"
            )
        ok = self._failure is None
        stopped = f"stopped cleanly ({self._stop_reason})"
        if self._killed is not None:
            replicas, why = self._killed
            stopped = f"stopped ({self._stop_reason}); killed without a drain ({why}): {', '.join(replicas)}"
        if self._failure is not None:
            message = self._failure
        elif self._crashes or session.bus_deaths:
            joint = "; " if self._killed is not None else " "
            survived, summaries = self._recoveries(session.bus_deaths)
            message = f"{stopped}{joint}after {' and '.join(survived)}, all recovered: {'; '.join(summaries)}"
        else:
            message = stopped
        session.info.exit = "ok" if ok else message.splitlines()[0]
        return RunResult(ok=ok, message=message, run_dir=session.run_dir)

    def drain_deadline(self) -> float:
        return time.monotonic() + self.drain_timeout_s
