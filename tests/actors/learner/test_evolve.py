"""A learner resumed with an edited spec: what the edit means to it is said once, and nothing of what the spec no
longer holds is trained on or compared."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from actors.learner import MetricsWriter, read_metrics
from tests.actors.learner._helpers import running_learner, scored, wait_until, write_spec
from topology.bus import EmbeddedNats

pytestmark = pytest.mark.anyio

LEARNER = "    batch_size: 8\n    eval_every_steps: 0\n    fill_wait_s: 0\n    metrics_flush_s: 0.2\n"
ARITHMETIC = "  arithmetic: {source: builtin:arithmetic, verifier: math, group_size: 4, heldout: 8}\n"
EXTRACT = "  extract: {source: builtin:extract, verifier: json-fields, group_size: 4, heldout: 8}\n"
PYEXPR = "  pyexpr: {source: builtin:pyexpr, verifier: python-expr, group_size: 4, heldout: 8}\n"


async def test_another_eval_set_starts_a_new_heldout_series(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    """eval_size 8 → 4: the run's first round (of 8 prompts) is no start to measure rounds of 4 prompts from."""
    spec = write_spec(tmp_path, LEARNER + "    eval_size: 8\n")
    run_dir = tmp_path / "run"
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, _bus):
        await actor.checkpoint()
        series = actor.rounds.series["arithmetic"]
    earlier = MetricsWriter(run_dir, "an-earlier-life")
    row = {"step": 0, "version": 1, "n": 8, "reward_mean": 0.5, "samples": 1, "temperature": 0.0}
    earlier.add(
        "eval",
        {**row, "ts": 100.0, "domain": "arithmetic", "accuracy": 0.5, "series": series.key, "prompts": 8},
    )
    earlier.flush()
    spec = write_spec(tmp_path, LEARNER + "    eval_size: 4\n", name=spec.name)
    with structlog.testing.capture_logs() as logs:
        async with running_learner(spec, embedded_nats.url, run_dir) as (actor, _bus):
            counters = actor.ctx.counters.snapshot()
    said = [e for e in logs if e["event"] == "learner.heldout_new_series"]
    assert [(e["domain"], e["changed"]) for e in said] == [
        ("arithmetic", "8 held-out prompts → 4 (eval_size or heldout)")
    ]
    assert "heldout_acc_start.arithmetic" not in counters and "heldout_acc.arithmetic" not in counters


async def test_a_removed_domains_groups_are_dropped_and_an_added_one_is_named(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """A resume after removing `extract` (and adding `pyexpr`): its groups still on the bus — training and held-out —
    are acked and counted, never trained on; before, a batch took them at weight 1 and held-out scores of it made
    a one-prompt "round"."""
    spec = write_spec(tmp_path, LEARNER, domains=ARITHMETIC + EXTRACT)
    run_dir = tmp_path / "run"
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, _bus):
        await actor.checkpoint()
    spec = write_spec(tmp_path, LEARNER, domains=ARITHMETIC + PYEXPR, name=spec.name)
    with structlog.testing.capture_logs() as logs:
        async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):
            for i in range(3):
                await bus.publish("scored", "scored", scored("extract", [1.0, 0.0, 1.0, 0.0]), id=f"x{i}")
            await bus.publish(
                "scored", "scored", scored("extract", [1.0], heldout=True, temperature=0.0), id="eval-1-x.r.s"
            )
            for i in range(2):
                await bus.publish("scored", "scored", scored("arithmetic", [1.0, 0.0, 1.0, 0.0]), id=f"a{i}")
            await wait_until(lambda: actor.ctx.counters.get("groups_applied") >= 2)
            await wait_until(lambda: actor.ctx.counters.get("removed_domain.extract") >= 4)
            counters = actor.ctx.counters.snapshot()
    applied = read_metrics(run_dir, "applied")
    assert set(applied["domain"]) == {"arithmetic"}
    assert "heldout_acc.extract" not in counters
    events = {(e["event"], e.get("domain")) for e in logs}
    assert {("learner.domain_removed", "extract"), ("learner.domain_added", "pyexpr")} <= events


async def test_a_round_comes_due_for_an_added_domain_whatever_domains_are_added_with_it(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """Two domains added on a resume, the first (by name) with a held-out set, the second without: the second's
    "no round" overwrote the first's "round due", so the new domain's series waited for the next scheduled round."""
    spec = write_spec(tmp_path, LEARNER, domains=ARITHMETIC)
    run_dir = tmp_path / "run"
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, _bus):
        await actor.checkpoint()
    learner = LEARNER.replace("eval_every_steps: 0", "eval_every_steps: 1000")
    domains = ARITHMETIC + EXTRACT + PYEXPR.replace("heldout: 8", "heldout: 0")
    spec = write_spec(tmp_path, learner, domains=domains, name=spec.name)
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, _bus):
        assert actor.rounds.due or (actor.ctx.counters.get("eval_rounds") or 0) >= 1
