"""Bus: one NATS connection for one actor process — durable channels, dead letters, KV, objects, heartbeats.

Contract:
- ``Bus.connect(url, topology=..., name=...)`` connects (a token, or a creds file for external clusters), retries
  for ``connect_timeout_s`` and then fails with a ``BusError`` naming the URL (and saying so when the server refused
  the credentials); once connected it reconnects forever (a running service rides out a NATS restart): publishes
  wait up to their timeout for the server to come back (one whose ack died with the old server is sent again as
  soon as the connection is back), consumers re-issue their pulls and KV watches re-create their watchers then
  (``bus.reconnects``, see ``_reconnect``).
- A channel is a JetStream stream ``FW_<TOPOLOGY>_<CHANNEL>`` on subject ``fw.<topology>.<channel>``
  (file storage, limits retention, ``duplicate_window = dedupe_window_s``); ``ensure_channel`` creates or
  updates it; publishing or consuming a channel not yet ensured creates it with defaults.
- ``publish`` / ``publish_many`` return only after JetStream stored the message(s); ``Nats-Msg-Id`` = the
  envelope id, so a re-published id inside the dedupe window is stored once.
- ``consume`` — see ``_consumer``; dead letters are envelopes of type ``"deadletter"`` on the ``deadletter``
  channel with payload ``{reason, channel, group, stream_seq, num_delivered, raw, headers}``.
- Ephemeral messages (heartbeats) are core NATS on ``fw.<topology>.eph.<suffix>``: not stored, no acks.

Non-goals: schema registry, cross-channel transactions, exactly-once handling.
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeVar, overload

import anyio
import nats
import nats.errors
import nats.js.errors as js_errors
import orjson
import pydantic
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from topology._names import DEADLETTER, channel_subject, consumer_name, ephemeral_subject, stream_name
from topology._spec import BusSpec
from topology.bus._acks import AcksLost, AckTracker, PublishError
from topology.bus._consumer import ChannelConsumer, Delivery
from topology.bus._envelope import Envelope, encode
from topology.bus._errors import BusError
from topology.bus._kv import STALL_S, Stores
from topology.bus._reconnect import Reconnects
from topology.bus._stats import BusStats

__all__ = ["Bus", "EphemeralMessage", "EphemeralSubscription"]

M = TypeVar("M", bound=pydantic.BaseModel)
_RAW_CAP = 4096  # characters of a poison message kept in its dead letter
_STREAM_IN_USE = 10058  # JetStream: "stream name already in use with a different configuration"
_PUBLISH_TIMEOUT_S = 10.0


class Bus:
    """Use ``await Bus.connect(...)``; close with ``await bus.close()`` or ``async with``."""

    def __init__(
        self,
        nc: NATS,
        *,
        url: str,
        topology: str,
        name: str,
        settings: BusSpec,
        reconnects: Reconnects | None = None,
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream(timeout=_PUBLISH_TIMEOUT_S)
        self.url = url
        self.topology = topology
        self.name = name
        self.settings = settings
        self.stats = BusStats()
        self.reconnects = reconnects or Reconnects()  # bumped by nats-py's reconnect callback
        self._acks = AckTracker(nc)
        self.reconnects.add_callback(self._acks.connection_lost)
        self._stores = Stores(self._js, self._acks, self.reconnects)
        self._streams: set[str] = set()
        self._consumers: set[ChannelConsumer[Any]] = set()
        # deliveries handed to handlers and not settled yet (weak: one a handler dropped comes back after ack_wait)
        self.handed_out: weakref.WeakSet[Delivery[Any]] = weakref.WeakSet()
        self._ephemeral: set[EphemeralSubscription] = set()
        self.log = structlog.get_logger("flywheel.bus").bind(topology=topology, bus=name)
        channel_subject(topology, "x")  # validates the topology name early

    # -- connection -------------------------------------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        topology: str,
        name: str,
        settings: BusSpec | None = None,
        creds_file: str | os.PathLike[str] | None = None,
        token: str | None = None,
        connect_timeout_s: float = 10.0,
    ) -> Bus:
        if creds_file is not None and not await anyio.Path(creds_file).is_file():
            raise BusError(f"NATS creds file not found: {os.fspath(creds_file)}")
        log = structlog.get_logger("flywheel.bus").bind(url=url, bus=name)
        refused: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        async def on_error(exc: Exception) -> None:
            text = str(exc) or type(exc).__name__
            if "authorization" in text.lower() and not refused.done() and not nc.is_connected:
                refused.set_result(text)  # refused at connect: no point retrying until the timeout
                return
            log.warning("nats error", error=text)

        reconnects = Reconnects()

        async def on_reconnect() -> None:
            log.info("nats reconnected")
            reconnects.reconnected()

        nc = NATS()
        connecting: asyncio.Future[object] = asyncio.ensure_future(
            nc.connect(
                servers=[url],
                name=name,
                token=token,
                user_credentials=os.fspath(creds_file) if creds_file is not None else None,
                connect_timeout=2,
                reconnect_time_wait=1,
                max_reconnect_attempts=-1,
                ping_interval=10,
                error_cb=on_error,
                reconnected_cb=on_reconnect,
                pending_size=64 * 1024 * 1024,
            )
        )
        try:
            done, _ = await asyncio.wait(
                [connecting, refused], timeout=connect_timeout_s, return_when="FIRST_COMPLETED"
            )
            if connecting not in done:
                raise nats.errors.Error(str(refused.result())) if refused.done() else TimeoutError()
            connecting.result()
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            connecting.cancel()
            try:
                await nc.close()
            except Exception:
                pass
            why = "timed out" if isinstance(exc, TimeoutError) else (str(exc) or type(exc).__name__)
            if "authorization" in why.lower():
                why += " (the server refused the credentials: check bus.creds_file / bus.token_env)"
            raise BusError(f"cannot connect to NATS at {url}: {why}") from None
        except BaseException:  # cancelled while connecting: leave no connection retrying in the background
            connecting.cancel()
            closing = asyncio.ensure_future(nc.close())
            closing.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise
        return cls(nc, url=url, topology=topology, name=name, settings=settings or BusSpec(), reconnects=reconnects)

    async def close(self) -> None:
        """Close every consumer, then hand back (nak) every delivery nothing settled — a handler stopped mid-way; no
        one in this process can settle it any more, and unsettled it would wait out ``ack_wait_s`` before the rest of
        its group, or the group after a resume, got it — then the connection."""
        for consumer in list(self._consumers):
            await consumer.aclose()
        for sub in list(self._ephemeral):
            await sub.aclose()
        for delivery in list(self.handed_out):
            try:
                await delivery.hand_back()
            except Exception:  # the connection is gone: ack_wait hands it back
                pass
        if not self._nc.is_closed:
            await self._nc.close()

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def track(self, consumer: ChannelConsumer[Any]) -> None:
        """Remember a started consumer, so that closing the bus closes it first (consumers call this)."""
        self._consumers.add(consumer)

    def untrack(self, consumer: ChannelConsumer[Any]) -> None:
        """Forget a closed consumer (consumers call this)."""
        self._consumers.discard(consumer)

    @property
    def nc(self) -> NATS:
        """The underlying nats-py connection (for what this class does not wrap)."""
        return self._nc

    # -- channels ---------------------------------------------------------------------------------------
    def subject(self, channel: str) -> str:
        return channel_subject(self.topology, channel)

    def stream(self, channel: str) -> str:
        return stream_name(self.topology, channel)

    async def ensure_channel(
        self, name: str, *, durable: bool = True, max_age_s: float | None = None, max_msgs: int = -1
    ) -> None:
        """Create the channel's stream, or update it to this configuration; idempotent. ``max_age_s`` None: the
        bus's ``retention.max_age_s``; the stream keeps at most ``retention.max_mb`` MiB either way."""
        retention = self.settings.retention
        if max_age_s is None:
            max_age_s = retention.max_age_s
        dedupe = self.settings.dedupe_window_s
        if max_age_s is not None and max_age_s > 0:
            dedupe = min(dedupe, max_age_s)
        config = api.StreamConfig(
            name=self.stream(name),
            subjects=[self.subject(name)],
            storage=api.StorageType.FILE if durable else api.StorageType.MEMORY,
            retention=api.RetentionPolicy.LIMITS,
            discard=api.DiscardPolicy.OLD,
            max_age=max_age_s or 0,
            max_msgs=max_msgs,
            max_bytes=retention.max_mb * 1024 * 1024 if retention.max_mb is not None else -1,
            duplicate_window=dedupe,
        )
        try:
            try:
                await self._js.add_stream(config)
            except js_errors.BadRequestError as exc:
                if exc.err_code != _STREAM_IN_USE:
                    raise
                await self._js.update_stream(config)
        except js_errors.Error as exc:
            raise BusError(f"cannot create channel {name!r} (stream {config.name}) on {self.url}: {exc}") from None
        self._streams.add(name)

    async def _known(self, channel: str) -> str:
        if channel not in self._streams:
            try:
                await self._js.stream_info(self.stream(channel))
                self._streams.add(channel)
            except js_errors.NotFoundError:
                await self.ensure_channel(channel)
        return self.subject(channel)

    # -- publishing -------------------------------------------------------------------------------------
    async def publish(
        self, channel: str, type: str, payload: Mapping[str, Any], *, id: str | None = None, source: str = ""
    ) -> str:
        """Publish one durable message; returns its id once JetStream stored it."""
        ids = await self.publish_many(channel, [(type, payload, id)], source=source)
        return ids[0]

    async def publish_many(
        self, channel: str, items: Sequence[tuple[str, Mapping[str, Any], str | None]], source: str = ""
    ) -> list[str]:
        """Publish ``(type, payload, id|None)`` items pipelined: send all, then await every store ack."""
        source = source or self.name
        ids: list[str] = []
        messages: list[tuple[str, bytes | memoryview, dict[str, str] | None]] = []
        try:
            subj = await self._known(channel)
            for type_, payload, id_ in items:
                env = Envelope.new(type_, payload, id=id_, source=source)
                ids.append(env.id)
                messages.append((subj, encode(env), {"Nats-Msg-Id": env.id}))
            deadline = time.monotonic() + _PUBLISH_TIMEOUT_S
            while True:
                try:
                    duplicates = await self._acks.publish(messages, timeout_s=deadline - time.monotonic())
                    break
                except AcksLost:  # a server restart took the acks: send again (same ids: stored once)
                    if time.monotonic() >= deadline:
                        raise
        except (PublishError, js_errors.Error, nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"publish to channel {channel!r} failed: {str(exc) or type(exc).__name__}") from None
        self.stats.published += len(ids)
        self.stats.duplicates += duplicates
        return ids

    # -- consuming --------------------------------------------------------------------------------------
    @overload
    def consume(
        self, channel: str, group: str, *, model: None = None, batch: int = 16, max_ack_pending: int | None = None
    ) -> ChannelConsumer[dict[str, Any]]: ...
    @overload
    def consume(
        self, channel: str, group: str, *, model: type[M], batch: int = 16, max_ack_pending: int | None = None
    ) -> ChannelConsumer[M]: ...
    def consume(
        self,
        channel: str,
        group: str,
        *,
        model: type[pydantic.BaseModel] | None = None,
        batch: int = 16,
        max_ack_pending: int | None = None,
    ) -> ChannelConsumer[Any]:
        """Deliveries of ``channel`` for consumer ``group`` (replicas passing the same group share work)."""
        consumer_name(group)
        return ChannelConsumer(self, channel, group, model=model, batch=batch, max_ack_pending=max_ack_pending)

    async def ensure_consumer(self, channel: str, group: str, max_ack_pending: int | None) -> str:
        """Create (or update) the durable pull consumer of ``group`` on ``channel``; returns the stream's name."""
        await self._known(channel)
        stream = self.stream(channel)
        config = api.ConsumerConfig(
            name=group,
            durable_name=group,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            filter_subject=self.subject(channel),
            ack_wait=self.settings.ack_wait_s,
            # one delivery beyond the limit, so a message whose handler keeps dying reaches the DLQ
            max_deliver=self.settings.max_deliver + 1,
            max_ack_pending=max_ack_pending or self.settings.max_ack_pending,
            max_waiting=512,
        )
        try:
            await self._js.add_consumer(stream, config)
        except js_errors.Error as exc:
            raise BusError(f"cannot create consumer group {group!r} on channel {channel!r}: {exc}") from None
        return stream

    async def dead_letter(
        self,
        channel: str,
        group: str,
        reason: str,
        raw: bytes,
        headers: Mapping[str, str] | None,
        *,
        num_delivered: int,
        stream_seq: int,
    ) -> None:
        """Publish a message that cannot be delivered (malformed, or out of deliveries) to the dead-letter channel,
        with the reason and its raw bytes (capped); a consumer calls this, then terminates the message."""
        text = raw.decode("utf-8", errors="backslashreplace")
        if len(text) > _RAW_CAP:
            text = text[:_RAW_CAP] + f"… [{len(raw)} bytes]"
        payload = {
            "reason": reason,
            "channel": channel,
            "group": group,
            "stream_seq": stream_seq,
            "num_delivered": num_delivered,
            "raw": text,
            "headers": dict(headers or {}),
        }
        # one dead letter per (stream, seq, group), even if the term below is lost and it comes again
        await self.publish(DEADLETTER, "deadletter", payload, id=f"{self.stream(channel)}.{stream_seq}.{group}")
        self.log.warning("dead-lettered", channel=channel, group=group, reason=reason, seq=stream_seq)

    # -- shared state -----------------------------------------------------------------------------------
    async def ensure_kv(self, bucket: str, *, history: int = 1, ttl_s: float | None = None) -> None:
        await self._stores.kv(bucket, history=history, ttl_s=ttl_s)

    async def kv_put(self, bucket: str, key: str, value: bytes) -> int:
        return await self._stores.put(bucket, key, value)

    async def kv_get(self, bucket: str, key: str) -> bytes | None:
        return await self._stores.get(bucket, key)

    async def kv_items(self, bucket: str) -> dict[str, bytes]:
        return await self._stores.items(bucket)

    def kv_watch(self, bucket: str, key: str) -> AsyncIterator[bytes]:
        """The key's current value (if any), then each new value."""
        return self._stores.watch(bucket, key)

    async def object_put(self, bucket: str, name: str, data: bytes | bytearray | memoryview) -> tuple[int, str]:
        """Store a blob (chunked); returns ``(size, digest)`` — pass the digest to :meth:`object_get`."""
        return await self._stores.object_put(bucket, name, data)

    async def object_get(
        self, bucket: str, name: str, *, expect_digest: str | None = None, stall_s: float = STALL_S
    ) -> bytearray:
        """The object's bytes (a buffer of its own); ``BusError`` when it is missing, corrupted, replaced
        (``expect_digest``), or when no chunk arrives for ``stall_s`` (deleted while being read)."""
        return await self._stores.object_get(bucket, name, expect_digest=expect_digest, stall_s=stall_s)

    async def object_delete(self, bucket: str, name: str) -> bool:
        return await self._stores.object_delete(bucket, name)

    async def object_info(self, bucket: str, name: str) -> tuple[int, str]:
        """``(size, digest)`` of the object, without reading it; ``BusError`` when it is missing."""
        return await self._stores.object_info(bucket, name)

    # -- ephemeral (core NATS) --------------------------------------------------------------------------
    def _eph_subject(self, subject_suffix: str) -> str:
        return ephemeral_subject(self.topology, subject_suffix)

    async def publish_ephemeral(self, subject_suffix: str, payload: Mapping[str, Any]) -> None:
        await self._nc.publish(self._eph_subject(subject_suffix), orjson.dumps(payload))

    async def subscribe_ephemeral(self, subject_suffix: str, *, max_buffered: int = 1024) -> EphemeralSubscription:
        """Subscribe to ``fw.<topology>.eph.<subject_suffix>`` (wildcards allowed); the oldest are dropped
        when more than ``max_buffered`` wait, since only recent heartbeats matter."""
        sub = EphemeralSubscription(self, len(self._eph_subject("")), max_buffered)
        sub._sub = await self._nc.subscribe(self._eph_subject(subject_suffix), cb=sub._on_msg)
        self._ephemeral.add(sub)
        return sub


class EphemeralMessage(pydantic.BaseModel):
    """One core-NATS message: its subject after ``fw.<topology>.eph.`` and its decoded JSON payload."""

    subject_suffix: str
    payload: dict[str, Any]


class EphemeralSubscription:
    """Async iterator of ``EphemeralMessage``; undecodable messages are skipped (counted in ``dropped``)."""

    def __init__(self, bus: Bus, prefix_len: int, max_buffered: int) -> None:
        self._bus = bus
        self._prefix_len = prefix_len
        self._queue: asyncio.Queue[EphemeralMessage | None] = asyncio.Queue(max_buffered)
        self._sub: Any = None
        self.dropped = 0

    async def _on_msg(self, msg: Msg) -> None:
        try:
            payload = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            payload = None
        if not isinstance(payload, dict):
            self.dropped += 1
            return
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
        self._queue.put_nowait(EphemeralMessage(subject_suffix=msg.subject[self._prefix_len :], payload=payload))

    def __aiter__(self) -> EphemeralSubscription:
        return self

    async def __anext__(self) -> EphemeralMessage:
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        self._bus._ephemeral.discard(self)
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:
                pass
            self._sub = None
        while self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(None)
