"""The topology's Prometheus endpoint: every replica's numeric heartbeat counters as labelled gauges."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from topology.runtime._exporter import StatusExporter, metric_name
from topology.runtime._status import ReplicaStatus

pytestmark = pytest.mark.timeout(30)


def record(actor: str, kind: str, counters: dict[str, object], *, state: str = "running") -> ReplicaStatus:
    now = time.time()
    return ReplicaStatus(actor, 0, kind, state, 123, 2, now - 60, now - 1.5, counters)


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(url, timeout=5).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metric_names_split_off_the_key() -> None:
    assert metric_name("reward.arithmetic") == ("flywheel_reward", "arithmetic")
    assert metric_name("samples_applied") == ("flywheel_samples_applied", "")
    assert metric_name("feedback_score.my domain.v2") == ("flywheel_feedback_score", "my domain.v2")
    assert metric_name("tokens/s") == ("flywheel_tokens_s", "")


def test_every_numeric_counter_of_every_replica_is_served() -> None:
    exporter = StatusExporter("svc")
    url = exporter.start("127.0.0.1", 0)
    try:
        exporter.update(
            [
                record("learner", "learner", {"reward.arithmetic": 0.5, "step": 7, "phase": "rl", "ok": True}),
                record("source", "source", {"published": 5, "published.a": 2, "published.b": 3}),
                record("gate", "gate", {"decisions.promote": 3, "last_decision": "promote v3: ..."}),
                record("gateway", "gateway", {"url": "http://127.0.0.1:8000", "requests": 12}, state="restarting"),
            ]
        )
        got = scrape(url)
    finally:
        exporter.close()

    def labels(actor: str, kind: str, **extra: str) -> frozenset[tuple[str, str]]:
        return frozenset({"topology": "svc", "actor": actor, "replica": "0", "kind": kind, **extra}.items())

    assert got[("flywheel_reward", labels("learner", "learner", key="arithmetic"))] == 0.5
    assert got[("flywheel_step", labels("learner", "learner", key=""))] == 7
    assert got[("flywheel_ok", labels("learner", "learner", key=""))] == 1
    assert got[("flywheel_decisions", labels("gate", "gate", key="promote"))] == 3
    assert got[("flywheel_requests", labels("gateway", "gateway", key=""))] == 12
    # a total beside its breakdown has a name of its own: summing flywheel_published over keys counted it twice
    published = {dict(lab)["key"]: v for (name, lab), v in got.items() if name == "flywheel_published"}
    assert published == {"a": 2, "b": 3}
    assert got[("flywheel_published_all", labels("source", "source", key=""))] == 5
    assert got[("flywheel_replica_up", labels("gateway", "gateway", state="restarting"))] == 1
    assert got[("flywheel_replica_restarts", labels("gate", "gate"))] == 2
    assert 1.0 <= got[("flywheel_replica_heartbeat_age_seconds", labels("gate", "gate"))] < 10
    names = {name for name, _ in got}
    assert not {"flywheel_phase", "flywheel_last_decision", "flywheel_url"} & names  # text is not a metric


def test_records_are_replaced_not_accumulated() -> None:
    exporter = StatusExporter("svc")
    url = exporter.start("127.0.0.1", 0)
    try:
        exporter.update([record("a", "k", {"n": 1})])
        exporter.update([record("b", "k", {"n": 2})])
        got = scrape(url)
    finally:
        exporter.close()
    assert {dict(labels)["actor"] for name, labels in got if name == "flywheel_n"} == {"b"}
