"""Users' live feedback by served version: what the gate's automatic rollback decides on.

Contract: ``FeedbackByVersion`` is fed the recorder's new ``traffic`` rows (request id → the version that answered,
the newest version among its tokens) and new ``feedback`` rows (the first score per request id counts, as the
joiner applies it); feedback whose request is not known yet waits (bounded) until its traffic row is read. Memory
is bounded: the newest ``max_requests`` request ids (which of them were scored with them) and ``max_waiting`` waiting
events; a repeated score for a request older than that is not counted.
``compare(serving, previous, …)`` says whether the serving version's mean score is below the previous serving
version's by more than ``margin`` and by more than twice the difference's standard error, each side with at
least ``min_feedback`` events (the previous version's newest ``window`` events only, so a long-serving version
is judged on its recent record).

Non-goals: per-domain comparison (one mean over every domain: the prompt mix is assumed stationary between two
consecutive versions), feedback on requests the recorder never recorded.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

import polars as pl

__all__ = ["FeedbackByVersion", "LiveComparison"]

_MAX_REQUESTS = 200_000  # request id → version entries kept (oldest dropped first)
_MAX_WAITING = 50_000  # feedback events waiting for their traffic row


@dataclass(frozen=True)
class LiveComparison:
    serving: int
    previous: int
    serving_n: int
    serving_mean: float
    previous_n: int
    previous_mean: float
    standard_error: float
    dropped: bool  # the serving version is worse beyond the margin and the noise

    def figures(self) -> dict[str, Any]:
        return {
            "live_serving_version": self.serving,
            "live_serving_feedback": self.serving_n,
            "live_serving_mean_score": round(self.serving_mean, 4),
            "live_previous_version": self.previous,
            "live_previous_feedback": self.previous_n,
            "live_previous_mean_score": round(self.previous_mean, 4),
            "live_standard_error": round(self.standard_error, 4),
        }


class FeedbackByVersion:
    def __init__(
        self, *, window: int = 2000, max_requests: int = _MAX_REQUESTS, max_waiting: int = _MAX_WAITING
    ) -> None:
        self.window = window
        self.max_requests, self.max_waiting = max_requests, max_waiting
        # request id → (the version that answered, whether its first feedback was counted); oldest request first
        self._version_of: OrderedDict[str, tuple[int, bool]] = OrderedDict()
        self._waiting: OrderedDict[str, float] = OrderedDict()
        self._scores: dict[int, deque[float]] = {}

    def held(self) -> int:
        """Request ids held in memory: at most ``max_requests + max_waiting``."""
        return len(self._version_of) + len(self._waiting)

    def add_traffic(self, rows: pl.DataFrame) -> None:
        if rows.height == 0:
            return
        for rid, version in rows.select("request_id", "version").iter_rows():
            if rid in self._version_of:
                continue
            self._version_of[rid] = (int(version if version is not None else -1), False)
            waiting = self._waiting.pop(rid, None)
            if waiting is not None:
                self._count(rid, waiting)
        while len(self._version_of) > self.max_requests:
            self._version_of.popitem(last=False)

    def add_feedback(self, rows: pl.DataFrame) -> None:
        if rows.height == 0:
            return
        for rid, score in rows.select("request_id", "score").iter_rows():
            known = self._version_of.get(rid)
            if score is None or rid in self._waiting or (known is not None and known[1]):
                continue
            if known is not None:
                self._count(rid, float(score))
            else:
                self._waiting[rid] = float(score)
        while len(self._waiting) > self.max_waiting:
            self._waiting.popitem(last=False)

    def _count(self, rid: str, score: float) -> None:
        version, _ = self._version_of[rid]
        self._version_of[rid] = (version, True)  # in place: it keeps its request's turn to be dropped
        self._scores.setdefault(version, deque(maxlen=self.window)).append(score)

    def scores(self, version: int) -> list[float]:
        return list(self._scores.get(version, ()))

    def compare(self, serving: int, previous: int, *, margin: float, min_feedback: int) -> LiveComparison | None:
        """The comparison, or None while either side has fewer than ``min_feedback`` events."""
        mine, theirs = self.scores(serving), self.scores(previous)
        if len(mine) < min_feedback or len(theirs) < min_feedback:
            return None
        mean_mine, mean_theirs = sum(mine) / len(mine), sum(theirs) / len(theirs)
        se = math.sqrt(_var(mine, mean_mine) / len(mine) + _var(theirs, mean_theirs) / len(theirs))
        drop = mean_theirs - mean_mine
        return LiveComparison(
            serving=serving,
            previous=previous,
            serving_n=len(mine),
            serving_mean=mean_mine,
            previous_n=len(theirs),
            previous_mean=mean_theirs,
            standard_error=se,
            dropped=drop > margin and drop > 2.0 * se,
        )


def _var(values: list[float], mean: float) -> float:
    return sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)
