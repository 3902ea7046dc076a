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


async def test_a_second_rollback_goes_further_back_not_to_the_version_rolled_back_from(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """`flywheel rollback` twice served v2, then v3 again: the version the first rollback took users off. The serving
    history is a stack: v4 → v3 → v2, and then there is nothing earlier."""
    run_dir = tmp_path / "run"
    async with promoting(embedded_nats, tmp_path) as (rig, weights):
        await rig.decided(4, weights)
        assert await _serving(rig) == 4
        await rollback(rig.bus, run_dir, by="cli:ops", pause=True)
        assert await _serving(rig) == 3
        await rollback(rig.bus, run_dir, by="cli:ops", pause=True)
        assert await _serving(rig) == 2
        with pytest.raises(ValueError, match="no earlier serving version than v2"):
            await rollback(rig.bus, run_dir, by="cli:ops", pause=True)
        assert await _serving(rig) == 2


def test_a_rollback_to_a_version_not_below_counts_as_a_promotion() -> None:
    """A log written before rollbacks stacked (v1, v95, rollback to v1, 'rollback' to v95) still knows v1 served
    before v95, instead of forgetting everything under the last entry."""
    from actors.replay._promote import _served_stack

    history = [
        {"action": action, "version": version}
        for action, version in (("promote", 1), ("promote", 95), ("rollback", 1), ("rollback", 95))
    ]
    assert [e["version"] for e in _served_stack(history)] == [1, 95]  # v1 served before v95
    assert [e["version"] for e in _served_stack(history[:3])] == [1]  # nothing served before v1


async def test_a_pause_that_comes_while_the_versions_are_replayed_holds_the_candidate(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """An operator pauses the gate while it replays a candidate (seconds to minutes): the gate looks again after the
    replay and holds, rather than promoting over the operator's move. (Dropping that second look passed the suite.)"""
    from actors.replay import pause_gate

    spec = gate_spec(tmp_path, "{min_samples: 100000, without_evidence: promote}")
    run_dir = tmp_path / "run"
    async with gate_rig(spec, embedded_nats.url, run_dir) as rig:
        assert rig.gate.replayer is not None
        weights: dict[str, object] = {k: v.clone() for k, v in rig.gate.replayer.policy.state_dict().items()}
        first = await rig.gate.consider(await rig.publish(2, weights))
        assert first is not None and first["action"] == "promote"
        replay = rig.gate._compare

        async def paused_meanwhile(*args: object) -> dict[str, object]:
            figures = await replay(*args)  # type: ignore[arg-type]
            pause_gate(run_dir, by="cli:ops", reason="incident")
            return figures

        rig.gate._compare = paused_meanwhile  # type: ignore[method-assign]
        held = await rig.gate.consider(await rig.publish(3, weights))
        assert held is not None and (held["action"], held["version"], held["kept"]) == ("hold", 3, 2), held
        assert "paused by cli:ops" in held["reason"]
        assert await _serving(rig) == 2
