"""FeedbackByVersion: the first score per request counts, feedback may come before its traffic row, and a drop is
called only beyond the margin and twice the standard error, with enough events on both sides."""

from __future__ import annotations

import polars as pl

from actors.gate._feedback import FeedbackByVersion


def traffic(*rows: tuple[str, int]) -> pl.DataFrame:
    return pl.DataFrame({"request_id": [r for r, _ in rows], "version": [v for _, v in rows]})


def feedback(*rows: tuple[str, float]) -> pl.DataFrame:
    return pl.DataFrame({"request_id": [r for r, _ in rows], "score": [s for _, s in rows]})


def test_the_first_score_counts_and_early_feedback_waits_for_its_request() -> None:
    tally = FeedbackByVersion()
    tally.add_feedback(feedback(("a", 1.0), ("a", 0.0), ("b", 0.0)))  # before any traffic row
    assert tally.scores(3) == []
    tally.add_traffic(traffic(("a", 3), ("b", 4)))
    tally.add_feedback(feedback(("a", 0.0)))  # a repeat: the first one stands
    assert tally.scores(3) == [1.0] and tally.scores(4) == [0.0]


def test_a_drop_is_called_beyond_the_margin_and_the_noise_only() -> None:
    tally = FeedbackByVersion()
    tally.add_traffic(traffic(*[(f"p{i}", 1) for i in range(100)], *[(f"s{i}", 2) for i in range(100)]))
    tally.add_feedback(feedback(*[(f"p{i}", float(i % 10 < 8)) for i in range(100)]))  # 0.8
    tally.add_feedback(feedback(*[(f"s{i}", float(i % 10 < 5)) for i in range(30)]))
    assert tally.compare(2, 1, margin=0.1, min_feedback=50) is None  # 30 < 50 events
    tally.add_feedback(feedback(*[(f"s{i}", float(i % 10 < 5)) for i in range(30, 100)]))  # 0.5
    drop = tally.compare(2, 1, margin=0.1, min_feedback=50)
    assert drop is not None and drop.dropped and drop.serving_mean == 0.5 and drop.previous_mean == 0.8
    assert tally.compare(2, 1, margin=0.35, min_feedback=50).dropped is False  # type: ignore[union-attr]


def test_memory_stays_bounded_however_many_requests_are_rated() -> None:
    """A gate serving for weeks: each rated request used to stay in memory for good."""
    tally = FeedbackByVersion(max_requests=100, max_waiting=50)
    for batch in range(30):
        ids = [f"r{batch}-{i}" for i in range(100)]
        tally.add_traffic(traffic(*[(rid, batch) for rid in ids]))
        tally.add_feedback(feedback(*[(rid, 1.0) for rid in ids], *[(f"early{batch}-{i}", 0.0) for i in range(40)]))
        assert tally.held() <= 100 + 50
    assert len(tally.scores(29)) == 100
    tally.add_feedback(feedback(*[(f"r29-{i}", 0.0) for i in range(100)]))  # repeats of requests still held
    assert tally.scores(29) == [1.0] * 100
