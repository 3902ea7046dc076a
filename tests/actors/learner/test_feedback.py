"""Production samples (users' feedback) are not bound by max_staleness — the gate holds the version that served
them back while the learner moves on — but by feedback_max_staleness when set; each version's publish step is in
the audit trail (what the feedback-to-serving latency is computed from)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.learner import read_metrics
from tests.actors.learner._helpers import running_learner, scored, wait_until, write_spec
from topology.bus import EmbeddedNats

pytestmark = pytest.mark.anyio

LEARNER = "    batch_size: 4\n    checkpoint_every_steps: 1\n    eval_every_steps: 0\n    fill_wait_s: 0\n"
LEARNER += "    metrics_flush_s: 0.2\n    max_staleness: 0\n    publish_min_interval_s: 0\n"


def feedback_sample(reward: float, i: int) -> dict[str, Any]:
    payload = scored("arithmetic", [reward], versions=0, prompt=f"{i}+1=")  # served by version 0: staleness 1
    return {**payload, "origin": "feedback", "task_id": f"fw-{i}"}


async def test_feedback_samples_train_whatever_their_staleness(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, LEARNER)
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
        for i in range(8):
            await bus.publish("scored", "scored", feedback_sample(float(i % 2), i), id=f"joined.fw-{i}")
        await wait_until(lambda: actor.step == 2)
        counters = actor.ctx.counters.snapshot()
        assert counters.get("dropped_stale", 0) == 0 and counters["feedback_staleness_mean"] >= 1.0
        assert "staleness.1" not in counters  # the task domains' staleness histogram is theirs alone
    applied = read_metrics(tmp_path / "run", "applied")
    assert sorted(applied["task_id"].to_list()) == sorted(f"fw-{i}" for i in range(8))
    publishes = read_metrics(tmp_path / "run", "lifecycle").filter(event="publish")
    assert publishes.select("step", "version").rows()[:3] == [(0, 1), (1, 2), (2, 3)]


async def test_feedback_max_staleness_bounds_them(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, LEARNER + "    feedback_max_staleness: 0\n")
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
        for i in range(4):
            await bus.publish("scored", "scored", feedback_sample(1.0, i), id=f"joined.fw-{i}")
        await wait_until(lambda: actor.ctx.counters.get("dropped_stale") == 4)
        assert actor.step == 0
