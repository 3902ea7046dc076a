"""AckTracker: pipelined publishes settled per batch — stored, duplicates counted, errors and silence raised."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from topology.bus import Bus
from topology.bus._acks import AckTracker, PublishError

pytestmark = pytest.mark.anyio


async def test_a_batch_returns_once_every_message_is_stored(bus: Bus) -> None:
    await bus.ensure_channel("acks")
    tracker = AckTracker(bus.nc)
    subject = bus.subject("acks")
    with anyio.fail_after(10):
        duplicates = await tracker.publish(
            [(subject, b"{}", {"Nats-Msg-Id": f"m{i}"}) for i in range(300)], timeout_s=5
        )
    info = await bus.nc.jetstream().stream_info(bus.stream("acks"))
    assert duplicates == 0
    assert info.state.messages == 300


async def test_duplicates_inside_the_dedupe_window_are_counted_not_stored(bus: Bus) -> None:
    await bus.ensure_channel("dups")
    tracker = AckTracker(bus.nc)
    subject = bus.subject("dups")
    batch = [(subject, b"{}", {"Nats-Msg-Id": name}) for name in ("a", "b", "a", "c", "b")]
    with anyio.fail_after(10):
        assert await tracker.publish(batch, timeout_s=5) == 2
    info = await bus.nc.jetstream().stream_info(bus.stream("dups"))
    assert info.state.messages == 3


async def test_a_subject_no_stream_stores_raises_publish_error(bus: Bus) -> None:
    tracker = AckTracker(bus.nc)
    with anyio.fail_after(10), pytest.raises(PublishError, match="no stream"):
        await tracker.publish([("nobody.stores.this", b"{}", {"Nats-Msg-Id": "x"})], timeout_s=5)


async def test_a_refused_message_fails_its_batch_with_the_servers_reason(bus: Bus) -> None:
    await bus.ensure_channel("guarded")
    tracker = AckTracker(bus.nc)
    subject = bus.subject("guarded")
    wrong = {"Nats-Msg-Id": "y", "Nats-Expected-Stream": "NOT_THIS_ONE"}
    with anyio.fail_after(10), pytest.raises(PublishError, match="err_code"):
        await tracker.publish([(subject, b"{}", {"Nats-Msg-Id": "ok"}), (subject, b"{}", wrong)], timeout_s=5)


async def test_missing_answers_time_out_and_leave_nothing_waiting(bus: Bus) -> None:
    tracker = AckTracker(bus.nc)
    # a core subscriber that never answers stands in for a stream that never acknowledges
    silent = await bus.nc.subscribe("silent.subject")
    with anyio.fail_after(10), pytest.raises(asyncio.TimeoutError):
        await tracker.publish([("silent.subject", b"{}", {"Nats-Msg-Id": "z"})], timeout_s=0.3)
    assert not tracker._waiting
    await silent.unsubscribe()
