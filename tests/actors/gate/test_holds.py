"""Until users' requests are recorded every version is held for want of evidence: one such hold a minute is
written to decisions.jsonl, the others counted (a line per version grew the log ~150 MB a day at the service spec's
pace); each still shows as the gate's last decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.replay import read_decisions
from tests.actors.gate._support import gate_rig, gate_spec
from topology.bus import EmbeddedNats

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def test_holds_for_want_of_evidence_are_logged_once_a_minute(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    spec = gate_spec(tmp_path, "{min_samples: 100000}")
    run_dir = tmp_path / "run"
    async with gate_rig(spec, embedded_nats.url, run_dir, run=True) as rig:
        assert rig.gate.replayer is not None
        weights = {k: v.clone() for k, v in rig.gate.replayer.policy.state_dict().items()}
        for version in range(2, 7):
            await rig.decided(version, weights)
        assert rig.ctx.counters.get("holds_not_logged") == 3
        assert rig.gate.last_decision.startswith("hold v6: ")
    assert [(e["action"], e["version"]) for e in read_decisions(run_dir)] == [("promote", 2), ("hold", 3)]
