"""The first rating of each request, as the gateways took it: what lets ``/v1/feedback`` answer a second one as a
duplicate.

Contract: :meth:`FirstRatings.claim` records a digest of a request's rating in the topology's ``rated_bucket`` when it
holds none for that request (JetStream KV ``create``: of two gateways rating one request at once, one wins), and says
whether the rating is the first one — or the same rating again (a client's retry of the first, which answers as the
first did). :meth:`FirstRatings.release` takes a claim back when the rating could not be stored after all, so a
retry is not called a duplicate of a rating nobody kept. Entries live as long as the joiner's window (after it, no
rating of the request can join any more) and at most the joiner's ``max_pending`` of them (the oldest go first: a
second rating of such an old request is answered as a first one, and the joiner still counts it as a repeat).

Non-goals: ratings that reach ``feedback`` other than through a gateway (``flywheel review``'s labels): the joiner's
"first applied wins" is what decides which rating trains; this answer is the gateways' view of it.
"""

from __future__ import annotations

import hashlib

import nats.js.errors as js_errors
from nats.js.kv import KeyValue

from actors.protocol import rated_bucket
from topology.bus import Bus

__all__ = ["FirstRatings"]


def _key(request_id: str) -> str:
    return "r_" + hashlib.sha256(request_id.encode()).hexdigest()[:40]  # any request id, a valid KV key


class FirstRatings:
    """Call :meth:`open` first."""

    def __init__(self, bus: Bus, topology: str, *, window_s: float, max_entries: int) -> None:
        self._bus = bus
        self.bucket = rated_bucket(topology)
        self.window_s = window_s
        self.max_entries = max_entries
        self._kv: KeyValue | None = None

    async def open(self) -> None:
        await self._bus.ensure_kv(self.bucket, ttl_s=self.window_s)
        js = self._bus.nc.jetstream()
        config = (await js.stream_info(f"KV_{self.bucket}")).config
        if config.max_msgs != self.max_entries:
            config.max_msgs = self.max_entries  # the oldest make room (see the module docstring)
            await js.update_stream(config)
        self._kv = await js.key_value(self.bucket)

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
