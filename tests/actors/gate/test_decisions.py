"""The gate replays what users asked (recorded traffic, scored through the domain's task of each prompt) and
promotes a version only within ``threshold`` of the serving version *and* of the best version served so far."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from actors.replay import decide, promote, read_decisions, serving_manifest
from tests.actors.gate._support import expected_answers, gate_rig, gate_spec, record_traffic
from tests.actors.replay._support import PROMPTS, other_weights
from topology.bus import EmbeddedNats

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


def test_the_rule_holds_a_candidate_to_the_best_version_too() -> None:
    rule = {"has_serving": True, "threshold": 0.02, "samples": 50, "min_samples": 10}
    assert decide(0.50, 0.50, best=0.51, best_version=3, **rule).action == "promote"
    below_best = decide(0.50, 0.50, best=0.60, best_version=3, **rule)
    assert below_best.action == "reject" and "best served v3 0.6000" in below_best.reason
    assert decide(0.45, 0.50, best=0.45, **rule).action == "reject"  # the serving version still counts
    assert decide(0.50, 0.50, **rule).action == "promote"  # no champion yet


async def test_users_traffic_decides_and_a_chain_of_worse_versions_cannot_ratchet_down(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    spec = gate_spec(tmp_path, "{min_samples: 8, greedy: true, threshold: 0.02, replay_from: traffic}")
    await expected_answers(spec)
    run_dir = tmp_path / "run"
    record_traffic(run_dir, [(p, 1, None) for p in PROMPTS * 2])
    bad = load_file(str(other_weights(tmp_path / "bad.safetensors")))
    async with gate_rig(spec, embedded_nats.url, run_dir) as rig:
        assert rig.gate.replayer is not None
        good = {k: v.clone() for k, v in rig.gate.replayer.policy.state_dict().items()}
        first = await rig.gate.consider(await rig.publish(2, good))
        assert first is not None and first["action"] == "promote" and first["best_version"] == 2
        worse = await rig.gate.consider(await rig.publish(3, bad))
        assert worse is not None and worse["action"] == "reject"
        assert worse["replayed_from"] == {"traffic": 2 * len(PROMPTS)}  # users' requests, each scored
        assert worse["serving_mean_reward"] == 1.0 and worse["candidate_mean_reward"] < 0.5
        # someone serves the bad version by hand; a candidate as bad passes against it, not against the best
        await promote(rig.bus, run_dir, await rig.publish(4, bad), by="cli:test", reason="by hand")
        ratchet = await rig.gate.consider(await rig.publish(5, bad))
        assert ratchet is not None and ratchet["action"] == "reject"
        assert ratchet["candidate_mean_reward"] == ratchet["serving_mean_reward"] < 0.5
        assert ratchet["best_version"] == 2 and ratchet["best_mean_reward"] == 1.0
        assert "best served v2" in ratchet["reason"]
        recovered = await rig.gate.consider(await rig.publish(6, good))
        assert recovered is not None and recovered["action"] == "promote" and recovered["best_version"] == 6
        # the log names the new champion with its own figure, and the one it was measured against
        assert recovered["best_mean_reward"] == recovered["candidate_mean_reward"]
        assert recovered["previous_best_version"] == 2 and recovered["previous_best_mean_reward"] == 1.0
        serving = await serving_manifest(rig.bus)
        assert serving is not None and serving.version == 6
    log = read_decisions(run_dir)
    assert [(e["action"], e["version"]) for e in log] == [
        ("promote", 2),
        ("reject", 3),
        ("promote", 4),
        ("reject", 5),
        ("promote", 6),
    ]
    assert (run_dir / "weights" / "serving-v2").is_dir()  # the champion stayed pinned while it was one


async def test_a_restarted_gate_keeps_its_champion(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    spec = gate_spec(tmp_path, "{min_samples: 8, greedy: true, replay_from: traffic}")
    await expected_answers(spec)
    run_dir = tmp_path / "run"
    record_traffic(run_dir, [(p, 1, None) for p in PROMPTS])
    bad = load_file(str(other_weights(tmp_path / "bad.safetensors")))
    async with gate_rig(spec, embedded_nats.url, run_dir) as rig:
        assert rig.gate.replayer is not None
        good = {k: v.clone() for k, v in rig.gate.replayer.policy.state_dict().items()}
        await rig.gate.consider(await rig.publish(2, good))
        await promote(rig.bus, run_dir, await rig.publish(3, bad), by="cli:test", reason="by hand")
    async with gate_rig(spec, embedded_nats.url, run_dir) as rig:
        assert rig.gate.best is not None and rig.gate.best.version == 2 and rig.gate.decided == 3
        again = await rig.gate.consider(await rig.publish(4, bad))
        assert again is not None and again["action"] == "reject" and "best served v2" in again["reason"]


async def test_a_request_recorded_again_after_a_refresh_is_replayed_once(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    spec = gate_spec(tmp_path, "{min_samples: 8, greedy: true, replay_from: traffic}")
    run_dir = tmp_path / "run"
    ids = [f"fw-again-{i}" for i in range(len(PROMPTS))]
    record_traffic(run_dir, [(p, 1, None) for p in PROMPTS], ids=ids)
    async with gate_rig(spec, embedded_nats.url, run_dir) as rig:
        first = await rig.gate.recent_items()
        assert sorted(item.key for item in first) == sorted(ids)
        # the gateway published one request again once the bus's dedupe window was over: the recorder wrote it a
        # second time, and the gate reads that row in a later refresh
        record_traffic(run_dir, [(PROMPTS[0], 1, None)], ids=ids[:1], first_seq=len(PROMPTS) + 1)
        again = await rig.gate.recent_items()
    assert sorted(item.key for item in again) == sorted(ids)  # each request once: it would weigh twice in a decision
    newest = next(item for item in again if item.key == ids[0])
    assert newest.ts == max(item.ts for item in again)  # the newer row is the one kept, as the replay keeps it
