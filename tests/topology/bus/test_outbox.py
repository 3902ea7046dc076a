"""Outbox: concurrent publish-then-ack handlers, coalesced; nothing lost, nothing acked before it is stored."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from topology import BusSpec
from topology.bus import Bus, BusError, Delivery, Outbox

pytestmark = pytest.mark.anyio


async def drain(bus: Bus, channel: str, group: str, n: int, timeout_s: float = 10.0) -> list[Delivery[Any]]:
    got: list[Delivery[Any]] = []
    with anyio.fail_after(timeout_s):
        async with bus.consume(channel, group) as consumer:
            async for delivery in consumer:
                await delivery.ack()
                got.append(delivery)
                if len(got) == n:
                    break
    return got


async def test_concurrent_sends_are_published_once_each_and_their_inputs_acked(bus: Bus) -> None:
    await bus.publish_many("inputs", [("in", {"i": i}, f"in-{i}") for i in range(40)])
    async with bus.consume("inputs", "worker") as inputs, Outbox(bus, source="w/0", max_batch=16) as outbox:
        taken: list[Delivery[Any]] = []
        async for delivery in inputs:
            taken.append(delivery)
            if len(taken) == 40:
                break

        async def handle(delivery: Delivery[Any]) -> None:
            await outbox.send("outputs", "out", {"i": delivery.payload["i"]}, id=f"{delivery.id}.o", delivery=delivery)

        async with anyio.create_task_group() as tg:
            for delivery in taken:
                tg.start_soon(handle, delivery)
    assert outbox.items == 40 and outbox.batches < 40  # 40 concurrent sends went out in fewer, larger batches
    assert outbox.per_batch == round(40 / outbox.batches, 2)
    outputs = await drain(bus, "outputs", "check", 40)
    assert sorted(d.payload["i"] for d in outputs) == list(range(40))
    assert {d.envelope.source for d in outputs} == {"w/0"}
    assert bus.stats.acked >= 80  # the 40 inputs by the outbox, the 40 outputs by drain()
    async with bus.consume("inputs", "worker") as again:  # every input was acked: nothing comes back
        with anyio.move_on_after(0.5):
            extra = await again.__anext__()
            pytest.fail(f"input redelivered: {extra!r}")


@pytest.mark.parametrize("bus_settings", [BusSpec(ack_wait_s=1.0, max_deliver=3)])
async def test_a_failed_publish_raises_and_leaves_the_delivery_unacked(bus: Bus) -> None:
    await bus.publish("inputs", "in", {"i": 1})
    async with bus.consume("inputs", "worker") as inputs, Outbox(bus) as outbox:
        delivery = await inputs.__anext__()
        await bus.nc.close()  # the publish cannot reach the server
        with pytest.raises(BusError, match="publish to channel 'outputs' failed"):
            await outbox.send("outputs", "out", {"i": 1}, delivery=delivery)
        assert bus.stats.acked == 0


async def test_a_refused_publish_leaves_the_delivery_for_the_caller_to_nak(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An input is acked only once its output is stored: acked after a refused publish, the input would be gone and
    its output never written (a lost sample). ``send`` raises, the delivery stays unsettled, and the caller's nak
    brings the input back for another try."""
    await bus.publish("inputs", "in", {"i": 1})

    async def refused(*args: Any, **kwargs: Any) -> list[str]:
        raise BusError("publish to channel 'outputs' failed: refused")

    async with bus.consume("inputs", "worker") as inputs, Outbox(bus) as outbox:
        delivery = await inputs.__anext__()
        monkeypatch.setattr(bus, "publish_many", refused)
        with pytest.raises(BusError, match="refused"):
            await outbox.send("outputs", "out", {"i": 1}, id=f"{delivery.id}.o", delivery=delivery)
        monkeypatch.undo()
        assert bus.stats.acked == 0
        await delivery.nak()
        with anyio.fail_after(10):
            again = await inputs.__anext__()
    assert again.id == delivery.id and again.num_delivered == 2


async def test_close_sends_what_is_queued_and_later_sends_are_refused(bus: Bus) -> None:
    outbox = Outbox(bus)
    with pytest.raises(BusError, match="outbox is not open"):
        await outbox.send("outputs", "out", {"i": 0})
    async with outbox:
        tasks = [asyncio.ensure_future(outbox.send("outputs", "out", {"i": i})) for i in range(5)]
        await asyncio.sleep(0)
    assert all(t.done() and t.exception() is None for t in tasks)
    assert sorted(d.payload["i"] for d in await drain(bus, "outputs", "check", 5)) == list(range(5))
    with pytest.raises(BusError, match="outbox is not open"):
        await outbox.send("outputs", "out", {"i": 9})


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch: expected an integer >= 1, got 0"):
        Outbox(None, max_batch=0)  # type: ignore[arg-type]
