"""Heartbeats: each replica's state and counters in a JetStream KV bucket, and reading them back.

Contract: every ``runtime.heartbeat_s`` a replica puts ``{state, pid, restarts, started_at, ts, counters, …}``
(orjson) under key ``<actor>.<replica>`` of bucket ``fw_<topology>_status`` — sooner when the actor asks with
``ActorContext.report_soon()`` (for counters other actors steer by, such as the learner's buffered groups that a
source's ``max_in_flight`` reads), but never more often than every :data:`MIN_BEAT_S`; the supervisor writes the same
record with state ``restarting`` / ``failed`` while a replica is down. ``flywheel status`` reads the bucket;
a record older than :data:`STALE_AFTER_BEATS` heartbeats is *stale* (its writer is gone or wedged).

Non-goals: no history (the bucket keeps the latest record per key), no clock-skew correction between hosts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import orjson
import structlog

from topology._names import bucket_name

if TYPE_CHECKING:
    from topology.bus import Bus

STALE_AFTER_BEATS = 3.0
MIN_BEAT_S = 0.05  # report_soon() puts at most this often (a put is one KV round trip)

_log = structlog.get_logger("flywheel.runtime")


def status_bucket(topology: str) -> str:
    """KV bucket holding the topology's heartbeats (KV names allow ``[A-Za-z0-9_-]``)."""
    return bucket_name(topology, "status")


def status_key(actor: str, replica: int) -> str:
    return f"{actor}.{replica}"


@dataclass(frozen=True)
class ReplicaStatus:
    """One replica's latest heartbeat."""

    actor: str
    replica: int
    kind: str
    state: str
    pid: int
    restarts: int
    started_at: float
    ts: float
    counters: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> ReplicaStatus:
        raw = orjson.loads(data)
        return cls(
            actor=str(raw["actor"]),
            replica=int(raw["replica"]),
            kind=str(raw.get("kind", "")),
            state=str(raw["state"]),
            pid=int(raw.get("pid", 0)),
            restarts=int(raw.get("restarts", 0)),
            started_at=float(raw.get("started_at", 0.0)),
            ts=float(raw["ts"]),
            counters=dict(raw.get("counters") or {}),
            error=raw.get("error"),
        )

    def age_s(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.ts)

    def is_stale(self, heartbeat_s: float, now: float | None = None) -> bool:
        if self.state in ("stopped", "failed"):
            return False  # final records are not expected to be refreshed
        return self.age_s(now) > STALE_AFTER_BEATS * heartbeat_s


async def put_status(bus: Bus, topology: str, status: ReplicaStatus) -> None:
    await bus.kv_put(status_bucket(topology), status_key(status.actor, status.replica), status.encode())


class BeatRequests:
    """Requests for an early heartbeat: :meth:`request` from the replica's event loop, the loop :meth:`wait` s."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def request(self) -> None:
        self._event.set()

    async def wait(self, timeout_s: float) -> None:
        """Until a request comes in or ``timeout_s`` has passed; requests made before the call count."""
        with anyio.move_on_after(timeout_s):
            await self._event.wait()
        if self._event.is_set():
            self._event = anyio.Event()


async def heartbeat_loop(
    bus: Bus,
    topology: str,
    current: Callable[[], ReplicaStatus],
    interval_s: float,
    requests: BeatRequests | None = None,
) -> None:
    """Put ``current()`` every ``interval_s`` — or after an early ``requests`` one, at least :data:`MIN_BEAT_S`
    after the last put — until cancelled. A bus hiccup is logged, never fatal."""
    while True:
        try:
            await put_status(bus, topology, current())
        except Exception as exc:  # the actor must outlive a slow or restarting bus
            _log.warning("heartbeat failed", error=f"{type(exc).__name__}: {exc}")
        if requests is None:
            await anyio.sleep(interval_s)
        else:
            floor = min(MIN_BEAT_S, interval_s)
            await anyio.sleep(floor)
            await requests.wait(interval_s - floor)


async def read_status(
    bus: Bus, topology: str, replicas: Iterable[tuple[str, int]], *, since: float | None = None
) -> list[ReplicaStatus]:
    """Latest records of the given ``(actor, replica)`` pairs; replicas that never reported are left out, and so
    are records last written before ``since`` (a resumed run's start: the bus store keeps what the killed life's
    replicas last said, "running" at the step they reached, until the new replicas report)."""
    found: list[ReplicaStatus] = []
    bucket = status_bucket(topology)
    for actor, replica in replicas:
        data = await bus.kv_get(bucket, status_key(actor, replica))
        if data is not None:
            record = ReplicaStatus.decode(data)
            if since is None or record.ts >= since:
                found.append(record)
    return found


@dataclass(frozen=True)
class RunStatus:
    """What ``flywheel status`` shows: the run, whether it is live, and each replica's latest record."""

    run_dir: str
    topology: str
    bus_url: str
    live: bool
    reason: str  # why it is not live, or ""
    heartbeat_s: float
    replicas: list[ReplicaStatus]
    expected: list[tuple[str, int]]  # every (actor, replica) of the spec, reported or not
    bus_unreachable: bool = False  # the supervisor runs, but the bus did not answer: a live run that cannot be read

    def missing(self) -> list[tuple[str, int]]:
        seen = {(r.actor, r.replica) for r in self.replicas}
        return [key for key in self.expected if key not in seen]


async def read_run_status(run_dir: Path, *, timeout_s: float = 5.0) -> RunStatus:
    """Read ``run_dir/run.json``, connect to its bus and fetch every replica's latest heartbeat."""
    from topology.runtime._rundir import read_run_info, supervisor_alive
    from topology.runtime._session import connect_run

    info = read_run_info(run_dir)

    def result(live: bool, reason: str, records: list[ReplicaStatus], *, unreachable: bool = False) -> RunStatus:
        return RunStatus(
            run_dir=str(run_dir),
            topology=info.topology,
            bus_url=info.bus_url,
            live=live,
            reason=reason,
            heartbeat_s=info.heartbeat_s,
            replicas=records,
            expected=info.replica_keys(),
            bus_unreachable=unreachable,
        )

    if info.stopped_at is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.stopped_at))
        return result(False, f"the run stopped at {when} ({info.exit})", [])
    if not supervisor_alive(run_dir, info.pid):
        reason = (
            f"its supervisor (pid {info.pid}) is gone without recording a stop (killed?); "
            f"continue it with: flywheel up --resume {run_dir}"
        )
        return result(False, reason, [])
    try:
        with anyio.fail_after(timeout_s):
            bus = await connect_run(run_dir, name="flywheel-status", info=info)
            try:
                records = await read_status(bus, info.topology, info.replica_keys(), since=info.started_at)
            finally:
                await bus.close()
    except Exception as exc:  # the supervisor is alive (checked above): the run goes on, its bus does not answer
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        reason = (
            f"its supervisor (pid {info.pid}) is running, but its bus at {info.bus_url} did not answer within "
            f"{timeout_s:g} s ({error}): the nats-server may be stopped, overloaded or restarting; try again"
        )
        return result(False, reason, [], unreachable=True)
    return result(True, "", records)
