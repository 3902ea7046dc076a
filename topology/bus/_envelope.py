"""The message envelope every durable channel carries: ``{id, type, v, ts, source, payload}``.

Contract: ``encode`` produces orjson bytes; ``decode`` either returns a fully checked ``Envelope`` of version
``ENVELOPE_VERSION`` or raises ``EnvelopeError`` with a short reason (the dead-letter channel records it): a message
of another version is refused, never read as this one. ``id`` doubles as JetStream's
``Nats-Msg-Id`` so that a re-published id inside the dedupe window is stored once.

Non-goals: payload schemas — those belong to the consumer (``Bus.consume(model=...)``); compression.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from topology.bus._errors import EnvelopeError

__all__ = ["ENVELOPE_VERSION", "Envelope", "decode", "encode", "new_id"]

ENVELOPE_VERSION = 1
_FIELDS = ("id", "type", "v", "ts", "source", "payload")


def new_id() -> str:
    """A fresh message id (32 hex chars)."""
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Envelope:
    id: str  # unique per logical message; JetStream dedupes on it
    type: str  # payload kind, e.g. "prompt", "rollout"
    v: int  # envelope/payload schema version
    ts: float  # unix time at creation (publisher clock)
    source: str  # who published it: "<actor>/<replica>" or a free-form name
    payload: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def new(
        cls,
        type: str,
        payload: Mapping[str, Any],
        *,
        id: str | None = None,
        source: str = "",
        v: int = ENVELOPE_VERSION,
    ) -> Envelope:
        return cls(id=id or new_id(), type=type, v=v, ts=time.time(), source=source, payload=payload)


def encode(env: Envelope) -> bytes:
    """Envelope → orjson bytes. Raises ``EnvelopeError`` when the payload is not JSON-serialisable."""
    try:
        return orjson.dumps(
            {"id": env.id, "type": env.type, "v": env.v, "ts": env.ts, "source": env.source, "payload": env.payload}
        )
    except TypeError as exc:
        raise EnvelopeError(f"payload is not JSON-serialisable: {exc}") from None


def decode(data: bytes) -> Envelope:
    """Bytes → Envelope, checking every field's presence and type; raises ``EnvelopeError(reason)``."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise EnvelopeError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise EnvelopeError(f"envelope must be a JSON object, got {type(obj).__name__}")
    missing = [name for name in _FIELDS if name not in obj]
    if missing:
        raise EnvelopeError(f"envelope is missing field(s): {', '.join(missing)}")
    id_, type_, v, ts, source, payload = (obj[name] for name in _FIELDS)
    if not isinstance(id_, str) or not id_:
        raise EnvelopeError("envelope field 'id' must be a non-empty string")
    if not isinstance(type_, str):
        raise EnvelopeError("envelope field 'type' must be a string")
    if not isinstance(v, int) or isinstance(v, bool):
        raise EnvelopeError("envelope field 'v' must be an integer")
    if v != ENVELOPE_VERSION:  # another schema: read as this one, its fields could mean something else
        raise EnvelopeError(f"envelope version {v} is not {ENVELOPE_VERSION}, the one this consumer reads")
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise EnvelopeError("envelope field 'ts' must be a number")
    if not isinstance(source, str):
        raise EnvelopeError("envelope field 'source' must be a string")
    if not isinstance(payload, dict):
        raise EnvelopeError("envelope field 'payload' must be an object")
    return Envelope(id=id_, type=type_, v=v, ts=float(ts), source=source, payload=payload)
