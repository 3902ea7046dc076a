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


async def stop_answering(server: EmbeddedNats) -> None:
    """SIGSTOP the server and wait until every one of its threads has stopped: kill() only queues the signal, and
    until a thread of the server takes it the others go on serving (on a busy machine for milliseconds)."""
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    tasks = Path(f"/proc/{server.pid}/task")

    def stopped() -> bool:
        states = []
        for task in tasks.iterdir():
            try:
                states.append((task / "stat").read_text().rpartition(")")[2].split()[0])
            except OSError:  # the thread ended meanwhile
                continue
        return bool(states) and all(state in ("T", "t") for state in states)

    await until(stopped, 5)


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


async def test_a_publish_whose_ack_died_with_the_server_is_sent_again_and_stored_once(server: EmbeddedNats) -> None:
    """The server stops answering (SIGSTOP) with a publish on the wire, then dies and comes back on its port: the
    ack that publish waited for died with the old server. It is sent again once the connection is back (the same
    id: stored once), instead of waiting out its timeout and failing (an actor then crashed and was restarted)."""
    async with await Bus.connect(server.url, topology="t", name="p") as bus:
        await bus.ensure_channel("work")
        await bus.publish("work", "x", {"n": 0}, id="m0")
        await stop_answering(server)
        result: list[str] = []
        async with anyio.create_task_group() as tg:

            async def publish() -> None:
                result.append(await bus.publish("work", "x", {"n": 1}, id="m1"))

            tg.start_soon(publish)
            await anyio.sleep(0.5)
            assert not result  # on the wire, unanswered
            await kill_and_restart(server)  # (SIGKILL ends a stopped process too)
        assert result == ["m1"]
        seen: list[str] = []
        with anyio.move_on_after(2):  # everything the stream holds, read once
            async for delivery in bus.consume("work", "audit", batch=8):
                seen.append(delivery.envelope.id)
                await delivery.ack()
        assert sorted(seen) == ["m0", "m1"]


async def test_a_kv_put_whose_answer_died_with_the_server_is_written_again(server: EmbeddedNats) -> None:
    """The same for a KV put (how the learner announces weights): written once the connection is back."""
    async with await Bus.connect(server.url, topology="t", name="p") as bus:
        await bus.ensure_kv("fw_t_w")
        await bus.kv_put("fw_t_w", "current", b"1")
        await stop_answering(server)
        revisions: list[int] = []
        async with anyio.create_task_group() as tg:

            async def put() -> None:
                revisions.append(await bus.kv_put("fw_t_w", "current", b"2"))

            tg.start_soon(put)
            await anyio.sleep(0.5)
            assert not revisions  # on the wire, unanswered
            await kill_and_restart(server)
        assert revisions and await bus.kv_get("fw_t_w", "current") == b"2"
