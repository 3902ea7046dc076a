"""The gateway's metrics: a ``prometheus_client`` registry of its own per gateway instance (never the global one,
so two gateways in one process — tests, the single-process runtime — never share or collide), rendered by the
library in the format the scraper asks for (Prometheus text, or OpenMetrics).

Series (all prefixed ``flywheel_gateway_``):

* ``requests_total{route,status}`` — HTTP requests answered; ``request_seconds{route}`` — histogram of their
  end-to-end latency (streams included, until the last byte). A stream is counted as what it came to: 499 (nginx's
  "client closed request") when the client left before its end, the error's status when it ended in an error event;
* ``in_flight``, ``streams_open`` — gauges read at scrape time from the admission counters;
* ``errors_total{code}`` — OpenAI-shaped error responses (and error events ending a stream), by the code the
  client got (``untrusted_host``, ``cross_origin``, ``unsupported_media_type``, ``body_timeout``,
  ``body_too_large``, ``invalid_json``, ``unknown_domain``, ``busy``, ``timeout``, ``internal_error``, …);
* ``client_disconnects_total`` — requests whose client went away before the answer; their generation was
  cancelled; ``internal_errors_total`` — unexpected failures answered with a bare 500 (the detail is logged);
* ``traffic_published_total``, ``traffic_publish_errors_total`` (each failure is also logged with its request
  id), ``feedback_total``, ``feedback_duplicates_total`` (of those, ratings of a request rated already),
  ``generated_tokens_total``.

:meth:`Metrics.snapshot` gives the counters the actor puts in its heartbeat: ``requests`` counts every HTTP request
answered (feedback, health checks and scrapes too), ``served`` only the completions and chat requests a model answered
(status below 400; what the live view's requests/s shows).

Non-goals: multiprocess mode (one gateway replica is one process), push gateways.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

__all__ = ["INFERENCE_ROUTES", "Metrics"]

INFERENCE_ROUTES = frozenset({"chat", "completions"})  # the routes a model answers (the others: feedback, models, …)

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_PREFIX = "flywheel_gateway_"


class Metrics:
    """Admission counters (plain ints the gateway reads on every request) and the Prometheus series."""

    def __init__(self) -> None:
        self.in_flight = 0  # inference requests holding a concurrency slot
        self.streams_open = 0  # of which streaming
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self._requests = Counter(
            _PREFIX + "requests", "HTTP requests answered, by route and status.", ["route", "status"], registry=registry
        )
        self._latency = Histogram(
            _PREFIX + "request_seconds",
            "End-to-end latency of answered requests, by route.",
            ["route"],
            buckets=_BUCKETS,
            registry=registry,
        )
        Gauge(_PREFIX + "in_flight", "Inference requests in flight.", registry=registry).set_function(
            lambda: self.in_flight
        )
        Gauge(_PREFIX + "streams_open", "Streaming responses open.", registry=registry).set_function(
            lambda: self.streams_open
        )
        self._errors = Counter(_PREFIX + "errors", "Error responses, by error code.", ["code"], registry=registry)
        self._disconnects = Counter(
            _PREFIX + "client_disconnects",
            "Requests whose client went away; their generation was cancelled.",
            registry=registry,
        )
        self._internal = Counter(
            _PREFIX + "internal_errors", "Unexpected failures answered with a bare 500.", registry=registry
        )
        self._published = Counter(
            _PREFIX + "traffic_published", "Served requests published to the traffic channel.", registry=registry
        )
        self._publish_errors = Counter(
            _PREFIX + "traffic_publish_errors",
            "Served requests whose traffic record could not be stored.",
            registry=registry,
        )
        self._feedback = Counter(_PREFIX + "feedback", "Feedback messages accepted and published.", registry=registry)
        self._feedback_duplicates = Counter(
            _PREFIX + "feedback_duplicates",
            "Feedback for a request rated already (stored, answered as a duplicate; only the first counts).",
            registry=registry,
        )
        self._tokens = Counter(_PREFIX + "generated_tokens", "Completion tokens served.", registry=registry)
        self.requests = 0
        self.served = 0  # of which completions and chat requests answered (not refused)
        self.errors = 0
        self.client_disconnects = 0
        self.internal_errors = 0
        self.traffic_published = 0
        self.traffic_errors = 0
        self.feedback = 0
        self.feedback_duplicates = 0

    # -- recording ---------------------------------------------------------------------------------------
    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests += 1
        self.served += route in INFERENCE_ROUTES and status < 400  # a refusal (400, 404, 503, …) served nothing
        self._requests.labels(route, str(status)).inc()
        self._latency.labels(route).observe(seconds)

    def error(self, code: str) -> None:
        self.errors += 1
        self._errors.labels(code).inc()

    def disconnect(self) -> None:
        self.client_disconnects += 1
        self._disconnects.inc()

    def internal_error(self) -> None:
        self.internal_errors += 1
        self._internal.inc()

    def published(self, tokens: int) -> None:
        self.traffic_published += 1
        self._published.inc()
        self._tokens.inc(tokens)

    def publish_failed(self, tokens: int) -> None:
        self.traffic_errors += 1
        self._publish_errors.inc()
        self._tokens.inc(tokens)

    def feedback_accepted(self, *, duplicate: bool = False) -> None:
        self.feedback += 1
        self._feedback.inc()
        if duplicate:
            self.feedback_duplicates += 1
            self._feedback_duplicates.inc()

    # -- reading -----------------------------------------------------------------------------------------
    def render(self, accept: str = "") -> tuple[bytes, str]:
        """``(body, content type)``: the registry in the format the scraper's ``Accept`` header asks for — the
        Prometheus text format by default, OpenMetrics when asked."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type

    def snapshot(self) -> dict[str, int]:
        """What the gateway's heartbeat carries."""
        return {
            "in_flight": self.in_flight,
            "streams_open": self.streams_open,
            "requests": self.requests,
            "served": self.served,
            "errors": self.errors,
            "client_disconnects": self.client_disconnects,
            "internal_errors": self.internal_errors,
            "traffic_published": self.traffic_published,
            "traffic_errors": self.traffic_errors,
            "feedback": self.feedback,
            "feedback_duplicates": self.feedback_duplicates,
        }
