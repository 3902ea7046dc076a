"""The applied ledger: which `scored` messages have changed the weights — the learner's exactly-once record.

Protocol (see `actors.learner._actor` and `actors.learner._intake`): a message is added here right after the
optimizer step that applied it; the ledger is saved inside every checkpoint; a message is acked on the bus only
after a checkpoint that contains it was written. After a crash the learner restores weights *and* ledger from the
same checkpoint, so:

- a redelivered message already in the restored ledger was applied to the restored weights → ack, skip;
- a message applied after that checkpoint was never acked → redelivered → not in the ledger → applied again,
  this time to the restored (older) weights, which never saw it — if it is still fresh enough to train on: it comes
  back after the bus's ``ack_wait_s`` (30 s by default), and the learner judges it by ``max_staleness`` like any other
  sample. A generated rollout is then usually more versions old than that and is dropped as stale (counted in
  ``dropped_stale``; the source draws new tasks); users' feedback has no bound by default
  (``feedback_max_staleness``) and is applied again.

Hence nothing is applied twice, and nothing is lost unseen: each redelivered message is applied or counted. The
ledger is bounded (oldest ids forgotten first): an id older than `capacity` applications cannot be redelivered any
more, since it was acked long ago.

Non-goals: dedupe of producer retries with *different* ids (the bus's `Nats-Msg-Id` window does that).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["AppliedLedger"]


class AppliedLedger:
    """An insertion-ordered, bounded set of message ids."""

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: expected an integer >= 1, got {capacity}")
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, ids: Iterable[str]) -> None:
        for message_id in ids:
            self._ids[message_id] = None
            self._ids.move_to_end(message_id)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def ids(self) -> list[str]:
        return list(self._ids)

    def dumps(self) -> str:
        """One string (ids never contain newlines), cheap to put in a checkpoint."""
        return "\n".join(self._ids)

    @classmethod
    def loads(cls, text: str, capacity: int = 100_000) -> AppliedLedger:
        ledger = cls(capacity)
        ledger.add(filter(None, text.split("\n")))
        return ledger
