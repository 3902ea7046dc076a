"""Dropping what every consumer group of a channel has acknowledged, once it is older than the dedupe window.

Why: a channel's stream keeps its messages until ``bus.retention`` drops them (seven days by default), consumed or
not, so an always-on run's pipeline channels (prompts, rollouts, scored) grew by tens of GB a day on a laptop. A
message every consumer group has acknowledged is needed by nobody: the actors keep their own state (checkpoints, KV,
the recorder's files), and a group added later starts from what is left.

Contract: :class:`AckedTrimmer` looks at the run's trimmable channels every ``every_s``: durable, not ``external``
(other programs may read those), consumed by at least one actor of the spec, and with every such actor's consumer
group created already (a group that does not exist yet would be delivered the whole stream). A channel's floor is the
lowest ack floor of all its consumer groups (the spec's, and any other, such as a command's); the stream is purged
below the floor it had ``window_s`` earlier — the bus's dedupe window — so a message is dropped only once a retried
publish of it can no longer be recognised as a duplicate anyway. What is purged is counted per channel.

Non-goals: trimming channels no actor consumes (the dead-letter channel, a ``review`` queue: they keep the bus's
retention); exactness under a bus that is away (a look that fails is skipped).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

import nats.js.errors as js_errors

if TYPE_CHECKING:
    from topology._graph import ChannelNode
    from topology.bus import Bus

__all__ = ["AckedTrimmer"]


class AckedTrimmer:
    """One run's trimmer of its channels (see the module docstring); ``tick`` every ``every_s``."""

    def __init__(self, bus: Bus, channels: Iterable[ChannelNode], *, window_s: float) -> None:
        self._bus = bus
        self._consumers = {
            c.name: frozenset(c.consumers) for c in channels if c.durable and not c.external and c.consumers
        }
        self.window_s = window_s
        self.every_s = min(60.0, max(0.5, window_s / 4))
        self._floors: deque[tuple[float, dict[str, int]]] = deque()  # (when, floor per channel), oldest first
        self._settled: dict[str, int] = {}  # the floors of the newest look at least window_s old
        self._purged: dict[str, int] = {}  # channel → the sequence it was purged below
        self.dropped: dict[str, int] = {}  # channel → messages dropped by this trimmer

    async def tick(self, now: float) -> dict[str, int]:
        """Record each channel's floor now and purge below the floor of ``window_s`` ago; returns what was dropped."""
        floors: dict[str, int] = {}
        for channel, groups in self._consumers.items():
            floor = await self._floor(channel, groups)
            if floor is not None:
                floors[channel] = floor
        self._floors.append((now, floors))
        while self._floors and self._floors[0][0] <= now - self.window_s:
            self._settled = self._floors.popleft()[1]
        dropped: dict[str, int] = {}
        for channel, floor in self._settled.items():
            if floor + 1 <= self._purged.get(channel, 1):
                continue
            stream = self._bus.stream(channel)
            js = self._bus.nc.jetstream()
            before = (await js.stream_info(stream)).state.messages
            await js.purge_stream(stream, seq=floor + 1)
            after = (await js.stream_info(stream)).state.messages
            self._purged[channel] = floor + 1
            if before > after:
                dropped[channel] = int(before - after)
                self.dropped[channel] = self.dropped.get(channel, 0) + dropped[channel]
        return dropped

    async def _floor(self, channel: str, groups: frozenset[str]) -> int | None:
        """The lowest ack floor of ``channel``'s consumer groups; None while one of ``groups`` does not exist."""
        try:
            infos = await self._bus.nc.jetstream().consumers_info(self._bus.stream(channel))
        except js_errors.NotFoundError:
            return None  # nothing was published there yet
        names = {info.name for info in infos}
        if not infos or not groups <= names:
            return None
        return min(int(info.ack_floor.stream_seq or 0) if info.ack_floor is not None else 0 for info in infos)
