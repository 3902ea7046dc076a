"""Short full garbage collections in replica processes: freeze the long-lived heap out of the collector's way.

Why: a replica process imports torch, transformers, pydantic, polars, matplotlib… — hundreds of thousands of
container objects (functions, tuples, dicts) that live as long as the process. CPython's full (generation 2)
collection walks every one of them, and the process does nothing else meanwhile: hundreds of milliseconds each,
several times a minute (bench/RESULTS.md). ``gc.freeze()`` moves every object tracked at that moment into a
permanent generation that collections never walk again; reference counting still frees those objects as usual.

Contract: :class:`HeapFreezer` freezes once when installed (after a full collection, so no garbage is frozen) and
registers a ``gc.callbacks`` hook that notes every full collection slower than ``slow_s``; :meth:`HeapFreezer.watch`
(a task next to the actor) freezes again after such a collection — whatever survived it is long-lived too — at
most once per ``min_interval_s``. ``counters`` (``gc_freezes``, ``gc_frozen``: objects in the permanent generation,
``gc_slow_full``: slow full collections seen) go into the replica's heartbeat. :meth:`HeapFreezer.uninstall`
removes the hook (the frozen objects stay frozen).

Cost: a reference cycle among objects that were alive at a freeze and die later is never collected. Freezes
happen at start and after slow full collections only, so what can leak this way is bounded by the heap at those
few moments, not by the length of the run.

Non-goals: tuning the collector's thresholds; processes other than replicas (the supervisor, tests).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import anyio

__all__ = ["HeapFreezer"]


class HeapFreezer:
    def __init__(self, *, slow_s: float = 0.05, min_interval_s: float = 10.0, poll_s: float = 1.0) -> None:
        self.slow_s = slow_s
        self.min_interval_s = min_interval_s
        self.poll_s = poll_s
        self.counters: dict[str, int] = {"gc_freezes": 0, "gc_frozen": 0, "gc_slow_full": 0}
        self._started: float | None = None
        self._slow_pending = False
        self._last_freeze = float("-inf")

    def install(self) -> None:
        gc.collect()
        gc.callbacks.append(self._on_gc)
        self.freeze()

    def uninstall(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def freeze(self) -> None:
        gc.freeze()
        self._last_freeze = time.monotonic()
        self._slow_pending = False
        self.counters["gc_freezes"] += 1
        self.counters["gc_frozen"] = gc.get_freeze_count()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # runs inside the collector: only note the time, never call into gc from here
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            if time.perf_counter() - self._started > self.slow_s:
                self.counters["gc_slow_full"] += 1
                self._slow_pending = True
            self._started = None

    def freeze_due(self) -> bool:
        return self._slow_pending and time.monotonic() - self._last_freeze >= self.min_interval_s

    async def watch(self, report: Callable[[dict[str, int]], None] | None = None) -> None:
        """Freeze again after a slow full collection; ``report`` gets the counters after every poll (runs until
        cancelled)."""
        while True:
            if report is not None:
                report(self.counters)
            await anyio.sleep(self.poll_s)
            if self.freeze_due():
                self.freeze()
