from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import nats.js.errors
import pydantic
import pytest

from topology import BusSpec
from topology.bus import DEADLETTER, Bus, BusError, ChannelConsumer, Delivery, EmbeddedNats

pytestmark = pytest.mark.anyio


async def take(
    consumer: ChannelConsumer[Any], n: int, *, ack: bool = True, timeout_s: float = 10.0
) -> list[Delivery[Any]]:
    got: list[Delivery[Any]] = []
    with anyio.fail_after(timeout_s):
        async for delivery in consumer:
            got.append(delivery)
            if ack:
                await delivery.ack()
            if len(got) == n:
                break
    return got


async def dead_letters(bus: Bus, n: int) -> list[dict[str, Any]]:
    async with bus.consume(DEADLETTER, "inspect") as dlq:
        return [dict(d.payload) for d in await take(dlq, n)]


async def test_publish_consume_ack_in_order(bus: Bus) -> None:
    ids = await bus.publish_many("prompts", [("prompt", {"i": i}, None) for i in range(50)])
    async with bus.consume("prompts", "gen") as consumer:
        got = await take(consumer, 50)
    assert [d.id for d in got] == ids
    assert [d.payload["i"] for d in got] == list(range(50))
    assert all(d.num_delivered == 1 and d.envelope.type == "prompt" and d.envelope.source == "test" for d in got)
    assert bus.stats.published == 50 and bus.stats.delivered == 50 and bus.stats.acked == 50


async def test_acked_messages_are_not_redelivered(bus: Bus) -> None:
    await bus.publish("prompts", "p", {"i": 1})
    async with bus.consume("prompts", "gen") as consumer:
        await take(consumer, 1)
    await bus.publish("prompts", "p", {"i": 2})
    async with bus.consume("prompts", "gen") as consumer:
        (second,) = await take(consumer, 1)
    assert second.payload == {"i": 2}


async def test_model_validates_payload(bus: Bus) -> None:
    class Prompt(pydantic.BaseModel):
        text: str

    await bus.publish("prompts", "p", {"text": "hi"})
    async with bus.consume("prompts", "gen", model=Prompt) as consumer:
        (delivery,) = await take(consumer, 1)
    assert delivery.payload == Prompt(text="hi")


async def test_replicas_of_one_group_share_the_work(embedded_nats: EmbeddedNats) -> None:
    topology = f"t-{uuid.uuid4().hex[:10]}"
    async with (
        await Bus.connect(embedded_nats.url, topology=topology, name="a") as bus_a,
        await Bus.connect(embedded_nats.url, topology=topology, name="b") as bus_b,
    ):
        await bus_a.ensure_channel("prompts")
        seen: dict[str, list[str]] = {"a": [], "b": []}
        total = 120

        all_seen = anyio.Event()

        async def replica(bus: Bus, name: str) -> None:
            async with bus.consume("prompts", "gen", batch=2) as consumer:
                async for delivery in consumer:
                    seen[name].append(delivery.id)
                    await delivery.ack()
                    await asyncio.sleep(0.002)  # a little work, so the other replica's pulls get served
                    if len(seen["a"]) + len(seen["b"]) >= total:
                        all_seen.set()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(replica, bus_a, "a")
                tg.start_soon(replica, bus_b, "b")
                # both replicas' pull requests wait on the server before anything is published (a fixed pause
                # here let a slow second replica miss the whole batch on a loaded machine)
                js = bus_a.nc.jetstream()
                while True:
                    try:
                        if (await js.consumer_info(bus_a.stream("prompts"), "gen")).num_waiting >= 2:
                            break
                    except nats.js.errors.NotFoundError:
                        pass  # not created yet
                    await anyio.sleep(0.01)
                ids = await bus_a.publish_many("prompts", [("p", {"i": i}, None) for i in range(total)])
                await all_seen.wait()
                await anyio.sleep(0.3)  # a duplicate delivery, if any, would arrive now
                tg.cancel_scope.cancel()  # both replicas are still waiting for more: stop them
    assert seen["a"] and seen["b"], "one replica got everything"
    assert len(seen["a"]) + len(seen["b"]) == total
    assert set(seen["a"]) | set(seen["b"]) == set(ids)
    assert not set(seen["a"]) & set(seen["b"])


async def test_republished_id_is_stored_once(bus: Bus) -> None:
    await bus.publish("prompts", "p", {"n": 1}, id="same-id")
    await bus.publish("prompts", "p", {"n": 2}, id="same-id")
    await bus.publish_many("prompts", [("p", {"n": 3}, "same-id"), ("p", {"n": 4}, "other-id")])
    assert bus.stats.duplicates == 2
    async with bus.consume("prompts", "gen") as consumer:
        got = await take(consumer, 2)
        with pytest.raises(TimeoutError):
            await take(consumer, 1, timeout_s=0.5)
    assert [(d.id, d.payload) for d in got] == [("same-id", {"n": 1}), ("other-id", {"n": 4})]


