"""Each gateway's metrics live in a registry of its own, rendered by prometheus-client."""

from __future__ import annotations

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from actors.gateway._metrics import Metrics


def test_each_gateway_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()  # two in one process: no "Duplicated timeseries" error
    first.observe("chat", 200, 0.01)
    first.error("busy")
    assert b'route="chat"' in first.render()[0] and b'code="busy"' in first.render()[0]
    assert b'route="chat"' not in second.render()[0] and b'code="busy"' not in second.render()[0]
    assert REGISTRY.get_sample_value("flywheel_gateway_requests_total", {"route": "chat", "status": "200"}) is None


def test_admission_gauges_are_read_at_scrape_time() -> None:
    metrics = Metrics()
    metrics.in_flight, metrics.streams_open = 5, 2
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(metrics.render()[0].decode())
        for sample in family.samples
    }
    assert values["flywheel_gateway_in_flight"] == 5 and values["flywheel_gateway_streams_open"] == 2
    assert metrics.snapshot()["in_flight"] == 5


def test_the_format_follows_the_scrapers_accept_header() -> None:
    metrics = Metrics()
    body, content_type = metrics.render("")
    assert content_type.startswith("text/plain") and b"# TYPE flywheel_gateway_requests_total counter" in body
    body, content_type = metrics.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")


def test_served_counts_only_what_a_model_answered() -> None:
    """The live view's requests/s read ``requests``, which counts feedback posts, health checks and scrapes too (a
    helper's service run showed 208 requests after 120 completions and 88 feedback posts)."""
    metrics = Metrics()
    for route in ("completions", "chat", "feedback", "healthz", "metrics", "models", "other"):
        metrics.observe(route, 200, 0.01)
    snapshot = metrics.snapshot()
    assert (snapshot["requests"], snapshot["served"]) == (7, 2)


def test_served_leaves_out_refused_requests() -> None:
    """A completion refused (a bad parameter, an unknown model, no generator serving) served nobody: in a helper's
    service run the status line said '90 requests' after 68 answers and 22 refusals, and an outage answering only
    503s would show as traffic served."""
    metrics = Metrics()
    metrics.observe("completions", 200, 0.01)
    for status in (400, 404, 413, 429, 499, 503, 504):
        metrics.observe("chat", status, 0.01)
    snapshot = metrics.snapshot()
    assert (snapshot["requests"], snapshot["served"]) == (8, 1)
