"""BusStats: plain in-process counters for one ``Bus`` connection (reported in actor heartbeats).

Not thread-safe by design: a Bus lives on one event loop.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["BusStats"]


@dataclass
class BusStats:
    published: int = 0  # durable messages acknowledged by JetStream (duplicates included)
    duplicates: int = 0  # ... of which JetStream reported as duplicates of an earlier id
    delivered: int = 0  # deliveries handed to a consumer (redeliveries included)
    redelivered: int = 0  # ... of which had been delivered before (num_delivered > 1)
    acked: int = 0
    naked: int = 0
    dead_lettered: int = 0  # messages sent to the dead-letter channel (poison, handler verdict, max_deliver)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
