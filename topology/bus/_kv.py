"""Shared state on JetStream: key-value buckets (e.g. the current weight version) and object stores (blobs).

Contract: buckets are created on first use (``history`` 1 unless ``ensure_kv`` said otherwise); values are
bytes; ``get`` of a missing or deleted key is ``None``; ``watch`` yields the current value (if any) and then
every new value of the key — deletes are skipped — and rides out a server restart: on reconnect it re-creates its
watcher and goes on from the last revision it yielded (a value is never yielded twice, one written while the
server was away is not missed); a ``put`` waiting for its answer when the server restarted is written again.
Object store puts chunk large blobs (1 MiB chunks) and ``get`` returns the whole blob, checked against the SHA-256
digest nats-py recorded at put time; passing ``expect_digest`` (the digest ``object_put`` returned) also rejects
an object that was replaced since.

Non-goals: typed values (callers encode), compare-and-set (use nats-py's ``KeyValue.update`` directly).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import nats.errors
import nats.js.errors as js_errors
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from nats.nuid import NUID

from topology.bus._acks import AckTracker
from topology.bus._errors import BusError
from topology.bus._reconnect import Reconnects

__all__ = ["Stores"]

_OBJECT_CHUNK = 1024 * 1024
_CHUNKS_IN_FLIGHT = 16  # chunks sent before their store acks are awaited, and pulled per request
_CHUNK_TIMEOUT_S = 30.0
_NUID = NUID()
STALL_S = 10.0  # an object read without a new chunk for this long has lost its object
_WATCH_RETRY_S = 0.5  # a watcher that cannot be created (the server is away) is tried again this often


class Stores:
    """Per-connection cache of KV buckets and object stores."""

    def __init__(self, js: JetStreamContext, acks: AckTracker, reconnects: Reconnects | None = None) -> None:
        self._js = js
        self._acks = acks
        self._reconnects = reconnects or Reconnects()
        self._kv: dict[str, KeyValue] = {}
        self._obj: dict[str, ObjectStore] = {}

    async def kv(self, bucket: str, *, history: int = 1, ttl_s: float | None = None) -> KeyValue:
        found = self._kv.get(bucket)
        if found is not None:
            return found
        if not 1 <= history <= 64:
            raise ValueError(f"history: expected an integer in 1..64, got {history!r}")
        try:
            kv = await self._js.key_value(bucket)
        except js_errors.BucketNotFoundError:
            try:
                kv = await self._js.create_key_value(api.KeyValueConfig(bucket=bucket, history=history, ttl=ttl_s))
            except js_errors.InvalidBucketNameError:
                raise BusError(f"invalid KV bucket name {bucket!r}: use letters, digits, '-' and '_'") from None
            except js_errors.BadRequestError:  # created concurrently by a peer
                kv = await self._js.key_value(bucket)
        except js_errors.InvalidBucketNameError:
            raise BusError(f"invalid KV bucket name {bucket!r}: use letters, digits, '-' and '_'") from None
        self._kv[bucket] = kv
        return kv

    async def put(self, bucket: str, key: str, value: bytes) -> int:
        """Write ``value``; its revision. A put whose answer was due when the server restarted is written again
        once the connection is back (the answer died with the old server): a key may then hold the value twice
        over, never a value the caller did not write."""
        kv = await self.kv(bucket)
        while True:
            generation = self._reconnects.count
            put = asyncio.ensure_future(kv.put(key, value))
            reconnected = asyncio.ensure_future(self._reconnects.wait(generation))
            try:
                await asyncio.wait([put, reconnected], return_when=asyncio.FIRST_COMPLETED)
            finally:
                reconnected.cancel()
                if not put.done():
                    put.cancel()  # reconnected first (or we were cancelled): its answer may never come
            if put.done() and not put.cancelled():
                try:
                    return put.result()
                except js_errors.InvalidKeyError:
                    raise BusError(f"invalid KV key {key!r} for bucket {bucket!r}") from None

    async def get(self, bucket: str, key: str) -> bytes | None:
        kv = await self.kv(bucket)
        try:
            entry = await kv.get(key)
        except (js_errors.KeyNotFoundError, js_errors.KeyDeletedError):
            return None
        return entry.value

    async def items(self, bucket: str) -> dict[str, bytes]:
        kv = await self.kv(bucket)
        try:
            keys = await kv.keys()
        except js_errors.NoKeysError:
            return {}
        out: dict[str, bytes] = {}
        for key in keys:
            value = await self.get(bucket, key)
            if value is not None:
                out[key] = value
        return out

    async def watch(self, bucket: str, key: str) -> AsyncIterator[bytes]:
        kv = await self.kv(bucket)
        last = 0  # revision of the last value yielded
        while True:
            generation = self._reconnects.count
            try:
                watcher = await kv.watch(key, ignore_deletes=True)
            except (nats.errors.Error, js_errors.Error, TimeoutError):  # the server is away: try again
                await asyncio.sleep(_WATCH_RETRY_S)
                continue
            reconnected: asyncio.Future[object] = asyncio.ensure_future(self._reconnects.wait(generation))
            pending: list[asyncio.Future[object]] = []
            try:
                while not reconnected.done():
                    update: asyncio.Future[object] = asyncio.ensure_future(watcher._updates.get())
                    pending = [update]
                    await asyncio.wait([update, reconnected], return_when=asyncio.FIRST_COMPLETED)
                    if not update.done():
                        break  # reconnected: the watcher's consumer may be gone with the old server
                    entry = update.result()
                    if not isinstance(entry, KeyValue.Entry | None):
                        break  # the watcher was stopped
                    if entry is None or entry.value is None or entry.operation is not None:
                        continue  # the "initial values done" marker, or a delete/purge
                    if entry.revision is not None and entry.revision <= last:
                        continue  # seen before the watcher was re-created
                    last = entry.revision or last
                    yield entry.value
            finally:
                reconnected.cancel()
                for future in pending:
                    future.cancel()
                try:
                    await watcher.stop()  # type: ignore[no-untyped-call]
                except Exception:
                    pass

    async def objects(self, bucket: str) -> ObjectStore:
        found = self._obj.get(bucket)
        if found is not None:
            return found
        try:
            store = await self._js.object_store(bucket)
        except js_errors.BucketNotFoundError:
            try:
                store = await self._js.create_object_store(bucket)
            except js_errors.BadRequestError:
                store = await self._js.object_store(bucket)
        except js_errors.InvalidBucketNameError:
            raise BusError(f"invalid object store name {bucket!r}: use letters, digits, '-' and '_'") from None
        self._obj[bucket] = store
        return store

    async def object_put(self, bucket: str, name: str, data: bytes | bytearray | memoryview) -> tuple[int, str]:
        """Store ``data``; returns its size and the SHA-256 digest recorded in the object's info.

        The object store's own layout (chunks on ``$O.<bucket>.C.<nuid>``, then the info on the name's meta
        subject, a rollup), so any NATS client reads it. Unlike nats-py's ``put``, which awaits each chunk's store
        ack before it sends the next, the chunks go out pipelined (``_CHUNKS_IN_FLIGHT`` at a time), and the digest
        is computed in a thread meanwhile.
        """
        store = await self.objects(bucket)
        view = memoryview(data).cast("B")
        digest = asyncio.ensure_future(asyncio.to_thread(lambda: hashlib.sha256(view).digest()))
        nuid = _NUID.next().decode()
        chunk_subject = f"$O.{bucket}.C.{nuid}"
        try:
            previous = await store.get_info(name)
        except js_errors.NotFoundError:
            previous = None
        chunks = [view[i : i + _OBJECT_CHUNK] for i in range(0, len(view), _OBJECT_CHUNK)]
        try:
            for lo in range(0, len(chunks), _CHUNKS_IN_FLIGHT):
                batch = chunks[lo : lo + _CHUNKS_IN_FLIGHT]
                await self._acks.publish([(chunk_subject, chunk, None) for chunk in batch], timeout_s=_CHUNK_TIMEOUT_S)
            info = api.ObjectInfo(
                name=name,
                bucket=bucket,
                nuid=nuid,
                size=len(view),
                chunks=len(chunks),
                mtime=datetime.now(UTC).isoformat(),
                digest="SHA-256=" + base64.urlsafe_b64encode(await digest).decode(),
                options=api.ObjectMetaOptions(max_chunk_size=_OBJECT_CHUNK),
            )
            meta_subject = f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"
            await self._js.publish(meta_subject, json.dumps(info.as_dict()).encode(), headers={"Nats-Rollup": "sub"})
        except Exception:
            await self._js.purge_stream(f"OBJ_{bucket}", subject=chunk_subject)
            raise
        finally:
            if not digest.done():
                await asyncio.wait({digest})
        if previous is not None and not previous.deleted:
            await self._js.purge_stream(f"OBJ_{bucket}", subject=f"$O.{bucket}.C.{previous.nuid}")
        return len(view), str(info.digest)

    async def object_info(self, bucket: str, name: str) -> tuple[int, str]:
        store = await self.objects(bucket)
        try:
            info = await store.get_info(name)
        except js_errors.NotFoundError:
            raise BusError(f"object {name!r} not found in object store {bucket!r}") from None
        return int(info.size or 0), str(info.digest or "")

    async def object_get(
        self, bucket: str, name: str, *, expect_digest: str | None = None, stall_s: float = STALL_S
    ) -> bytearray:
        """The object's bytes. Chunks are pulled in batches (nats-py's ``get`` reads them through a flow-controlled
        push consumer, one round trip per few chunks) into one buffer, the digest computed in a thread meanwhile. A
        read that receives no chunk for ``stall_s`` fails (``BusError``): an object deleted while it is read."""
        store = await self.objects(bucket)
        try:
            info = await store.get_info(name)
        except js_errors.NotFoundError:
            raise BusError(f"object {name!r} not found in object store {bucket!r}") from None
        if expect_digest is not None and str(info.digest or "") != expect_digest:
            raise BusError(
                f"object {name!r} in {bucket!r} was replaced: digest {info.digest}, expected {expect_digest}"
            )
        size, count = int(info.size or 0), int(info.chunks or 0)
        blob = bytearray(size)
        view = memoryview(blob)
        hasher = hashlib.sha256()
        hashing = ThreadPoolExecutor(1, thread_name_prefix="object-digest")  # one thread: updates stay in order
        loop = asyncio.get_running_loop()
        last: asyncio.Future[None] | None = None
        subscription = None
        offset = received = 0
        try:
            if count:
                config = api.ConsumerConfig(
                    ack_policy=api.AckPolicy.NONE,
                    deliver_policy=api.DeliverPolicy.ALL,
                    inactive_threshold=max(stall_s, 5.0),
                    num_replicas=1,
                    mem_storage=True,
                )
                subscription = await self._js.pull_subscribe(
                    f"$O.{bucket}.C.{info.nuid}", stream=f"OBJ_{bucket}", config=config
                )
            while received < count:
                want = min(_CHUNKS_IN_FLIGHT, count - received)
                try:
                    messages = await subscription.fetch(want, timeout=stall_s)  # type: ignore[union-attr]
                except (TimeoutError, nats.errors.TimeoutError):
                    raise BusError(
                        f"reading object {name!r} from {bucket!r} stalled: no data for {stall_s:g} s "
                        "(deleted while it was being read?)"
                    ) from None
                for message in messages:
                    chunk = message.data
                    end = offset + len(chunk)
                    if end > size:
                        raise BusError(f"object {name!r} in {bucket!r} has more bytes than its info says (corrupted)")
                    view[offset:end] = chunk
                    last = loop.run_in_executor(hashing, hasher.update, view[offset:end])
                    offset, received = end, received + 1
            if last is not None:
                await last
        finally:
            hashing.shutdown(wait=True)
            if subscription is not None:
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()
        digest = "SHA-256=" + base64.urlsafe_b64encode(hasher.digest()).decode()
        if offset != size or digest != str(info.digest or ""):
            raise BusError(f"object {name!r} in {bucket!r} does not match its digest (corrupted)")
        return blob

    async def object_delete(self, bucket: str, name: str) -> bool:
        """Delete an object; ``False`` when it was not there (deleting is idempotent)."""
        store = await self.objects(bucket)
        try:
            await store.delete(name)
        except js_errors.NotFoundError:
            return False
        return True
