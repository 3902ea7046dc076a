"""The gateway's metrics, rendered in the Prometheus text exposition format (version 0.0.4) by hand.

Series (all prefixed ``flywheel_gateway_``): ``requests_total{route,status}``, ``request_seconds`` (histogram
of end-to-end latency by route, streams included), ``in_flight``, ``streams_open``,
``traffic_published_total``, ``traffic_publish_errors_total``, ``feedback_total``, ``generated_tokens_total``.

Non-goals: a general metrics library (no registry, no summaries, no multiprocess mode).
"""

from __future__ import annotations

import bisect
from collections import Counter

__all__ = ["Metrics"]

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_PREFIX = "flywheel_gateway_"


class _Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(_BUCKETS) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(_BUCKETS, value)] += 1
        self.sum += value


class Metrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.latency: dict[str, _Histogram] = {}
        self.in_flight = 0
        self.streams_open = 0
        self.traffic_published = 0
        self.traffic_errors = 0
        self.feedback = 0
        self.tokens = 0

    def observe(self, route: str, status: int, seconds: float | None = None) -> None:
        self.requests[(route, status)] += 1
        if seconds is not None:
            self.latency.setdefault(route, _Histogram()).observe(seconds)

    def render(self) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str) -> str:
            full = _PREFIX + name
            lines.append(f"# HELP {full} {help_text}")
            lines.append(f"# TYPE {full} {kind}")
            return full

        name = family("requests_total", "counter", "HTTP requests answered, by route and status.")
        for (route, status), count in sorted(self.requests.items()):
            lines.append(f'{name}{{route="{route}",status="{status}"}} {count}')
        name = family("request_seconds", "histogram", "End-to-end latency of answered requests, by route.")
        for route, hist in sorted(self.latency.items()):
            cumulative = 0
            for bound, count in zip((*_BUCKETS, float("inf")), hist.counts, strict=True):
                cumulative += count
                shown = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f'{name}_bucket{{route="{route}",le="{shown}"}} {cumulative}')
            lines.append(f'{name}_sum{{route="{route}"}} {hist.sum:.6f}')
            lines.append(f'{name}_count{{route="{route}"}} {cumulative}')
        gauges = (
            ("in_flight", "Inference requests in flight.", self.in_flight),
            ("streams_open", "Streaming responses open.", self.streams_open),
        )
        for short, help_text, value in gauges:
            lines.append(f"{family(short, 'gauge', help_text)} {value}")
        counters = (
            ("traffic_published_total", "Served requests published to the traffic channel.", self.traffic_published),
            ("traffic_publish_errors_total", "Served requests that could not be published.", self.traffic_errors),
            ("feedback_total", "Feedback messages accepted and published.", self.feedback),
            ("generated_tokens_total", "Completion tokens served.", self.tokens),
        )
        for short, help_text, value in counters:
            lines.append(f"{family(short, 'counter', help_text)} {value}")
        return "\n".join(lines) + "\n"
