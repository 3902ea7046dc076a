"""AppliedLedger: membership, bound, round trip through its checkpoint form."""

from __future__ import annotations

from actors.learner import AppliedLedger


def test_bounded_and_round_trips() -> None:
    ledger = AppliedLedger(capacity=3)
    ledger.add(["a", "b", "c", "d"])
    assert "a" not in ledger and "d" in ledger and len(ledger) == 3
    again = AppliedLedger.loads(ledger.dumps(), capacity=3)
    assert again.ids() == ["b", "c", "d"]
