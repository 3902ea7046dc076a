"""Outbox: "publish this, then ack that delivery" for many concurrent handlers, coalesced into batches.

A handler that turns one delivery into one output message acks the delivery only after the output is stored
(at-least-once). Done handler by handler, that is an awaited JetStream round trip plus two socket writes per
message. The outbox queues ``(channel, message, delivery)`` items; one task sends whatever queued while the
previous batch was in flight as one pipelined ``publish_many`` per channel, then acks that batch's deliveries
in one flush: fewer round trips per message.

Contract:
- ``send`` returns once its message is stored and its delivery acked; it raises ``BusError`` when the publish
  failed, and the delivery is then left unsettled for the caller to nak. A stored message whose ack then fails
  is redelivered later and deduplicated by its id, so ``send`` still returns.
- A caller cancelled while waiting does not withdraw its item: it is still published, then acked.
- Per channel, messages are published in the order ``send`` was called; a batch is at most ``max_batch`` items.
- ``aclose`` (or leaving ``async with``) sends everything queued before it returns; ``send`` after it raises.

Non-goals: retries (the caller naks, the channel redelivers), ordering across channels.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from topology.bus._errors import BusError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from topology.bus._bus import Bus
    from topology.bus._consumer import Delivery


@dataclass
class _Item:
    channel: str
    type: str
    payload: Mapping[str, Any]
    id: str | None
    delivery: Delivery[Any] | None
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Outbox:
    """Coalescing publish-then-ack; use as ``async with Outbox(bus, source=...) as outbox``."""

    def __init__(self, bus: Bus, *, source: str = "", max_batch: int = 64) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch: expected an integer >= 1, got {max_batch!r}")
        self._bus = bus
        self._source = source
        self._max_batch = max_batch
        self._queue: list[_Item] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.batches = 0  # publish batches sent
        self.items = 0

    @property
    def per_batch(self) -> float | None:
        """Messages per publish batch so far (how much the outbox coalesced); ``None`` before the first."""
        return round(self.items / self.batches, 2) if self.batches else None

    async def __aenter__(self) -> Outbox:
        self._task = asyncio.create_task(self._run(), name="outbox")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await asyncio.shield(self._task)

    async def send(
        self,
        channel: str,
        type: str,
        payload: Mapping[str, Any],
        *,
        id: str | None = None,
        delivery: Delivery[Any] | None = None,
    ) -> None:
        """Publish ``payload`` to ``channel``, then ack ``delivery``; returns when both are done."""
        if self._closing or self._task is None:
            raise BusError("outbox is not open (use `async with Outbox(...)`)")
        item = _Item(channel, type, payload, id, delivery)
        item.done.add_done_callback(_retrieve)  # a cancelled caller's failure is not "never retrieved"
        self._queue.append(item)
        self._wake.set()
        await asyncio.shield(item.done)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
                try:
                    await self._flush(batch)
                except Exception as exc:  # a bug here must not leave senders waiting forever
                    for item in batch:
                        if not item.done.done():
                            item.done.set_exception(BusError(f"outbox failed: {exc!r}"))
            if self._closing:
                return

    async def _flush(self, batch: list[_Item]) -> None:
        by_channel: dict[str, list[_Item]] = {}
        for item in batch:
            by_channel.setdefault(item.channel, []).append(item)
        results = await asyncio.gather(
            *(
                self._bus.publish_many(channel, [(i.type, i.payload, i.id) for i in items], source=self._source)
                for channel, items in by_channel.items()
            ),
            return_exceptions=True,
        )
        self.batches += 1
        self.items += len(batch)
        for items, result in zip(by_channel.values(), results, strict=True):
            failed = isinstance(result, BaseException)
            for item in items:
                if not failed and item.delivery is not None:
                    with contextlib.suppress(Exception):  # stored; a lost ack means a deduplicated redelivery
                        await item.delivery.ack()
                if item.done.done():
                    continue
                if failed:
                    error = result if isinstance(result, BusError) else BusError(f"publish failed: {result!r}")
                    item.done.set_exception(error)
                else:
                    item.done.set_result(None)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
