"""An operator's move pauses the gate: new versions are held without a replay and the operator's version keeps
serving until the pause ends; then the gate decides again from the next version. The pause is read from the
decisions log, so a gate started on that log is paused too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from actors.replay import DecisionLog, read_decisions, resume_gate, rollback, serving_manifest
from tests.actors.gate._support import GateRig, gate_rig, gate_spec
from topology.bus import EmbeddedNats

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@asynccontextmanager
async def promoting(embedded_nats: EmbeddedNats, tmp_path: Path) -> AsyncIterator[tuple[GateRig, dict[str, object]]]:
    """A running gate that promotes every version it sees, with v2 and v3 promoted; and weights to publish."""
    spec = gate_spec(tmp_path, "{min_samples: 100000, without_evidence: promote}")
    async with gate_rig(spec, embedded_nats.url, tmp_path / "run", run=True) as rig:
        assert rig.gate.replayer is not None
        weights: dict[str, object] = {k: v.clone() for k, v in rig.gate.replayer.policy.state_dict().items()}
        for version in (2, 3):
            await rig.decided(version, weights)
        yield rig, weights


async def _serving(rig: GateRig) -> int:
    manifest = await serving_manifest(rig.bus)
    assert manifest is not None
    return manifest.version


async def test_a_rollback_by_hand_stands_until_the_gate_is_resumed(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    async with promoting(embedded_nats, tmp_path) as (rig, weights):
        assert await _serving(rig) == 3
        await rollback(rig.bus, run_dir, by="cli:ops", pause=True)
        for version in (4, 5):
            await rig.decided(version, weights)
        assert await _serving(rig) == 2  # without the pause: v4, then v5
        assert rig.gate.last_decision.startswith("hold v5: paused by cli:ops's rollback of v2 at ")
        assert rig.ctx.counters.get("paused") == 1 and rig.ctx.counters.get("holds_not_logged") == 1
        restarted = DecisionLog(run_dir)
        restarted.update()
        assert restarted.paused is not None and restarted.paused["by"] == "cli:ops"
        assert resume_gate(run_dir, by="cli:ops") is not None
        await rig.decided(6, weights)
        assert await _serving(rig) == 6 and rig.ctx.counters.get("paused") == 0
    actions = [(e["action"], e.get("version")) for e in read_decisions(run_dir)]
    assert actions == [("promote", 2), ("promote", 3), ("rollback", 2), ("hold", 4), ("resume", None), ("promote", 6)]


async def test_its_serving_version_follows_a_move_by_hand(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    """``flywheel status`` and the live view show the gate's ``serving_version`` as what users get: after an
    operator's rollback it must name the version rolled back to, even while the learner publishes nothing new."""
    run_dir = tmp_path / "run"
    async with promoting(embedded_nats, tmp_path) as (rig, _):
        assert rig.ctx.counters.get("serving_version") == 3
        await rollback(rig.bus, run_dir, by="cli:ops", pause=True)
        assert await _serving(rig) == 2
        with anyio.fail_after(10):
            while True:
                if rig.ctx.counters.get("serving_version") == 2 and rig.ctx.counters.get("paused") == 1:
                    break
                await anyio.sleep(0.05)
