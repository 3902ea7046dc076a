"""BusStats: plain in-process counters for one ``Bus`` connection (reported in actor heartbeats).

Not thread-safe by design: a Bus lives on one event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

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
    # ... of which by (consumer group, channel): a replica reports its own group's (one bus may serve several)
    dead_lettered_by: dict[tuple[str, str], int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        """The totals (not the breakdown by group)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "dead_lettered_by"}

    def count_dead_letter(self, group: str, channel: str) -> None:
        self.dead_lettered += 1
        self.dead_lettered_by[group, channel] = self.dead_lettered_by.get((group, channel), 0) + 1

    def dead_letter_counters(self, group: str) -> dict[str, int]:
        """``dead_lettered`` and ``dead_lettered.<channel>`` for what consumers of ``group`` dead-lettered; empty
        while they dead-lettered nothing."""
        by_channel = {channel: n for (g, channel), n in self.dead_lettered_by.items() if g == group}
        if not by_channel:
            return {}
        return {"dead_lettered": sum(by_channel.values())} | {
            f"dead_lettered.{channel}": n for channel, n in sorted(by_channel.items())
        }
