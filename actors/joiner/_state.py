"""The joiner's state on JetStream KV: served requests, feedback waiting for its request, what was applied.

Three buckets per topology, bounded by time and surviving a joiner restart (or a move to another host) without a
checkpoint of its own: ``traffic`` and ``feedback_applied`` with a TTL of the join window; ``feedback_pending`` with
twice that, for :meth:`JoinState.expire_unmatched` ends each wait at the window, counted, and the TTL only clears what
a joiner that was away for a whole window left behind:

- ``fw_<topology>_traffic``: request id → the traffic record (JSON).
- ``fw_<topology>_feedback_pending``: request id → the first feedback that arrived before its request.
- ``fw_<topology>_feedback_applied``: request id → the feedback that was joined. Its presence is what makes
  repeated feedback count as a repeat: the first applied feedback wins.
- ``fw_<topology>_joiner_totals``: what the joiner counts that no other bucket keeps a trace of, so that a restart
  counts on: ``feedback_unmatched``, how much feedback :meth:`JoinState.expire_unmatched` ever removed (written
  before each removal: a crash between the two counts that one twice, never none). No TTL, one key.

Keys are the request ids when they are valid KV keys, else ``h_<sha256 prefix>`` of them.

``traffic`` and ``feedback_applied`` are written to (by ``create``: a request or a join written again, a redelivery
after a write whose ack was lost, takes no second write) and evicted from, never deleted from, so the writes each took —
its stream's last sequence number, :meth:`JoinState.written` — are the requests stored and the joins made, by every
replica in every life of the joiner, counted once by the server itself.

Each bucket holds at most ``max_pending`` entries. A write that finds its bucket full evicts the oldest entry
first — one whose window has not closed yet: feedback for an evicted request can no longer join (it waits, then
expires), an evicted "applied" mark lets a repeat through — so every eviction is counted (``evicted[what]`` and the
``on_evict`` callback, which the actor turns into the ``<bucket>.evicted`` counters of its heartbeat). The bucket
refuses writes when full (discard new) and the joiner does the evicting, because the server's own "drop the oldest"
would do it silently.

Non-goals: compare-and-set across several joiner replicas beyond ``create`` (first writer wins); the joined
sample's publish id is derived from the request id, so JetStream's dedupe window absorbs a race between them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import nats.js.errors as js_errors
import orjson
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from actors.protocol import join_bucket
from topology.bus import Bus

__all__ = ["JoinState", "kv_key"]

_KEY = re.compile(r"^[-_=a-zA-Z0-9]{1,200}$")
_FULL = 10077  # JetStream: "maximum messages exceeded" (a discard-new stream at its max_msgs)
_MAKE_ROOM_TRIES = 8  # evictions one write may need (other writers may take the room first)
_MARKER = "KV-Operation"  # header of a delete / purge marker (not an entry)
_EXPIRE_PER_CALL = 1000  # unmatched feedback one call of expire_unmatched removes at most (the next call goes on)
_UNMATCHED = "feedback_unmatched"  # the key of the unmatched total in the totals bucket

T = TypeVar("T")


def kv_key(request_id: str) -> str:
    if _KEY.match(request_id):
        return request_id
    return "h_" + hashlib.sha256(request_id.encode()).hexdigest()[:40]


class JoinState:
    """The three buckets of one topology; call :meth:`open` first."""

    def __init__(
        self,
        bus: Bus,
        topology: str,
        *,
        window_s: float,
        max_pending: int,
        on_evict: Callable[[str], None] | None = None,
    ) -> None:
        self._bus = bus
        self.window_s = window_s
        self.max_pending = max_pending
        self.names = {what: join_bucket(topology, what) for what in ("traffic", "feedback_pending", "feedback_applied")}
        self.totals_bucket = join_bucket(topology, "joiner_totals")
        self.evicted = dict.fromkeys(self.names, 0)
        self.unmatched = 0  # feedback expire_unmatched removed, in every life of the joiner (read by open())
        self._on_evict = on_evict
        self._kv: dict[str, KeyValue] = {}
        self._js: JetStreamContext = bus.nc.jetstream()

    async def open(self) -> None:
        for what, bucket in self.names.items():
            ttl_s = self.window_s * (2 if what == "feedback_pending" else 1)
            await self._bus.ensure_kv(bucket, ttl_s=ttl_s)
            self._kv[what] = await self._js.key_value(bucket)
            await self._bound(bucket, ttl_s)
        await self._bus.ensure_kv(self.totals_bucket)
        self.unmatched = int(await self._bus.kv_get(self.totals_bucket, _UNMATCHED) or 0)

    async def _bound(self, bucket: str, ttl_s: float) -> None:
        """At most ``max_pending`` entries per bucket; a write into a full one is refused (and then makes room). The
        TTL is set here too: a bucket made by an older joiner (or with another ``window_s``) takes this one's."""
        info = await self._js.stream_info(f"KV_{bucket}")
        config = info.config
        same_ttl = round(config.max_age or 0.0, 3) == round(ttl_s, 3)
        if config.max_msgs != self.max_pending or config.discard != api.DiscardPolicy.NEW or not same_ttl:
            config.max_msgs = self.max_pending
            config.discard = api.DiscardPolicy.NEW
            config.max_age = ttl_s
            config.duplicate_window = min(config.duplicate_window or ttl_s, ttl_s)  # the server's rule
            await self._js.update_stream(config)

    async def _with_room(self, what: str, write: Callable[[KeyValue], Awaitable[T]]) -> T:
        """``write`` to the bucket (its result), evicting the bucket's oldest entries while it is full."""
        for _ in range(_MAKE_ROOM_TRIES):
            try:
                return await write(self._kv[what])
            except js_errors.APIError as exc:
                if getattr(exc, "err_code", None) != _FULL:
                    raise
            await self._evict_oldest(what)
        return await write(self._kv[what])  # still full: let the error out (the caller naks and retries later)

    async def _evict_oldest(self, what: str) -> None:
        stream = f"KV_{self.names[what]}"
        first = (await self._js.stream_info(stream)).state.first_seq
        try:
            oldest = await self._js.get_msg(stream, seq=first)
        except js_errors.NotFoundError:
            return  # gone meanwhile (expired, or another writer evicted it): there may be room now
        await self._js.purge_stream(stream, subject=oldest.subject)
        if oldest.headers and _MARKER in oldest.headers:
            return  # a delete marker, not an entry: nothing was lost
        self.evicted[what] += 1
        if self._on_evict is not None:
            self._on_evict(what)

    async def expire_unmatched(self, limit: int = _EXPIRE_PER_CALL) -> list[str]:
        """Remove the feedback that has waited the whole window for its request, oldest first (at most ``limit``);
        returns the request ids of those removed (their feedback matched no request the joiner saw), each counted in
        :attr:`unmatched` and its bucket first."""
        stream = f"KV_{self.names['feedback_pending']}"
        horizon = datetime.now(UTC) - timedelta(seconds=self.window_s)
        expired: list[str] = []
        for _ in range(limit):
            state = (await self._js.stream_info(stream)).state
            if not state.messages:
                break
            try:
                oldest = await self._js.get_msg(stream, seq=state.first_seq)
            except js_errors.NotFoundError:
                continue  # joined or removed meanwhile: look again
            if oldest.time is not None and oldest.time > horizon:
                break  # the oldest is still within its window: so is every other
            marker = bool(oldest.headers and _MARKER in oldest.headers)
            if not marker:  # counted before it goes: a restart must not count from 0 (nor lose this one)
                await self._bus.kv_put(self.totals_bucket, _UNMATCHED, str(self.unmatched + 1).encode())
                self.unmatched += 1
            await self._js.purge_stream(stream, subject=oldest.subject)
            if marker:
                continue  # a delete marker, not feedback
            request_id = str(orjson.loads(oldest.data or b"{}").get("feedback", {}).get("request_id", oldest.subject))
            expired.append(request_id)
        return expired

    async def count(self, what: str) -> int:
        """Entries in one bucket now (:meth:`delete` leaves no marker to count)."""
        info = await self._bus.nc.jetstream().stream_info(f"KV_{self.names[what]}")
        return int(info.state.messages)

    async def written(self, what: str) -> int:
        """Writes one bucket ever took, by every replica in every life of the joiner: its stream's last sequence
        number. Each :meth:`create` takes the next one, which stays taken when the entry expires or is evicted; a
        refused write (the bucket full, or a value there already) and :meth:`delete` (a purge, not a marker) take
        none. The server keeps it, so no crash between a write and its count can lose or double one."""
        info = await self._js.stream_info(f"KV_{self.names[what]}")
        return int(info.state.last_seq or 0)

    async def newest(self, what: str, limit: int) -> list[bytes]:
        """The values of up to ``limit`` of the bucket's newest entries, newest first (in the order they were
        written; delete markers skipped). Reads one entry at a time, back from the newest, and looks at no more
        than ``2 × limit`` sequence numbers (purged ones leave gaps)."""
        stream = f"KV_{self.names[what]}"
        state = (await self._js.stream_info(stream)).state
        out: list[bytes] = []
        seq = state.last_seq
        floor = max(state.first_seq, 1, state.last_seq - 2 * limit + 1)
        while seq >= floor and len(out) < limit:
            try:
                entry = await self._js.get_msg(stream, seq=seq)
            except js_errors.NotFoundError:  # purged (evicted, replaced, expired) meanwhile or before
                entry = None
            seq -= 1
            if entry is not None and entry.data and not (entry.headers and _MARKER in entry.headers):
                out.append(entry.data)
        return out

    async def get(self, what: str, request_id: str) -> bytes | None:
        try:
            entry = await self._kv[what].get(kv_key(request_id))
        except (js_errors.KeyNotFoundError, js_errors.KeyDeletedError):
            return None
        return entry.value

    async def create(self, what: str, request_id: str, value: bytes) -> int | None:
        """Put only if absent (or deleted): the write's sequence number in the bucket (see :meth:`written`); None
        when a value is there already."""
        key = kv_key(request_id)
        try:
            return await self._with_room(what, lambda kv: kv.create(key, value))
        except js_errors.KeyWrongLastSequenceError:
            return None
        except js_errors.BadRequestError as exc:
            if "wrong last sequence" in str(exc).lower():
                return None
            raise

    async def delete(self, what: str, request_id: str) -> None:
        """Remove the key and its history without a delete marker: a KV delete leaves a marker message that stays in
        the bucket until the window closes, so :meth:`count` (``feedback_waiting``) would go on counting feedback
        joined long ago, and the marker would take room under ``max_pending``."""
        bucket = self.names[what]
        await self._js.purge_stream(f"KV_{bucket}", subject=f"$KV.{bucket}.{kv_key(request_id)}")
