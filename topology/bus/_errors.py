"""Errors raised by the bus package.

Every error carries a one-line message meant for a user (it names the URL, channel or bucket involved);
callers print ``str(error)`` rather than a traceback.
"""

from __future__ import annotations

import nats.errors

__all__ = ["BUS_AWAY", "BusError", "EnvelopeError"]


class BusError(Exception):
    """The bus could not do what was asked (connect, create a stream, publish, start the server)."""


class EnvelopeError(ValueError):
    """Bytes that are not a valid envelope; ``reason`` says why (goes to the dead-letter channel)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# what a request to the bus raises while its server is away (restarting, or frozen): a caller that can wait catches
# these and tries again later instead of crashing (a publish's BusError, a KV request's nats timeout)
BUS_AWAY: tuple[type[Exception], ...] = (BusError, nats.errors.Error, TimeoutError)
