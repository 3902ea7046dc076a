"""Shared state on JetStream: key-value buckets (e.g. the current weight version) and object stores (blobs).

Contract: buckets are created on first use (``history`` 1 unless ``ensure_kv`` said otherwise); values are
bytes; ``get`` of a missing or deleted key is ``None``; ``watch`` yields the current value (if any) and then
every new value of the key — deletes are skipped — and rides out a server restart: on reconnect it re-creates its
watcher and goes on from the last revision it yielded (a value is never yielded twice, one written while the
server was away is not missed). Object store puts chunk large blobs (1 MiB chunks) and
``get`` returns the whole blob, checked against the SHA-256 digest nats-py recorded at put time; passing
``expect_digest`` (the digest ``object_put`` returned) also rejects an object that was replaced since.

Non-goals: typed values (callers encode), compare-and-set (use nats-py's ``KeyValue.update`` directly).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import nats.errors
import nats.js.errors as js_errors
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from topology.bus._errors import BusError
from topology.bus._reconnect import Reconnects

__all__ = ["Stores"]

_OBJECT_CHUNK = 1024 * 1024
STALL_S = 10.0  # an object read without a new chunk for this long has lost its object
_WATCH_RETRY_S = 0.5  # a watcher that cannot be created (the server is away) is tried again this often


class Stores:
    """Per-connection cache of KV buckets and object stores."""

    def __init__(self, js: JetStreamContext, reconnects: Reconnects | None = None) -> None:
        self._js = js
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
        kv = await self.kv(bucket)
        try:
            return await kv.put(key, value)
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

    async def object_put(self, bucket: str, name: str, data: bytes) -> tuple[int, str]:
        """Store ``data``; returns its size and the SHA-256 digest the object store recorded."""
        store = await self.objects(bucket)
        meta = api.ObjectMeta(name=name, options=api.ObjectMetaOptions(max_chunk_size=_OBJECT_CHUNK))
        info = await store.put(name, data, meta=meta)
        return int(info.size or 0), str(info.digest or "")

    async def object_get(
        self, bucket: str, name: str, *, expect_digest: str | None = None, stall_s: float = STALL_S
    ) -> bytes:
        """The object's bytes. A read that receives no chunk for ``stall_s`` fails (``BusError``): nats-py waits
        forever for the chunks of an object deleted while it is being read."""
        store = await self.objects(bucket)
        sink = _Sink()
        # writeinto: nats-py otherwise grows one bytes object chunk by chunk (quadratic for large blobs)
        reading = asyncio.ensure_future(store.get(name, writeinto=sink))  # type: ignore[arg-type]
        try:
            while not reading.done():
                await asyncio.wait({reading}, timeout=min(stall_s, 1.0))
                if not reading.done() and time.monotonic() - sink.last_write > stall_s:
                    raise BusError(
                        f"reading object {name!r} from {bucket!r} stalled: no data for {stall_s:g} s "
                        "(deleted while it was being read?)"
                    )
            result = reading.result()
        except js_errors.ObjectNotFoundError:
            raise BusError(f"object {name!r} not found in object store {bucket!r}") from None
        except js_errors.DigestMismatchError:
            raise BusError(f"object {name!r} in {bucket!r} does not match its digest (corrupted)") from None
        finally:
            if not reading.done():
                reading.cancel()
        if expect_digest is not None and str(result.info.digest or "") != expect_digest:
            raise BusError(
                f"object {name!r} in {bucket!r} was replaced: digest {result.info.digest}, expected {expect_digest}"
            )
        return sink.getvalue()

    async def object_delete(self, bucket: str, name: str) -> bool:
        """Delete an object; ``False`` when it was not there (deleting is idempotent)."""
        store = await self.objects(bucket)
        try:
            await store.delete(name)
        except js_errors.NotFoundError:
            return False
        return True


class _Sink:
    """Collects object chunks; one join at the end instead of a copy per chunk."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self.last_write = time.monotonic()  # progress, for the stall check (chunks are written from a thread)

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        self.last_write = time.monotonic()
        return len(data)

    def getvalue(self) -> bytes:
        return b"".join(self._parts)
