"""What every consumer group acknowledged is dropped from a channel's stream once older than the dedupe window, and
nothing else: a real nats-server, real consumer groups, and a real `flywheel up` of the test kinds."""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import pytest

from tests.topology.runtime._helpers import wait_for, write_spec
from tests.topology.runtime.test_durable_run import (
    assert_nothing_acked_lost,
    consumed_since,
    run_json,
    start,
    stop,
    the_run,
)
from topology._graph import ChannelNode
from topology.bus import Bus
from topology.runtime import bus_token, read_run_info
from topology.runtime._trim import AckedTrimmer


def _channel(name: str, consumers: tuple[str, ...], *, external: bool = False) -> ChannelNode:
    return ChannelNode(name, f"fw.x.{name}", durable=True, external=external, producers=(), consumers=consumers)


async def _ack(bus: Bus, channel: str, group: str, count: int) -> None:
    """Ack the first ``count`` messages of ``channel`` as ``group`` (creating the group)."""
    if count == 0:
        await bus.ensure_consumer(channel, group, None)
        return
    seen = 0
    async with bus.consume(channel, group, batch=count) as deliveries:
        async for delivery in deliveries:
            await delivery.ack()
            seen += 1
            if seen == count:
                break


async def _messages(bus: Bus, channel: str) -> tuple[int, int]:
    state = (await bus.nc.jetstream().stream_info(bus.stream(channel))).state
    return int(state.messages), int(state.first_seq)


@pytest.mark.anyio
async def test_only_what_every_group_acked_goes_and_only_after_the_window(bus: Bus) -> None:
    for channel in ("both", "half", "waiting", "outside", "extra"):
        await bus.ensure_channel(channel)
        for i in range(20):
            await bus.publish(channel, "m", {"i": i})
    await _ack(bus, "both", "a", 20)
    await _ack(bus, "both", "b", 20)
    await _ack(bus, "half", "a", 20)
    await _ack(bus, "half", "b", 10)  # b is behind: only its floor goes
    await _ack(bus, "waiting", "a", 20)  # b, an actor of the spec, has no consumer group yet
    await _ack(bus, "outside", "a", 20)  # external: other programs may read it
    await _ack(bus, "extra", "a", 20)
    await _ack(bus, "extra", "review", 5)  # a group no actor of the spec is (a command's): it holds the floor too
    trimmer = AckedTrimmer(
        bus,
        [
            _channel("both", ("a", "b")),
            _channel("half", ("a", "b")),
            _channel("waiting", ("a", "b")),
            _channel("outside", ("a",), external=True),
            _channel("extra", ("a",)),
        ],
        window_s=10.0,
    )
    assert await trimmer.tick(0.0) == {}  # nothing is older than the window yet
    assert await _messages(bus, "both") == (20, 1)
    dropped = await trimmer.tick(10.0)
    assert dropped == {"both": 20, "half": 10, "extra": 5}
    assert await _messages(bus, "half") == (10, 11)
    assert (await _messages(bus, "waiting"))[0] == 20 and (await _messages(bus, "outside"))[0] == 20
    await _ack(bus, "half", "b", 10)  # b catches up: those go a window later, not at once
    assert await trimmer.tick(11.0) == {}
    assert await trimmer.tick(21.5) == {"half": 10}
    assert await _messages(bus, "half") == (0, 21)


@pytest.mark.usefixtures("kinds_env")
@pytest.mark.timeout(150)
def test_a_running_topology_keeps_its_channel_as_small_as_what_is_in_flight_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """A stream kept every message for seven days whether consumed or not: tens of GB a day of an always-on run."""
    spec = write_spec(tmp_path)
    spec.write_text(spec.read_text().replace("bus: {embedded: true}", "bus: {embedded: true, dedupe_window_s: 1}"))
    up: subprocess.Popen[str] = start(spec, "--duration", "60")
    try:
        run_dir = the_run(tmp_path)
        wait_for("traffic", lambda: consumed_since(run_dir, 50))
        token = bus_token(read_run_info(run_dir))

        async def first_seq() -> int:
            async with await Bus.connect(run_json(run_dir)["bus_url"], topology="rt-test", name="t", token=token) as b:
                return (await _messages(b, "ticks"))[1]

        wait_for("the acknowledged ticks dropped", lambda: anyio.run(first_seq) > 20 or None, timeout_s=60)
    finally:
        stop(up)
    assert_nothing_acked_lost(run_dir)