async def test_redelivered_after_consumer_process_is_sigkilled(
    bus: Bus, embedded_nats: EmbeddedNats, repo_root: Path
) -> None:
    msg_id = await bus.publish("prompts", "p", {"work": "x"})
    helper = Path(__file__).with_name("_bus_consume_one.py")
    proc = await anyio.open_process(
        [sys.executable, str(helper), embedded_nats.url, bus.topology, "prompts", "gen"],
        env={**os.environ, "PYTHONPATH": str(repo_root)},
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        with anyio.fail_after(20):
            line = await proc.stdout.receive()
        assert line.decode().strip() == msg_id  # the helper holds it, un-acked
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    async with bus.consume("prompts", "gen") as consumer:
        (again,) = await take(consumer, 1)  # ack_wait is 1 s in these tests
    assert again.id == msg_id and again.num_delivered == 2
    assert bus.stats.redelivered == 1


async def test_nak_redelivers(bus: Bus) -> None:
    await bus.publish("prompts", "p", {})
    async with bus.consume("prompts", "gen") as consumer:
        (first,) = await take(consumer, 1, ack=False)
        await first.nak()
        (second,) = await take(consumer, 1)
    assert second.id == first.id and second.num_delivered == 2
    assert bus.stats.naked == 1


@pytest.mark.parametrize("bus_settings", [BusSpec(ack_wait_s=1.0, max_deliver=2)])
async def test_nak_on_last_delivery_goes_to_dead_letter(bus: Bus) -> None:
    msg_id = await bus.publish("prompts", "p", {"x": 1})
    async with bus.consume("prompts", "gen") as consumer:
        for _ in range(2):
            (delivery,) = await take(consumer, 1, ack=False)
            await delivery.nak()
        ok_id = await bus.publish("prompts", "p", {"x": 2})
        (after,) = await take(consumer, 1)
    assert after.id == ok_id
    (letter,) = await dead_letters(bus, 1)
    assert "max_deliver (2) reached" in letter["reason"]
    assert letter["channel"] == "prompts" and letter["group"] == "gen" and msg_id in letter["raw"]
    assert bus.stats.dead_lettered == 1


@pytest.mark.parametrize("bus_settings", [BusSpec(ack_wait_s=1.0, max_deliver=1)])
async def test_message_whose_handler_keeps_dying_goes_to_dead_letter(bus: Bus) -> None:
    msg_id = await bus.publish("prompts", "p", {})
    async with bus.consume("prompts", "gen") as consumer:
        (delivery,) = await take(consumer, 1, ack=False)  # never settled: as if the handler died
        assert delivery.id == msg_id
        await anyio.sleep(1.5)  # past ack_wait: the server has redelivered it to this consumer
        ok_id = await bus.publish("prompts", "p", {})
        (after,) = await take(consumer, 1)
    assert after.id == ok_id
    (letter,) = await dead_letters(bus, 1)
    assert "max_deliver (1) exceeded" in letter["reason"]


async def test_handler_dead_letter_keeps_reason(bus: Bus) -> None:
    await bus.publish("prompts", "p", {"bad": True})
    async with bus.consume("prompts", "gen") as consumer:
        (delivery,) = await take(consumer, 1, ack=False)
        await delivery.dead_letter("verifier rejected the payload")
    (letter,) = await dead_letters(bus, 1)
    assert letter["reason"] == "verifier rejected the payload"


async def test_a_poison_message_is_terminated_once_it_is_dead_lettered(bus: Bus) -> None:
    """A poison message left pending after its dead letter would come back every ``ack_wait`` (a dead-letter attempt
    each time, ``redelivered`` climbing) and hold a ``max_ack_pending`` slot of its group until ``max_deliver`` ran
    out: it is terminated, so the server delivers it once and has nothing pending for it."""
    js = bus.nc.jetstream()
    await bus.ensure_channel("prompts")
    await js.publish(bus.subject("prompts"), b"not an envelope")
    async with bus.consume("prompts", "gen") as consumer, anyio.create_task_group() as tg:
        tg.start_soon(consumer.__anext__)  # admits the poison, then waits for a good message that never comes
        with anyio.fail_after(10):
            for _ in iter(int, 1):
                info = await js.consumer_info(bus.stream("prompts"), "gen")
                if bus.stats.dead_lettered and (info.num_ack_pending == 0 or bus.stats.delivered > 1):
                    break
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert bus.stats.delivered == 1 and bus.stats.dead_lettered == 1
    assert info.num_ack_pending == 0


async def test_a_dead_letter_channel_that_fails_delays_the_poison_and_iteration_goes_on(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead-letter publish that fails (the bus away for a moment) must not end the iteration: raised, it would stop
    the handler's loop, and its replica, over a message that was never its to handle. The poison is handed back for a
    later try, the next message is delivered, and the poison is dead-lettered once the channel takes it."""
    real = bus.dead_letter
    attempts: list[str] = []

    async def fails_once(channel: str, group: str, reason: str, *args: Any, **kwargs: Any) -> None:
        attempts.append(reason)
        if len(attempts) == 1:
            raise BusError("dead-letter channel unreachable")
        await real(channel, group, reason, *args, **kwargs)

    monkeypatch.setattr(bus, "dead_letter", fails_once)
    await bus.ensure_channel("prompts")
    await bus.nc.jetstream().publish(bus.subject("prompts"), b"not an envelope")
    good_id = await bus.publish("prompts", "p", {"i": 1})
    async with bus.consume("prompts", "gen") as consumer:
        (good,) = await take(consumer, 1)
        assert good.id == good_id
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer.__anext__)  # admits the poison again when it comes back
            (letter,) = await dead_letters(bus, 1)
            tg.cancel_scope.cancel()
    assert letter["reason"].startswith("undecodable envelope") and letter["raw"] == "not an envelope"
    assert len(attempts) == 2 and bus.stats.dead_lettered == 1


async def test_a_message_dead_lettered_twice_is_one_letter(bus: Bus) -> None:
    """A consumer whose term was lost meets the poison again and dead-letters it again: the dead-letter channel keeps
    one letter per (stream, sequence, group), not one per attempt, so one bad message is counted and inspected once."""
    for delivered in (1, 2):
        await bus.dead_letter(
            "prompts", "gen", "undecodable envelope", b"x", None, num_delivered=delivered, stream_seq=7
        )
    info = await bus.nc.jetstream().stream_info(bus.stream(DEADLETTER))
    assert info.state.messages == 1


@pytest.mark.parametrize("bus_settings", [BusSpec(ack_wait_s=30.0)])
async def test_closing_a_consumer_hands_buffered_messages_back(bus: Bus) -> None:
    await bus.publish_many("prompts", [("p", {"i": i}, None) for i in range(10)])
    async with bus.consume("prompts", "gen", batch=8) as greedy:
        await take(greedy, 1)  # the rest of its pull sits in its buffer, un-acked
    async with bus.consume("prompts", "gen") as consumer:
        # ack_wait is 30 s here: only the close handing them back can deliver them within 10 s (a 1 s ack_wait with
        # a 0.9 s deadline flaked on a loaded 2-core machine)
        rest = await take(consumer, 9, timeout_s=10.0)
    assert sorted(d.payload["i"] for d in rest) == list(range(1, 10))


@pytest.mark.parametrize("bus_settings", [BusSpec(ack_wait_s=30.0)])
async def test_closing_the_bus_hands_back_what_no_handler_settled(bus: Bus, embedded_nats: EmbeddedNats) -> None:
    """A replica stopped while its handler held deliveries (taken, neither acked nor nak'ed) left them to ack_wait
    (30 s: a resumed run waited that long for them); its bus's close naks them. A consumer's own close does not: what
    it handed out stays the handler's to settle (a recorder writes and acks after its consumers closed)."""
    await bus.publish_many("prompts", [("p", {"i": i}, None) for i in range(4)])
    replica = await Bus.connect(embedded_nats.url, topology=bus.topology, name="replica", settings=bus.settings)
    async with replica.consume("prompts", "gen", batch=1) as consumer:
        held = await take(consumer, 4, ack=False)
    await held[0].ack()  # after the consumer's close: still the handler's
    await replica.close()  # a handler stopped mid-way on held[1:]
    async with bus.consume("prompts", "gen") as consumer:
        again = await take(consumer, 3, timeout_s=10.0)
    assert sorted(d.payload["i"] for d in again) == [1, 2, 3] and {d.num_delivered for d in again} == {2}


async def test_cancelled_iteration_loses_nothing(bus: Bus) -> None:
    async with bus.consume("prompts", "gen") as consumer:
        with anyio.move_on_after(0.3):
            await consumer.__anext__()  # nothing published yet: cancelled while waiting
        await bus.publish("prompts", "p", {"late": True})
        (delivery,) = await take(consumer, 1)
    assert delivery.payload == {"late": True}


async def test_connect_error_names_the_url() -> None:
    with pytest.raises(BusError, match=r"cannot connect to NATS at nats://127\.0\.0\.1:1"):
        await Bus.connect("nats://127.0.0.1:1", topology="t", name="x", connect_timeout_s=0.5)


async def test_missing_creds_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BusError, match="creds file not found"):
        await Bus.connect("nats://127.0.0.1:1", topology="t", name="x", creds_file=tmp_path / "nope.creds")


async def test_ensure_channel_is_idempotent_and_updates(bus: Bus) -> None:
    await bus.ensure_channel("scored")
    await bus.ensure_channel("scored")
    await bus.ensure_channel("scored", max_age_s=3600, max_msgs=1000)
    info = await bus.nc.jetstream().stream_info(bus.stream("scored"))
    assert info.config.max_msgs == 1000 and info.config.subjects == [bus.subject("scored")]
    assert info.config.duplicate_window == pytest.approx(bus.settings.dedupe_window_s)
