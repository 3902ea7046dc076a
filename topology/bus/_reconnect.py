"""Reconnects: what a bus connection's users learn when nats-py has reconnected it (after a server restart).

Contract: :meth:`Reconnects.reconnected` is called from nats-py's reconnect callback; it bumps ``count`` and wakes
every task waiting in :meth:`wait`. Users whose server-side state does not survive a restart re-create it then: a
pull consumer re-issues its pull requests at once (they died with the server), a KV watch re-creates its watcher
(its ephemeral consumer may be gone). Core NATS subscriptions need nothing: nats-py re-subscribes them itself.

Non-goals: telling a server restart from a network blip (both are handled the same way).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["Reconnects"]


class Reconnects:
    """Counts reconnects of one connection; ``on_reconnect`` callbacks run synchronously, in registration order."""

    def __init__(self) -> None:
        self.count = 0
        self._event: asyncio.Event | None = None
        self._callbacks: list[Callable[[], None]] = []

    def add_callback(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def remove_callback(self, callback: Callable[[], None]) -> None:
        try:
            self._callbacks.remove(callback)
        except ValueError:
            pass

    def reconnected(self) -> None:
        self.count += 1
        for callback in list(self._callbacks):
            callback()
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self, since: int) -> None:
        """Until ``count`` is above ``since`` (returns at once when it already is)."""
        while self.count <= since:
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()
