"""Errors raised by the bus package.

Every error carries a one-line message meant for a user (it names the URL, channel or bucket involved);
callers print ``str(error)`` rather than a traceback.
"""

from __future__ import annotations

__all__ = ["BusError", "EnvelopeError"]


class BusError(Exception):
    """The bus could not do what was asked (connect, create a stream, publish, start the server)."""


class EnvelopeError(ValueError):
    """Bytes that are not a valid envelope; ``reason`` says why (goes to the dead-letter channel)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
