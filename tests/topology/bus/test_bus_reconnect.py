"""A bus client rides out a nats-server restart: consumers, KV watches and publishes go on, nothing acked is lost.

The server is a real nats-server killed with SIGKILL and restarted on its port with its store (what the runtime's
session does); the clients are ordinary `Bus` connections that were open the whole time.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest

from topology import BusSpec
from topology.bus import Bus, EmbeddedNats

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[EmbeddedNats]:
    async with EmbeddedNats(tmp_path) as running:
        yield running


async def until(predicate: Callable[[], bool], timeout_s: float) -> None:
    with anyio.fail_after(timeout_s):
        for _ in iter(int, 1):  # until the predicate holds (or the deadline)
            if predicate():
                return
            await anyio.sleep(0.02)


async def kill_and_restart(server: EmbeddedNats) -> None:
    assert server.pid is not None
    os.kill(server.pid, signal.SIGKILL)
    await until(lambda: not server.running, 5)
    await server.arestart()


async def test_consumer_goes_on_after_a_restart_without_losing_an_acked_message(server: EmbeddedNats) -> None:
    settings = BusSpec(ack_wait_s=2.0)
    async with await Bus.connect(server.url, topology="t", name="c", settings=settings) as bus:
        await bus.ensure_channel("work")
        got: list[int] = []
        reconnects_before = bus.reconnects.count

        async def consume() -> None:
            async for delivery in bus.consume("work", "g", batch=4):
                got.append(int(delivery.payload["n"]))
                await delivery.ack()

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            for n in range(20):
                await bus.publish("work", "x", {"n": n}, id=f"m{n}")
            await until(lambda: len(set(got)) == 20, 10)
            await kill_and_restart(server)
            for n in range(20, 40):  # waits for the reconnect, then is stored
                await bus.publish("work", "x", {"n": n}, id=f"m{n}")
            # a pull request died with the old server; the consumer must pull again at once, not after it expires
            await until(lambda: len(set(got)) == 40, 4)
            tg.cancel_scope.cancel()
        assert set(got) == set(range(40)) and bus.reconnects.count == reconnects_before + 1


async def test_kv_watch_sees_values_written_after_a_restart_exactly_once(server: EmbeddedNats) -> None:
    async with (
        await Bus.connect(server.url, topology="t", name="watcher") as bus,
        await Bus.connect(server.url, topology="t", name="writer") as writer,
    ):
        await writer.ensure_kv("fw_t_w")
        await writer.kv_put("fw_t_w", "current", b"1")
        seen: list[bytes] = []

        async def watch() -> None:
            async for value in bus.kv_watch("fw_t_w", "current"):
                seen.append(value)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await until(lambda: seen == [b"1"], 5)
            await kill_and_restart(server)
            await until(lambda: bus.reconnects.count > 0 and writer.reconnects.count > 0, 10)
            await writer.kv_put("fw_t_w", "current", b"2")
            await writer.kv_put("fw_t_w", "current", b"3")
            await until(lambda: seen[-1:] == [b"3"], 5)  # re-created its watcher; else it would wait forever
            await anyio.sleep(0.2)
            tg.cancel_scope.cancel()
        assert seen == [b"1", b"2", b"3"] or seen == [b"1", b"3"]  # never a value twice, never the old one again
