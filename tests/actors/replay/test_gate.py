"""The promotion gate promotes a good version, rejects a regressing one; promote/rollback move serving by hand."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from click.testing import CliRunner
from safetensors.torch import load_file

from actors.gate._actor import GateActor
from actors.gate._config import GateConfig
from actors.policy import read_safetensors
from actors.replay import decide, read_decisions, serving_manifest
from actors.testing import actor_context
from actors.weights import SafetensorsDirTransport, WeightPublisher
from tests.actors.replay._support import other_weights, record_run, replay_spec
from topology.bus import Bus, EmbeddedNats
from topology.cli import main
from topology.runtime._rundir import RunInfo, write_run_info

pytestmark = pytest.mark.anyio

GATE = "  gate: {min_samples: 4, greedy: true, threshold: 0.02}\n"


def test_the_rule() -> None:
    first = decide(None, None, has_serving=False, threshold=0.02, samples=0, min_samples=10)
    assert first.action == "promote"
    assert decide(0.50, 0.51, has_serving=True, threshold=0.02, samples=20, min_samples=10).action == "promote"
    assert decide(0.40, 0.51, has_serving=True, threshold=0.02, samples=20, min_samples=10).action == "reject"
    assert decide(0.9, 0.1, has_serving=True, threshold=0.02, samples=3, min_samples=10).action == "hold"
    assert (
        decide(0.9, 0.1, has_serving=True, threshold=0.02, samples=3, min_samples=10, without_evidence="promote").action
        == "promote"
    )
    # enough samples, but the verifier scored none of the candidate's: held, and the reason says why
    unscored = decide(None, 0.5, has_serving=True, threshold=0.02, samples=20, min_samples=10)
    assert unscored.action == "hold" and "the verifier failed on every one" in unscored.reason


async def wait_decisions(run_dir: Path, n: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    with anyio.fail_after(timeout_s):
        while True:
            entries = read_decisions(run_dir)
            if len(entries) >= n:
                return entries
            await anyio.sleep(0.1)


async def test_gate_promotes_the_first_and_better_versions_and_rejects_a_regression(
    embedded_nats: EmbeddedNats, tmp_path: Path, live_run: Callable[[Path], Path]
) -> None:
    spec = replay_spec(tmp_path, extra_actors=GATE)
    run_dir = tmp_path / "run"
    await record_run(spec, run_dir, version=1)  # recordings + the policy's own weights as weights/v1
    good = read_safetensors(run_dir / "weights" / "v1" / "model.safetensors")
    bad = load_file(str(other_weights(tmp_path / "bad.safetensors")))
    async with await Bus.connect(embedded_nats.url, topology=spec.name, name="gate") as bus:
        store = SafetensorsDirTransport(run_dir / "weights")
        publisher = WeightPublisher(bus, spec.name, store)
        ctx = actor_context(spec, "gate", bus, run_dir)
        config = spec.actors["gate"].config
        assert isinstance(config, GateConfig)
        gate = GateActor(ctx, config)
        await gate.start()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(gate.run)
                await publisher.publish(2, good)
                await wait_decisions(run_dir, 1)
                await publisher.publish(3, bad)
                await wait_decisions(run_dir, 2)
                await publisher.publish(4, good)
                entries = await wait_decisions(run_dir, 3)
                # the store prunes v2 a quarter second after v4's publish, in a thread: the rollback below
                #   asserts that it is gone
                await anyio.to_thread.run_sync(store.wait_tidy, 10.0)
                ctx.stopping.set()
        finally:
            await gate.stop()
        assert [(e["action"], e["version"]) for e in entries] == [("promote", 2), ("reject", 3), ("promote", 4)]
        assert entries[0]["reason"] == "first version: promoted unconditionally"
        assert entries[1]["candidate_mean_reward"] < 0.5 <= entries[1]["serving_mean_reward"] == 1.0
        assert entries[1]["serving_version"] == 2 and entries[1]["samples"] >= 4
        serving = await serving_manifest(bus)
        assert serving is not None and serving.version == 4
        assert (run_dir / "weights" / "serving-v4" / "model.safetensors").is_file()

        # people: roll back to v2 (pinned, although the learner's store pruned it), then force v3 in
        write_run_info(
            run_dir,
            RunInfo(
                topology=spec.name,
                bus_url=embedded_nats.url,
                pid=os.getpid(),
                spec_path=str(spec.source_path),
                started_at=time.time(),
                heartbeat_s=1.0,
            ),
        )
        live_run(run_dir)
        runner = CliRunner()
        result = await anyio.to_thread.run_sync(lambda: runner.invoke(main, ["rollback", str(run_dir)]))
        assert result.exit_code == 0, result.output
        assert "v2 is serving again (was v4)" in result.output
        serving = await serving_manifest(bus)
        assert serving is not None and serving.version == 2
        assert not (run_dir / "weights" / "v2").exists()  # pruned by the learner's transport; served pinned
        result = await anyio.to_thread.run_sync(lambda: runner.invoke(main, ["promote", "v3", str(run_dir)]))
        assert result.exit_code == 0, result.output
        serving = await serving_manifest(bus)
        assert serving is not None and serving.version == 3
        result = await anyio.to_thread.run_sync(lambda: runner.invoke(main, ["promote", "v9", str(run_dir)]))
        assert result.exit_code != 0 and "version 9 is not available" in result.output
    log = [orjson.loads(line) for line in (run_dir / "gate" / "decisions.jsonl").read_bytes().splitlines()]
    assert [e["action"] for e in log] == ["promote", "reject", "promote", "rollback", "promote"]


def test_the_decision_log_reads_only_what_was_appended_since(tmp_path: Path) -> None:
    from actors.replay import DecisionLog, decisions_path, record

    log = DecisionLog(tmp_path)
    assert log.update() == [] and log.serving == []
    record(tmp_path, {"action": "promote", "version": 2, "serving": True, "best_version": 2})
    record(tmp_path, {"action": "hold", "version": 3, "serving": False, "best_version": 2})
    assert [e["version"] for e in log.update()] == [2, 3]
    with open(decisions_path(tmp_path), "ab") as out:  # another process, between its bytes and its newline
        out.write(b'{"action": "rollback", "version": 1, "serving": true, "best_')
    assert log.update() == [] and [e["version"] for e in log.serving] == [2]
    with open(decisions_path(tmp_path), "ab") as out:
        out.write(b'version": 1}\n')
    assert [e["version"] for e in log.update()] == [1]
    assert [e["version"] for e in log.serving] == [2, 1] and log.best_version == 1
    decisions_path(tmp_path).rename(tmp_path / "gate" / "decisions.jsonl.1")  # rotated by its owner
    record(tmp_path, {"action": "promote", "version": 4, "serving": True, "best_version": 4})
    assert [e["version"] for e in log.update()] == [4]  # the new file, from its start
    assert [e["version"] for e in log.serving] == [4] and log.best_version == 4
