"""The deliveries a consumer is working on: their ack timers kept reset, and a redelivery of one recognised.

Why: a handler that outlasts the bus's ``ack_wait_s`` (a slow inference server, a user's verifier near its limit, a
server that is down while the client retries) has its message redelivered while it still works on it — to itself,
where a second handler of the same message would do the work twice (and trip per-message bookkeeping), or to a
sibling replica. ``keepalive`` resets the ack timer of everything in flight; a redelivery that comes anyway (the
keepalive lost on a bus that was away) is recognised by ``begin`` and recorded instead of handled, and the handler
settles the newest delivery (``newest``), whose reply subject the server is waiting on.

Contract: ``begin(delivery)`` is True when the caller should handle it (nothing of that id is in flight) and False
when it is a redelivery of one in flight (kept as the newest, counted by the caller); every begun delivery is ended
with ``end(id)`` once settled. ``keepalive()`` runs until cancelled.

Non-goals: deliveries of other consumers; ordering.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio

from topology.bus._consumer import Delivery

__all__ = ["InFlight"]

_KEEPALIVE_S_MAX = 10.0  # the ack timer of every delivery in flight is reset at least this often
P = TypeVar("P")


class InFlight(Generic[P]):
    """The deliveries of one consumer being handled, by message id → the newest delivery (see the module docstring)."""

    def __init__(self, ack_wait_s: float, *, on_failure: Callable[[Exception], Any] | None = None) -> None:
        self.every_s = min(_KEEPALIVE_S_MAX, ack_wait_s / 3)
        self._deliveries: dict[str, Delivery[P]] = {}
        self._on_failure = on_failure  # told when a keepalive could not be sent (the bus is away)

    def __contains__(self, message_id: str) -> bool:
        return message_id in self._deliveries

    def __len__(self) -> int:
        return len(self._deliveries)

    def begin(self, delivery: Delivery[P]) -> bool:
        """Whether to handle ``delivery``: False when its message is in flight already (it becomes the newest)."""
        redelivered = delivery.id in self._deliveries
        self._deliveries[delivery.id] = delivery
        return not redelivered

    def newest(self, delivery: Delivery[P]) -> Delivery[P]:
        """The newest delivery of ``delivery``'s message: the one to settle."""
        return self._deliveries.get(delivery.id, delivery)

    def end(self, message_id: str) -> None:
        self._deliveries.pop(message_id, None)

    async def keepalive(self) -> None:
        """Reset the ack timer of every delivery in flight every ``every_s``, until cancelled."""
        while True:
            await anyio.sleep(self.every_s)
            for delivery in list(self._deliveries.values()):
                try:
                    await delivery.in_progress()
                except Exception as exc:  # a lost keepalive means a redelivery later, which begin() recognises
                    if self._on_failure is not None:
                        self._on_failure(exc)
                    break
