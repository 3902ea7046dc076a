"""SingleProcessRuntime: lifecycle order, heartbeats in the KV bucket, restarts and the crash budget."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.topology.runtime._helpers import lifecycle, write_spec
from topology import load_spec
from topology.runtime import ReplicaStatus, RunResult, SingleProcessRuntime

pytestmark = pytest.mark.usefixtures("kinds_env")


async def _run_until(runtime: SingleProcessRuntime, done: list[ReplicaStatus]) -> RunResult:
    """Run; once every replica heartbeats 'running' with counters, remember the records and stop."""
    result: RunResult | None = None

    async def run() -> None:
        nonlocal result
        result = await runtime.run(duration_s=30)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await runtime.started.wait()
        with anyio.fail_after(20):
            while True:
                records = await runtime.statuses()
                if len(records) == 2 and all(r.state == "running" and r.counters for r in records):
                    done.extend(records)
                    break
                await anyio.sleep(0.1)
        runtime.request_stop("test done")
    assert result is not None
    return result


def test_lifecycle_order_and_heartbeats(tmp_path: Path) -> None:
    runtime = SingleProcessRuntime(load_spec(write_spec(tmp_path)), handle_signals=False)
    records: list[ReplicaStatus] = []
    result = anyio.run(_run_until, runtime, records, backend="asyncio")
    assert result.ok, result.message
    assert {(r.actor, r.replica) for r in records} == {("ticker", 0), ("tally", 0)}
    assert all(r.restarts == 0 and r.pid > 0 for r in records)
    assert result.run_dir == (tmp_path / "runs" / "latest").resolve()
    for actor in ("ticker", "tally"):
        assert lifecycle(result.run_dir, actor) == ["start", "run", "drain", "stop"]


def test_crashing_replica_is_restarted_then_stops_the_topology(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, "  boom: {kind: crasher, crash_after_s: 0.01}", max_restarts=2))
    runtime = SingleProcessRuntime(spec, handle_signals=False)
    result = anyio.run(runtime.run, backend="asyncio")
    assert not result.ok and result.exit_code == 1
    assert "actor 'boom' replica 0 crashed 3 times" in result.message
    assert "deliberate crash" in result.message
    assert lifecycle(result.run_dir, "boom") == ["start", "run", "stop"] * 3


def test_replica_still_crashing_when_the_duration_ends_fails_the_run(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, "  boom: {kind: crasher, crash_after_s: 0.01}", max_restarts=1000))
    runtime = SingleProcessRuntime(spec, handle_signals=False)
    result = anyio.run(lambda: runtime.run(duration_s=1.0), backend="asyncio")
    assert not result.ok and result.exit_code == 1, result.message
    assert result.message.startswith("stopped (--duration 1s elapsed) with replicas that were crashing, not running:")
    assert "boom[0] crashed" in result.message and "deliberate crash (test kind 'crasher')" in result.message
