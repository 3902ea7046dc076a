"""The joiner's state on JetStream KV: served requests, feedback waiting for its request, what was applied.

Three buckets per topology, all with a TTL of the join window, so the state is bounded by time and survives
a joiner restart (or a move to another host) without a checkpoint of its own:

- ``fw_<topology>_traffic``: request id → the traffic record (JSON); ``max_pending`` bounds the number of
  records (the oldest are dropped first).
- ``fw_<topology>_feedback_pending``: request id → the first feedback that arrived before its request.
- ``fw_<topology>_feedback_applied``: request id → the feedback that was joined. Its presence is what makes
  repeated feedback count as a repeat: the first applied feedback wins.

Keys are the request ids when they are valid KV keys, else ``h_<sha256 prefix>`` of them.

Non-goals: compare-and-set across several joiner replicas beyond ``create`` (first writer wins); the joined
sample's publish id is derived from the request id, so JetStream's dedupe window absorbs a race between them.
"""

from __future__ import annotations

import hashlib
import re

import nats.js.errors as js_errors
from nats.js import api
from nats.js.kv import KeyValue

from actors.protocol import join_bucket
from topology.bus import Bus

__all__ = ["JoinState", "kv_key"]

_KEY = re.compile(r"^[-_=a-zA-Z0-9]{1,200}$")


def kv_key(request_id: str) -> str:
    if _KEY.match(request_id):
        return request_id
    return "h_" + hashlib.sha256(request_id.encode()).hexdigest()[:40]


class JoinState:
    """The three buckets of one topology; call :meth:`open` first."""

    def __init__(self, bus: Bus, topology: str, *, window_s: float, max_pending: int) -> None:
        self._bus = bus
        self.window_s = window_s
        self.max_pending = max_pending
        self.names = {what: join_bucket(topology, what) for what in ("traffic", "feedback_pending", "feedback_applied")}
        self._kv: dict[str, KeyValue] = {}

    async def open(self) -> None:
        js = self._bus.nc.jetstream()
        for what, bucket in self.names.items():
            await self._bus.ensure_kv(bucket, ttl_s=self.window_s)
            self._kv[what] = await js.key_value(bucket)
            await self._bound(js, bucket)

    async def _bound(self, js: object, bucket: str) -> None:
        """At most ``max_pending`` entries per bucket, dropping the oldest (KV buckets default to refusing)."""
        from nats.js import JetStreamContext

        assert isinstance(js, JetStreamContext)
        info = await js.stream_info(f"KV_{bucket}")
        config = info.config
        if config.max_msgs != self.max_pending or config.discard != api.DiscardPolicy.OLD:
            config.max_msgs = self.max_pending
            config.discard = api.DiscardPolicy.OLD
            await js.update_stream(config)

    async def count(self, what: str) -> int:
        """Entries in one bucket now (deleted keys' markers included until they expire)."""
        info = await self._bus.nc.jetstream().stream_info(f"KV_{self.names[what]}")
        return int(info.state.messages)

    async def get(self, what: str, request_id: str) -> bytes | None:
        try:
            entry = await self._kv[what].get(kv_key(request_id))
        except (js_errors.KeyNotFoundError, js_errors.KeyDeletedError):
            return None
        return entry.value

    async def put(self, what: str, request_id: str, value: bytes) -> None:
        await self._kv[what].put(kv_key(request_id), value)

    async def create(self, what: str, request_id: str, value: bytes) -> bool:
        """Put only if absent (or deleted); False when a value is there already."""
        try:
            await self._kv[what].create(kv_key(request_id), value)
        except js_errors.KeyWrongLastSequenceError:
            return False
        except js_errors.BadRequestError as exc:
            if "wrong last sequence" in str(exc).lower():
                return False
            raise
        return True

    async def delete(self, what: str, request_id: str) -> None:
        try:
            await self._kv[what].delete(kv_key(request_id))
        except js_errors.KeyNotFoundError:
            pass
