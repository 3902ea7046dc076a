"""Consuming a durable channel: a continuous pull from a durable JetStream consumer, one ``Delivery`` at a time.

Contract:
- Replicas passing the same ``group`` share one durable consumer, so each message goes to one of them.
- At most ``2 × batch`` messages are requested ahead (buffered or in flight to this process); the server
  additionally bounds un-acked messages per group with ``max_ack_pending``.
- A delivery is acked only when the handler says so (``ack``); not acked within ``ack_wait_s`` (e.g. the
  process died) → redelivered. ``nak`` on the ``max_deliver``-th delivery, or a delivery beyond
  ``max_deliver`` (the consumer kept dying on it), → dead-letter channel.
- Poison (undecodable bytes, a malformed envelope, a payload that fails ``model.model_validate``) is
  published to the dead-letter channel with the reason, terminated, counted, and iteration continues.
- Cancelling ``__anext__`` loses nothing: messages stay buffered; ``aclose`` drains the inbox (ending the
  interest of its pull requests), then naks what was buffered but not handed out, so the rest of the group
  gets them at once. What was handed out stays the handler's to settle after the close (a recorder writes and acks
  what its closed consumers handed it); the bus's close naks what is still unsettled then (``Bus.close``).
- After the connection is re-established (a nats-server restart loses every waiting pull request) the consumer
  pulls again at once instead of waiting for its old requests to expire.

Non-goals: ordering across replicas; exactly-once handling (handlers must be idempotent on ``envelope.id``);
iterating one consumer from several tasks at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio
import orjson
import pydantic
from nats.aio.msg import Msg

from topology._names import DEADLETTER
from topology.bus._envelope import Envelope, decode
from topology.bus._errors import BusError, EnvelopeError

if TYPE_CHECKING:
    from topology.bus._bus import Bus

__all__ = ["ChannelConsumer", "Delivery"]

P = TypeVar("P")
_PULL_EXPIRES_S = 5.0  # a pull request lives this long on the server; then it is renewed
_PULL_GRACE_S = 1.0  # after its expiry + grace we stop counting a pull's messages as in flight
_STATUS = "Status"


class Delivery(Generic[P]):
    """One delivered message. Settle it exactly once: ``ack``, ``nak``, or ``dead_letter``."""

    __slots__ = ("__weakref__", "_consumer", "_msg", "_settled", "envelope", "num_delivered", "payload", "stream_seq")

    def __init__(
        self,
        consumer: ChannelConsumer[P],
        msg: Msg,
        envelope: Envelope,
        payload: P,
        num_delivered: int,
        stream_seq: int,
    ) -> None:
        self._consumer = consumer
        self._msg = msg
        self._settled = False
        self.envelope = envelope
        self.payload = payload
        self.num_delivered = num_delivered
        self.stream_seq = stream_seq

    @property
    def id(self) -> str:
        return self.envelope.id

    def _settle(self) -> None:
        self._settled = True
        self._consumer._bus.handed_out.discard(self)

    async def hand_back(self) -> None:
        """Nak as it is (no dead-letter on its last allowed delivery: the count is the server's, as for a death), if
        not settled yet: what the bus does at its close with every delivery nothing settled."""
        if not self._settled:
            self._settle()
            await self._msg.nak()
            self._consumer._bus.stats.naked += 1

    async def ack(self) -> None:
        if not self._settled:
            self._settle()
            await self._msg.ack()
            self._consumer._bus.stats.acked += 1

    async def nak(self, delay_s: float = 0) -> None:
        """Ask for redelivery (after ``delay_s``); on the last allowed delivery, dead-letter instead."""
        if self._settled:
            return
        max_deliver = self._consumer._bus.settings.max_deliver
        if self.num_delivered >= max_deliver:
            await self.dead_letter(f"max_deliver ({max_deliver}) reached: nak'ed on delivery {self.num_delivered}")
            return
        self._settle()
        await self._msg.nak(delay=delay_s if delay_s > 0 else None)
        self._consumer._bus.stats.naked += 1

    async def in_progress(self) -> None:
        """Reset the ack timer for a long-running handler."""
        await self._msg.in_progress()

    async def dead_letter(self, reason: str) -> None:
        """Handler-side poison: publish to the dead-letter channel with ``reason`` and terminate."""
        if not self._settled:
            self._settle()
            await self._consumer._poison(self._msg, reason, self.num_delivered, self.stream_seq)

    def __repr__(self) -> str:
        return (
            f"Delivery(id={self.envelope.id!r}, type={self.envelope.type!r}, "
            f"num_delivered={self.num_delivered}, seq={self.stream_seq})"
        )


def _ack_metadata(reply: str) -> tuple[int, int]:
    """(num_delivered, stream_seq) from a JetStream ack subject (v1 and v2 token layouts)."""
    tokens = reply.split(".")
    if len(tokens) == 9:
        return int(tokens[4]), int(tokens[5])
    if len(tokens) >= 11:
        return int(tokens[6]), int(tokens[7])
    raise BusError(f"unexpected JetStream ack subject {reply!r}")


class ChannelConsumer(Generic[P]):
    """Async iterator of deliveries from ``channel`` for consumer ``group``; also an async context manager."""

    def __init__(
        self,
        bus: Bus,
        channel: str,
        group: str,
        *,
        model: type[pydantic.BaseModel] | None,
        batch: int,
        max_ack_pending: int | None,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch: expected an integer >= 1, got {batch!r}")
        self._bus = bus
        self.channel = channel
        self.group = group
        self._model = model
        self._batch = batch
        self._limit = 2 * batch
        self._max_ack_pending = max_ack_pending
        self._buffer: deque[Msg] = deque()
        self._wakeup = asyncio.Event()
        self._outstanding = 0  # messages requested by pulls and not yet seen
        self._pull_deadline = 0.0  # monotonic time after which no pull of ours can still deliver
        self._sub: Any = None
        self._inbox = ""
        self._next_subject = ""
        self._started = False
        self._closed = False
        self._error: BusError | None = None
        self._start_lock = asyncio.Lock()

    # -- lifecycle --------------------------------------------------------------------------------------
    async def start(self) -> ChannelConsumer[P]:
        async with self._start_lock:
            if self._started:
                return self
            if self._closed:
                raise BusError(f"consumer {self.group!r} on channel {self.channel!r} is closed")
            stream = await self._bus.ensure_consumer(self.channel, self.group, self._max_ack_pending)
            nc = self._bus.nc
            self._inbox = nc.new_inbox()
            self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{self.group}"
            self._sub = await nc.subscribe(self._inbox, cb=self._on_msg)
            self._started = True
            self._bus.track(self)
            self._bus.reconnects.add_callback(self._on_reconnect)
        return self

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._bus.untrack(self)
        self._bus.reconnects.remove_callback(self._on_reconnect)
        if self._sub is None:
            return
        with anyio.CancelScope(shield=True):
            # Interest first, naks second. Our pull request may still be waiting on the server, and a nak'd
            # message is redelivered to the oldest waiting request: nak'd before the unsubscribe, it could come
            # straight back to this inbox and be lost with it until ack_wait (2 closes in 100 did that). The
            # drain's UNSUB reaches the server before the naks on the same connection, so the server has
            # dropped our request by then and hands them to the rest of the group.
            try:
                await self._sub.drain()  # stop interest, then hand late arrivals to _on_msg (which naks)
            except Exception:
                pass
            buffered, self._buffer = list(self._buffer), deque()
            for msg in buffered:
                await msg.nak()
            self._wakeup.set()

    async def __aenter__(self) -> ChannelConsumer[P]:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> ChannelConsumer[P]:
        return self

    # -- iteration --------------------------------------------------------------------------------------
    async def __anext__(self) -> Delivery[P]:
        if not self._started:
            await self.start()
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._error is not None:
                raise self._error
            if self._buffer:
                msg = self._buffer.popleft()
                await self._maybe_pull()
                delivery = await self._admit(msg)
                if delivery is not None:
                    self._bus.handed_out.add(delivery)
                    return delivery
                continue
            self._wakeup.clear()
            await self._maybe_pull()
            if self._buffer or self._error is not None:
                continue
            now = time.monotonic()
            try:
                async with asyncio.timeout(max(0.05, self._pull_deadline - now)):
                    await self._wakeup.wait()
            except TimeoutError:
                if time.monotonic() >= self._pull_deadline:
                    self._outstanding = 0  # our pulls expired unseen (e.g. across a reconnect)

    async def _maybe_pull(self) -> None:
        have = self._outstanding + len(self._buffer)
        if have > self._batch or self._closed:
            return
        if self._outstanding and time.monotonic() >= self._pull_deadline:
            self._outstanding = 0
        want = self._limit - self._outstanding - len(self._buffer)
        request = orjson.dumps({"batch": want, "expires": int(_PULL_EXPIRES_S * 1e9)})
        await self._bus.nc.publish(self._next_subject, request, reply=self._inbox)
        self._outstanding += want
        self._pull_deadline = time.monotonic() + _PULL_EXPIRES_S + _PULL_GRACE_S

    def _on_reconnect(self) -> None:
        """Pull requests did not survive the disconnect (a restarted server has none): pull again now."""
        self._outstanding = 0
        self._pull_deadline = 0.0
        self._wakeup.set()

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        if not msg.reply and headers is not None and _STATUS in headers:
            self._on_status(headers)
        elif self._closed:
            await msg.nak()
        else:
            self._buffer.append(msg)
            if self._outstanding > 0:
                self._outstanding -= 1
        self._wakeup.set()

    def _on_status(self, headers: dict[str, str]) -> None:
        status = headers.get(_STATUS, "")
        if status == "100":
            return  # idle heartbeat / flow control: nothing to account
        description = headers.get("Description", "")
        pending = headers.get("Nats-Pending-Messages")
        if pending is not None and pending.isdigit():
            self._outstanding = max(0, self._outstanding - int(pending))
        else:
            self._outstanding = 0
        if status == "409" and "deleted" in description.lower():
            self._error = BusError(f"consumer {self.group!r} on channel {self.channel!r} was deleted")

    async def _admit(self, msg: Msg) -> Delivery[P] | None:
        """Decode and validate one message; poison goes to the dead-letter channel (returns None)."""
        stats = self._bus.stats
        num_delivered, stream_seq = _ack_metadata(msg.reply)
        stats.delivered += 1
        if num_delivered > 1:
            stats.redelivered += 1
        if num_delivered > self._bus.settings.max_deliver:
            await self._poison(
                msg,
                f"max_deliver ({self._bus.settings.max_deliver}) exceeded: delivered "
                f"{num_delivered - 1} times without an ack (handler crashed or ack_wait expired)",
                num_delivered,
                stream_seq,
            )
            return None
        try:
            envelope = decode(msg.data)
        except EnvelopeError as exc:
            await self._poison(msg, f"undecodable envelope: {exc.reason}", num_delivered, stream_seq)
            return None
        payload: Any = envelope.payload
        if self._model is not None:
            try:
                payload = self._model.model_validate(envelope.payload)
            except pydantic.ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in first.get("loc", ())) or "<root>"
                await self._poison(
                    msg,
                    f"payload failed {self._model.__name__} validation "
                    f"({exc.error_count()} error(s)); first at {where}: {first.get('msg')}",
                    num_delivered,
                    stream_seq,
                )
                return None
        return Delivery(self, msg, envelope, payload, num_delivered, stream_seq)

    async def _poison(self, msg: Msg, reason: str, num_delivered: int, stream_seq: int) -> None:
        try:
            if self.channel != DEADLETTER:  # poison inside the dead-letter channel is dropped, not looped
                await self._bus.dead_letter(
                    self.channel,
                    self.group,
                    reason,
                    msg.data,
                    msg.headers,
                    num_delivered=num_delivered,
                    stream_seq=stream_seq,
                )
        except Exception as exc:  # the DLQ itself is unreachable: retry the message later, keep going
            self._bus.log.warning(
                "dead-letter publish failed; will retry", channel=self.channel, group=self.group, error=str(exc)
            )
            await msg.nak(delay=1.0)
            return
        await msg.term()
        self._bus.stats.count_dead_letter(self.group, self.channel)
