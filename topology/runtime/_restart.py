"""Restart policy: exponential backoff, and a crash budget over a sliding window.

Contract: :meth:`RestartPolicy.on_crash` records a crash of one replica and returns how long to wait before
restarting it, or ``None`` when that replica crashed more than ``max_restarts`` times within ``window_s``
seconds — the runtime then stops the whole topology. The backoff doubles with each crash still inside the
window (``backoff_s``, ``2·backoff_s``, … capped at ``backoff_max_s``), so a replica that ran quietly for a
whole window starts again from ``backoff_s``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable


class RestartPolicy:
    """Backoff and crash budget per replica (any hashable key); see the module docstring."""

    def __init__(self, *, max_restarts: int, window_s: float, backoff_s: float, backoff_max_s: float) -> None:
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._crashes: dict[Hashable, deque[float]] = {}

    @classmethod
    def from_spec(cls, restart: object) -> RestartPolicy:
        """Build from ``spec.runtime.restart`` (anything with the four fields)."""
        return cls(
            max_restarts=int(getattr(restart, "max_restarts", 5)),
            window_s=float(getattr(restart, "window_s", 60.0)),
            backoff_s=float(getattr(restart, "backoff_s", 0.5)),
            backoff_max_s=float(getattr(restart, "backoff_max_s", 10.0)),
        )

    def crashes_in_window(self, key: Hashable, now: float | None = None) -> int:
        times = self._crashes.get(key)
        if not times:
            return 0
        self._expire(times, time.monotonic() if now is None else now)
        return len(times)

    def on_crash(self, key: Hashable, now: float | None = None) -> float | None:
        now = time.monotonic() if now is None else now
        times = self._crashes.setdefault(key, deque())
        times.append(now)
        self._expire(times, now)
        if len(times) > self.max_restarts:
            return None
        return float(min(self.backoff_max_s, self.backoff_s * 2 ** (len(times) - 1)))

    def _expire(self, times: deque[float], now: float) -> None:
        while times and now - times[0] > self.window_s:
            times.popleft()
