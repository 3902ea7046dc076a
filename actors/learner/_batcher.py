"""Batch composition: per-domain queues drained in proportion to the domains' sampling weights.

Contract:
- Groups (all completions of one prompt, or one production sample) are queued per domain in arrival order and
  never split: a batch holds whole groups, at least `batch_size` completions when that many are buffered.
- Ratios: a credit scheme (deficit round robin). Each batch credits every domain `batch_size × share`
  (share = weight / Σ weights); groups are then taken from the domain with the most credit that has data, and
  a group costs its size in credit. Over many batches each domain's fraction of completions converges to its
  share; credit is clamped to ±`batch_size` so a domain that was absent for a while cannot hog later batches.
- Never stalls: a batch is `ready` when enough completions are buffered and every domain holds what its credit
  asks for — or, failing that, once `fill_wait_s` has passed since there were enough completions in total
  (then the missing domains' room is filled from the others), or when two batches' worth is buffered (the
  learner is the bottleneck then: waiting for a short domain would only idle it, and the credit a short domain
  did not use is still owed to it, up to the clamp), or the buffer is full.
- Domains that are not in `weights` (e.g. production feedback for a domain the spec does not list) get
  weight 1.0.
- A short batch (`partial_after_s`, off by default): fewer than `batch_size` completions are `ready` once the oldest
  has waited that long — users' feedback trickling in at a few samples a minute still reaches a version, and the
  last samples of a run do not wait for a batch that never fills.

Non-goals: no priorities within a domain (FIFO), no I/O, no advantage computation.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["DomainBatcher"]

T = TypeVar("T")


@dataclass
class _Queued(Generic[T]):
    item: T
    size: int
    added: float = 0.0  # the batcher's clock when it was queued


class DomainBatcher(Generic[T]):
    """Per-domain FIFO queues of groups and the credit scheme above."""

    def __init__(
        self,
        weights: Mapping[str, float],
        batch_size: int,
        *,
        fill_wait_s: float = 2.0,
        buffer_size: int | None = None,
        partial_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size}")
        for name, weight in weights.items():
            if not weight > 0:
                raise ValueError(f"weight of domain {name!r}: expected a number > 0, got {weight}")
        self.batch_size = batch_size
        self.fill_wait_s = fill_wait_s
        self.partial_after_s = partial_after_s
        self.buffer_size = buffer_size if buffer_size is not None else 64 * batch_size
        self._weights = dict(weights)
        self._queues: dict[str, deque[_Queued[T]]] = {name: deque() for name in weights}
        self._credit: dict[str, float] = {name: 0.0 for name in weights}
        self._sizes: dict[str, int] = {name: 0 for name in weights}
        self._clock = clock
        self._enough_since: float | None = None

    # ------------------------------------------------------------------ queue
    def add(self, domain: str, item: T, size: int) -> None:
        if domain not in self._queues:
            self._weights[domain] = 1.0
            self._queues[domain] = deque()
            self._credit[domain] = 0.0
            self._sizes[domain] = 0
        self._queues[domain].append(_Queued(item, size, self._clock()))
        self._sizes[domain] += size

    @property
    def completions(self) -> int:
        return sum(self._sizes.values())

    def buffered(self) -> dict[str, int]:
        """Completions waiting, per domain."""
        return dict(self._sizes)

    def items(self) -> list[T]:
        """Everything queued (for keep-alive of un-acked deliveries)."""
        return [queued.item for queue in self._queues.values() for queued in queue]

    def shares(self) -> dict[str, float]:
        total = sum(self._weights.values())
        return {name: weight / total for name, weight in self._weights.items()}

    # ------------------------------------------------------------------ batches
    def ready(self) -> bool:
        """Whether a batch should be built now (see the module docstring)."""
        total = self.completions
        if total < self.batch_size:
            self._enough_since = None
            if self.partial_after_s is None or total == 0:
                return False
            oldest = min(queue[0].added for queue in self._queues.values() if queue)
            return self._clock() - oldest >= self.partial_after_s
        if total >= min(self.buffer_size, 2 * self.batch_size):
            return True
        now = self._clock()
        if self._enough_since is None:
            self._enough_since = now
        shares = self.shares()
        every_domain_has_its_part = all(
            self._sizes[name] >= min(self.batch_size, self._credit[name] + self.batch_size * share)
            for name, share in shares.items()
        )
        return every_domain_has_its_part or now - self._enough_since >= self.fill_wait_s

    def take(self, completions: int | None = None) -> list[T]:
        """Whole groups adding up to at least `completions` (default `batch_size`) when buffered, by credit."""
        wanted = self.batch_size if completions is None else completions
        for name, share in self.shares().items():
            self._credit[name] += wanted * share
        taken: list[T] = []
        count = 0
        while count < wanted:
            candidates = [name for name, queue in self._queues.items() if queue]
            if not candidates:
                break
            name = max(candidates, key=lambda d: self._credit[d])
            queued = self._queues[name].popleft()
            self._sizes[name] -= queued.size
            self._credit[name] -= queued.size
            taken.append(queued.item)
            count += queued.size
        limit = float(self.batch_size)
        for name in self._credit:
            self._credit[name] = max(-limit, min(limit, self._credit[name]))
        self._enough_since = None
        return taken
