"""The first rating of each request, as the gateways and ``flywheel review`` took it: what lets ``/v1/feedback``
answer a second one as a duplicate.

Contract: :meth:`FirstRatings.claim` records a digest of a request's rating (:func:`rating_digest`) in the topology's
``rated_bucket`` when it holds none for that request (JetStream KV ``create``: of two raters of one request at once,
one wins), and says whether the rating is the first one — or the same rating again (a client's retry of the first,
which answers as the first did). :meth:`FirstRatings.release` takes a claim back when the rating could not be stored
after all, so a retry is not called a duplicate of a rating nobody kept. Entries live as long as the joiner's window
(after it, no rating of the request can join any more) and at most the joiner's ``max_pending`` of them (the oldest go
first: a second rating of such an old request is answered as a first one, and the joiner still counts it as a repeat).

The gateways make the bucket (:meth:`FirstRatings.open`, sized by the joiner's window); ``flywheel review`` claims in
the bucket they made (:meth:`FirstRatings.existing`): a reviewer's label is a first rating like a user's, so a user's
rating after it is answered as a duplicate, and the other way round. A reviewer's digest is never a user's
(``source``), so a user's rating is never taken for a retry of a reviewer's label.

Non-goals: ratings that reach ``feedback`` by any other way: the joiner's "first applied wins" is what decides which
rating trains; this answer is the raters' view of it.
"""

from __future__ import annotations

import hashlib

import nats.js.errors as js_errors
import orjson
from nats.js.kv import KeyValue

from actors.protocol._names import rated_bucket
from topology.bus import Bus

__all__ = ["FirstRatings", "rating_digest"]


def _key(request_id: str) -> str:
    return "r_" + hashlib.sha256(request_id.encode()).hexdigest()[:40]  # any request id, a valid KV key


def rating_digest(
    request_id: str, score: float, label: str | None, comment: str = "", *, source: str | None = None
) -> str:
    """What :meth:`FirstRatings.claim` records of one rating: the same rating sent again has the same digest. A
    ``source`` (``flywheel review``'s) sets its ratings apart from a user's identical one, which is no retry of it."""
    parts: list[object] = [request_id, score, label, comment]
    if source is not None:
        parts.insert(0, source)
    return hashlib.sha256(orjson.dumps(parts)).hexdigest()[:32]


class FirstRatings:
    """Call :meth:`open` first (or build one with :meth:`existing`)."""

    def __init__(self, bus: Bus, topology: str, *, window_s: float, max_entries: int) -> None:
        self._bus = bus
        self.bucket = rated_bucket(topology)
        self.window_s = window_s
        self.max_entries = max_entries
        self._kv: KeyValue | None = None

    async def open(self) -> None:
        """Make the bucket (or take it over), bounded by ``window_s`` and ``max_entries``."""
        await self._bus.ensure_kv(self.bucket, ttl_s=self.window_s)
        js = self._bus.nc.jetstream()
        config = (await js.stream_info(f"KV_{self.bucket}")).config
        if config.max_msgs != self.max_entries:
            config.max_msgs = self.max_entries  # the oldest make room (see the module docstring)
            await js.update_stream(config)
        self._kv = await js.key_value(self.bucket)

    @classmethod
    async def existing(cls, bus: Bus, topology: str) -> FirstRatings | None:
        """The ledger the topology's gateways keep, as they sized it; None when they keep none (no gateway whose
        answers it decides has made it, or the topology has no joiner)."""
        ratings = cls(bus, topology, window_s=0.0, max_entries=0)
        js = bus.nc.jetstream()
        try:
            config = (await js.stream_info(f"KV_{ratings.bucket}")).config
        except js_errors.NotFoundError:
            return None
        ratings.window_s, ratings.max_entries = float(config.max_age or 0.0), int(config.max_msgs or 0)
        ratings._kv = await js.key_value(ratings.bucket)
        return ratings

    async def claim(self, request_id: str, digest: str) -> bool:
        """Whether ``digest`` is the request's first rating (or that one again); records it when none is."""
        assert self._kv is not None, "open() first"
        key = _key(request_id)
        try:
            await self._kv.create(key, digest.encode())
            return True
        except js_errors.KeyWrongLastSequenceError:
            pass
        except js_errors.BadRequestError as exc:
            if "wrong last sequence" not in str(exc).lower():
                raise
        try:
            entry = await self._kv.get(key)
        except (js_errors.KeyNotFoundError, js_errors.KeyDeletedError):
            return await self.claim(request_id, digest)  # released meanwhile: try again
        return entry.value == digest.encode()

    async def release(self, request_id: str, digest: str) -> None:
        """Take back a claim of ``digest`` (its rating was not stored); another rating's claim stays."""
        assert self._kv is not None, "open() first"
        key = _key(request_id)
        try:
            entry = await self._kv.get(key)
        except (js_errors.KeyNotFoundError, js_errors.KeyDeletedError):
            return
        if entry.value == digest.encode():
            await self._kv.delete(key, last=entry.revision)
