"""Early heartbeats: a replica's ``report_soon()`` puts its status now, not at the next ``heartbeat_s``."""

from __future__ import annotations

import time

import anyio
import pytest

from topology.bus import Bus
from topology.runtime._status import MIN_BEAT_S, BeatRequests, ReplicaStatus, heartbeat_loop, put_status, read_status

pytestmark = pytest.mark.anyio


def _status(counter: list[int]) -> ReplicaStatus:
    counter[0] += 1
    return ReplicaStatus(
        actor="learner",
        replica=0,
        kind="learner",
        state="running",
        pid=1,
        restarts=0,
        started_at=0.0,
        ts=time.time(),
        counters={"buffered_groups": counter[0]},
    )


async def _wait_puts(puts: list[int], n: int) -> None:
    for _ in range(500):  # 5 s, far less than the 30 s heartbeat
        if puts[0] >= n:
            return
        await anyio.sleep(0.01)
    raise AssertionError(f"{puts[0]} puts after 5 s, expected {n}")


async def _latest(bus: Bus) -> int:
    (record,) = await read_status(bus, bus.topology, [("learner", 0)])
    return int(record.counters["buffered_groups"])


async def test_requested_beats_come_at_once_and_no_faster_than_the_floor(bus: Bus) -> None:
    puts = [0]
    requests = BeatRequests()
    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat_loop, bus, bus.topology, lambda: _status(puts), 30.0, requests)
        await _wait_puts(puts, 1)
        await anyio.sleep(0.2)
        assert puts[0] == 1  # a 30 s heartbeat: nothing more on its own
        requests.request()
        await _wait_puts(puts, 2)  # well before the 30 s beat
        await anyio.sleep(0.05)
        assert await _latest(bus) == 2  # the early record is the one readers see
        started = time.monotonic()
        for _ in range(50):  # a burst of requests: puts at most every MIN_BEAT_S
            requests.request()
            await anyio.sleep(0.004)
        await _wait_puts(puts, 3)  # at least one came of it (however loaded the machine)
        elapsed = time.monotonic() - started
        assert puts[0] <= 2 + elapsed / MIN_BEAT_S + 1
        tg.cancel_scope.cancel()


async def test_a_record_from_before_a_resumed_runs_start_is_not_reported(bus: Bus) -> None:
    """After a resume the bus store still holds what the killed life's replicas last said ("running", their
    counters); until the new replica reports, status readers must not take that for the new life."""
    await put_status(bus, bus.topology, _status([0]))
    resumed_at = time.time()
    assert await read_status(bus, bus.topology, [("learner", 0)]) != []  # without a start: every record
    assert await read_status(bus, bus.topology, [("learner", 0)], since=resumed_at) == []
    await put_status(bus, bus.topology, _status([1]))
    (record,) = await read_status(bus, bus.topology, [("learner", 0)], since=resumed_at)
    assert record.counters["buffered_groups"] == 2
