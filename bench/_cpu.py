"""Where a run's cores go: the CPU time of every process below this one, by actor, sampled while the run runs.

A :class:`CpuSampler` (a context manager) reads, every ``interval_s``, the cumulative CPU seconds (user + system)
of each descendant process (psutil) and names it by its ``--actor`` argument (the local runtime's replica
processes), else by its executable (``nats-server``). A process is read until it exits, so the figure is its CPU
time up to its last reading, a few seconds short of the whole at most; a replica restarted under a new process adds
to its actor. :func:`cores_by_actor` turns the readings into cores: CPU seconds per second of the sampled span. The
bench's own process (the runtime that supervises) is counted as ``runtime``.

Non-goals: threads within a process, processes that are not descendants (a Ray cluster started elsewhere).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import psutil

__all__ = ["CpuSampler", "cores_by_actor", "process_name"]


def process_name(cmdline: list[str]) -> str:
    """The actor a replica process runs (``--actor NAME``), else the executable's file name."""
    for flag, value in itertools.pairwise(cmdline):
        if flag == "--actor":
            return value
    return os.path.basename(cmdline[0]) if cmdline else "?"


def cores_by_actor(readings: Mapping[int, tuple[str, float]], span_s: float) -> dict[str, float]:
    """Cores per name: the CPU seconds of every process of that name (``pid -> (name, CPU seconds at its last
    reading)``) over ``span_s`` seconds, largest first."""
    if span_s <= 0:
        return {}
    totals: dict[str, float] = {}
    for name, cpu_s in readings.values():
        totals[name] = totals.get(name, 0.0) + cpu_s
    return {name: cpu / span_s for name, cpu in sorted(totals.items(), key=lambda item: -item[1])}


class CpuSampler:
    """Samples the CPU time of this process's descendants every ``interval_s`` while the block runs."""

    def __init__(self, interval_s: float = 2.0) -> None:
        self.interval_s = interval_s
        self._readings: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._me = psutil.Process()
        self._own_start = 0.0
        self._started = 0.0
        self._last = 0.0

    def __enter__(self) -> CpuSampler:
        self._started = self._last = time.monotonic()
        times = self._me.cpu_times()
        self._own_start = times.user + times.system
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        """Read every descendant's CPU time now (and the bench process's own, as ``runtime``)."""
        for process in self._me.children(recursive=True):
            try:
                with process.oneshot():
                    name = process_name(process.cmdline())
                    times = process.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            self._readings[process.pid] = (name, times.user + times.system)
        times = self._me.cpu_times()
        self._readings[-1] = ("runtime", times.user + times.system - self._own_start)
        self._last = time.monotonic()

    def cores(self) -> dict[str, float]:
        """Cores per actor over the span from the block's start to the last reading."""
        return cores_by_actor(self._readings, self._last - self._started)
