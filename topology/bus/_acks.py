"""Pipelined JetStream publishing with one reply subscription and one future per batch, not per message.

nats-py's ``publish_async`` spends most of a small message's publish cost on bookkeeping: per message a
semaphore wait under ``wait_for``, a random token, a future with a done callback, and on the way back a
``json.loads`` plus a ``PubAck`` dataclass. :class:`AckTracker` keeps the wire protocol exactly as it is
(each message is an ``HPUB`` with its own reply subject, and JetStream answers each with its stored sequence
or an error) and only does the bookkeeping per batch: reply subjects are ``<inbox>.<n>`` with a counter, the
reply handler settles a count, and it reads the JSON only when an answer is not a plain success (an error, or a
duplicate).

Contract:
- :meth:`AckTracker.publish` sends every ``(subject, data, headers)`` and returns once JetStream answered
  every one: the number of duplicates it reported (a ``Nats-Msg-Id`` seen inside the dedupe window). It raises
  ``PublishError`` with the first error JetStream answered (or "no responders": no stream on the subject), and
  ``TimeoutError`` when an answer is missing after ``timeout_s``. Messages of a failed batch may have been
  stored: the caller republishes with the same ids and dedupe keeps one copy.
- :meth:`AckTracker.connection_lost` (called when the connection was re-made: a server restart) fails every batch
  still waiting with :class:`AcksLost` at once: the answers to what the old server received died with it, and
  would only have timed out. The caller sends the batch again.
- Late answers of a batch that already failed or timed out are ignored.

Non-goals: flow control beyond the batch (callers bound the batch size), retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

__all__ = ["AckTracker", "AcksLost", "PublishError"]

_DUPLICATE = b'"duplicate"'  # then the JSON is read: the server writes `"duplicate": true`
_ERROR = b'"error":{'  # a key, never inside a JSON string (its quotes would be escaped there)
_NO_RESPONDERS = "503"


class PublishError(Exception):
    """JetStream refused a message (or nothing stores its subject)."""


class AcksLost(TimeoutError):
    """The connection was re-made while a batch waited: its missing answers will never come."""


@dataclass(eq=False, slots=True)
class _Batch:
    remaining: int
    done: asyncio.Future[int]
    duplicates: int = 0
    tokens: list[str] = field(default_factory=list)


class AckTracker:
    """One per connection: a wildcard reply subscription and the batches waiting on it."""

    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._prefix = ""
        self._next = 0
        self._waiting: dict[str, _Batch] = {}
        self._sub: Any = None
        self._lock = asyncio.Lock()

    async def _ensure(self) -> str:
        if not self._prefix:
            async with self._lock:
                if not self._prefix:
                    prefix = self._nc.new_inbox() + "."
                    self._sub = await self._nc.subscribe(prefix + "*", cb=self._on_reply)
                    self._prefix = prefix
        return self._prefix

    async def publish(
        self, messages: Sequence[tuple[str, bytes | memoryview, dict[str, str] | None]], *, timeout_s: float
    ) -> int:
        """Send ``messages`` pipelined; the number of duplicates once every one is acknowledged (see module)."""
        if not messages:
            return 0
        prefix = await self._ensure()
        batch = _Batch(len(messages), asyncio.get_running_loop().create_future())
        publish, waiting = self._nc.publish, self._waiting
        try:
            for subject, data, headers in messages:
                token = str(self._next)
                self._next += 1
                waiting[token] = batch
                batch.tokens.append(token)
                # nats-py concatenates the payload into its command: any bytes-like object will do
                await publish(subject, data, reply=prefix + token, headers=headers)  # type: ignore[arg-type]
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(batch.done)
        finally:
            for token in batch.tokens:
                waiting.pop(token, None)
            if not batch.done.done():
                batch.done.cancel()

    def connection_lost(self) -> None:
        """Fail every batch still waiting for answers (see the module docstring)."""
        for batch in set(self._waiting.values()):
            if not batch.done.done():
                batch.done.set_exception(AcksLost("the connection to the server was re-made while acks were due"))

    async def _on_reply(self, msg: Msg) -> None:
        batch = self._waiting.pop(msg.subject[len(self._prefix) :], None)
        if batch is None or batch.done.done():
            return
        data = msg.data
        if not data:  # a status message: 503 = no responders (no stream has this subject)
            status = (msg.headers or {}).get("Status", "")
            why = "no stream stores this subject" if status == _NO_RESPONDERS else f"status {status or '?'}"
            batch.done.set_exception(PublishError(why))
            return
        if _ERROR in data:
            batch.done.set_exception(PublishError(_describe_error(data)))
            return
        if _DUPLICATE in data and _is_duplicate(data):
            batch.duplicates += 1
        batch.remaining -= 1
        if batch.remaining == 0:
            batch.done.set_result(batch.duplicates)


def _is_duplicate(data: bytes) -> bool:
    try:
        return orjson.loads(data).get("duplicate") is True
    except (orjson.JSONDecodeError, AttributeError):
        return False


def _describe_error(data: bytes) -> str:
    try:
        error = orjson.loads(data).get("error") or {}
        return f"{error.get('description', 'error')} (code {error.get('code')}, err_code {error.get('err_code')})"
    except (orjson.JSONDecodeError, AttributeError):
        return data.decode("utf-8", errors="replace")[:200]
