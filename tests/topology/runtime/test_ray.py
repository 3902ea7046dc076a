"""RayRuntime on a local Ray instance (2 CPUs): replicas as Ray actors, restarts, and the gloo weight group.

One Ray instance serves the whole module (starting one takes seconds); every test stops its topology, and the
module fixture shuts Ray down, so no Ray process outlives the module.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.topology.runtime._helpers import lifecycle, write_spec
from topology import load_spec
from topology.runtime import RayRuntime, ReplicaStatus, RunResult
from topology.runtime._ray import LOCAL_RAY_SYSTEM_CONFIG, ray_init_options

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one worker, one Ray instance

KINDS = "tests.topology.runtime._kinds,tests.topology.runtime._weight_kinds"
WEIGHTS = """\
  sender: {kind: wsender, interval_s: 1.0, resources: {num_cpus: 0.5}}
  receiver: {kind: wreceiver, replicas: 2, resources: {num_cpus: 0.5}}"""
TINY = 'policy: {model: "builtin:tiny-gpt", config: {n_layer: 1, n_embd: 32, n_head: 2, block_size: 64}}'


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=100 * 2**20,
        log_to_driver=False,
        configure_logging=False,
        _system_config=dict(LOCAL_RAY_SYSTEM_CONFIG),  # as RayRuntime starts one (ray.init adds to the dict)
    )
    try:
        yield
    finally:
        ray.shutdown()


def test_workers_of_a_local_ray_run_at_the_drivers_priority(ray_instance: None) -> None:
    """Ray starts its workers at nice 15: beside two busy loops (`just stress`) every actor starved, and the embedded
    default under Ray ran out of its test's time (bench/RESULTS.md, 2026-12-07)."""
    import ray

    @ray.remote
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(niceness.remote()) == os.nice(0)


def test_only_a_local_instance_gets_the_system_config() -> None:
    local = ray_init_options(None, {"num_cpus": 2}, {})
    assert local["_system_config"] == {"worker_niceness": 0} and local["num_cpus"] == 2
    mine = ray_init_options(None, {"_system_config": {"worker_niceness": 5, "x": 1}}, {})
    assert mine["_system_config"] == {"worker_niceness": 5, "x": 1}  # the caller's own settings win
    for address, env in (("auto", {}), (None, {"RAY_ADDRESS": "ray://head:10001"})):  # a cluster joined: none
        assert "_system_config" not in ray_init_options(address, {}, env)


@pytest.fixture
def ray_kinds(kinds_env: None, monkeypatch: pytest.MonkeyPatch, ray_instance: None) -> None:
    import importlib

    monkeypatch.setenv("FLYWHEEL_PLUGINS", KINDS)
    module = "tests.topology.runtime._weight_kinds"  # registered again per test: kinds_env takes test kinds out after
    if module in sys.modules:
        importlib.reload(sys.modules[module])
    else:
        importlib.import_module(module)


async def _run_until(runtime: RayRuntime, probe: Any, timeout_s: float) -> tuple[RunResult, Any]:
    """Run the topology, call ``await probe(runtime)`` once it is up, stop it; the probe's value comes back."""
    value: Any = None

    async def drive() -> None:
        nonlocal value
        await runtime.started.wait()
        try:
            with anyio.fail_after(timeout_s):
                value = await probe(runtime)
        finally:
            runtime.request_stop("test done")

    async with anyio.create_task_group() as tg:
        tg.start_soon(drive)
        result = await runtime.run()
    return result, value


async def _wait(
    runtime: RayRuntime, what: str, ok: Any, within_s: float = float("inf")
) -> dict[tuple[str, int], ReplicaStatus]:
    deadline = anyio.current_time() + within_s
    while True:
        records = {(r.actor, r.replica): r for r in await runtime.statuses()}
        if ok(records):
            return records
        if runtime.stopping:
            raise AssertionError(f"the topology stopped while waiting for {what}")
        if anyio.current_time() > deadline:
            raise AssertionError(f"no {what} within {within_s:.0f} s; last heartbeats: {records}")
        await anyio.sleep(0.3)


@pytest.mark.timeout(90)
def test_replicas_run_as_ray_actors_and_a_killed_one_is_restarted(ray_kinds: None, tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, max_restarts=3))
    runtime = RayRuntime(spec, handle_signals=False)

    async def probe(rt: RayRuntime) -> tuple[int, int]:
        records = await _wait(
            rt, "tally consuming", lambda r: r.get(("tally", 0)) and r[("tally", 0)].counters.get("consumed", 0) >= 5
        )
        victim = records[("tally", 0)].pid
        assert victim not in (0, os.getpid())
        os.kill(victim, signal.SIGKILL)  # the Ray worker process, not a polite stop
        after = await _wait(
            rt,
            "tally restarted and consuming again",
            lambda r: (
                r[("tally", 0)].restarts >= 1
                and r[("tally", 0)].state == "running"
                and r[("tally", 0)].pid != victim
                and r[("tally", 0)].counters.get("consumed", 0) >= 3
            ),
        )
        return victim, after[("tally", 0)].pid

    result, (victim, new_pid) = anyio.run(_run_until, runtime, probe, 70.0)
    assert result.ok, result.message
    assert new_pid != victim
    assert lifecycle(result.run_dir, "ticker") == ["start", "run", "drain", "stop"]
    assert lifecycle(result.run_dir, "tally")[-4:] == ["start", "run", "drain", "stop"]
    assert "Ray actor" in (result.run_dir / "logs" / "tally-0.log").read_text()


@pytest.mark.timeout(300)
def test_gloo_weight_group_across_ray_actors_reforms_after_a_receiver_dies(ray_kinds: None, tmp_path: Path) -> None:
    """Two receivers in a gloo group; one is SIGKILLed, Ray restarts it and it joins a later version's group.

    Each phase has its own bound. The first is start-up (three cold Ray workers importing torch: 3 s on an idle
    machine, 30-40 s beside a busy loop per core), which this test does not measure. The second is one cold restart
    plus the group's re-forming: the cold start this run just measured, plus the join timeout, plus a few sender
    intervals. The join timeout is in it because the kill can land inside a version's broadcast: the sender sees that
    version fail at once, but the surviving receiver stays in its group until the version's window closes, and the
    next version (sent to that survivor alone, as the victim is restarting) can finish only after that. A re-form
    that hangs or needs more than that fails, however slow the machine is.
    """
    path = write_spec(tmp_path, WEIGHTS, max_restarts=3)
    path.write_text(path.read_text().replace('policy: {model: "builtin:tiny-gpt"}', TINY))
    runtime = RayRuntime(load_spec(path), handle_signals=False)

    from actors.weights._distributed import join_timeout_s

    join_timeout = join_timeout_s()  # the wait a survivor of a failed broadcast can sit out

    def verified(records: dict[tuple[str, int], ReplicaStatus], key: tuple[str, int], n: int) -> bool:
        return key in records and records[key].counters.get("verified", 0) >= n

    async def probe(rt: RayRuntime) -> dict[tuple[str, int], ReplicaStatus]:
        began = anyio.current_time()
        first = await _wait(
            rt,
            "both receivers swapped 2 versions",
            lambda r: verified(r, ("receiver", 0), 2) and verified(r, ("receiver", 1), 2),
            within_s=180.0,
        )
        cold_start = anyio.current_time() - began
        os.kill(first[("receiver", 1)].pid, signal.SIGKILL)
        return await _wait(
            rt,
            "the restarted receiver back in the group",
            lambda r: (
                r[("receiver", 1)].restarts >= 1 and verified(r, ("receiver", 1), 1) and verified(r, ("receiver", 0), 4)
            ),
            within_s=cold_start + join_timeout + 20.0,
        )

    result, records = anyio.run(_run_until, runtime, probe, 280.0)
    assert result.ok, result.message
    for key in (("receiver", 0), ("receiver", 1)):
        assert records[key].counters.get("mismatched", 0) == 0
    assert records[("receiver", 1)].counters["version"] > 2, "re-joined a later version's group"
    # the sender's heartbeat says how many members the last version went to (a failure's dump shows who was asked)
    assert records[("sender", 0)].counters.get("weights.members", 0) >= 1, records[("sender", 0)].counters


def test_a_replica_no_node_can_hold_stops_the_run_with_one_message(ray_kinds: None, tmp_path: Path) -> None:
    actors = "  ticker: {resources: {num_cpus: 0.5, custom: {learner_node: 1}}}\n  tally: {}"
    runtime = RayRuntime(load_spec(write_spec(tmp_path, actors)), handle_signals=False)
    result = anyio.run(runtime.run)
    assert not result.ok
    assert "actor 'ticker' asks for {CPU=0.5, learner_node=1}" in result.message
    assert "which no node of the Ray cluster has" in result.message


def test_replicas_that_need_more_than_the_cluster_holds_stop_the_run_with_one_message(
    ray_kinds: None, tmp_path: Path
) -> None:
    """Three CPUs asked of a two-CPU cluster: the replica Ray had no room for waited for ever, pending, and the run
    ended "ok" at --duration without it ever having started."""
    actors = "  ticker: {replicas: 2, resources: {num_cpus: 1}}\n  tally: {}"
    runtime = RayRuntime(load_spec(write_spec(tmp_path, actors)), handle_signals=False)
    result = anyio.run(runtime.run)
    assert not result.ok
    assert "the actors ask for {CPU=3} in all (each replica's resources × replicas), the Ray cluster has {CPU=2}" in (
        result.message
    )


@pytest.mark.timeout(300)
def test_the_embedded_default_runs_under_ray_versions_advance_and_a_killed_generator_rejoins(
    ray_instance: None, tmp_path: Path
) -> None:
    """specs/embedded.yaml itself (only made shorter: a 20-step warm start, small batches) as Ray actors; the
    generator's Ray worker is SIGKILLed mid-run, restarted by Ray, and the loop goes on with newer versions."""
    import json

    root = Path(__file__).resolve().parents[3]
    overrides = {
        "include": str(root / "specs" / "embedded.yaml"),
        "runtime": {"kind": "ray", "run_dir": str(tmp_path / "runs")},
        "policy": {"warm_start": {"steps": 20}},
        "actors": {"learner": {"batch_size": 16, "eval_every_steps": 0, "checkpoint_every_steps": 5}},
    }
    (tmp_path / "spec.yaml").write_text(json.dumps(overrides))
    spec = load_spec(tmp_path / "spec.yaml")
    assert spec.runtime.kind == "ray" and set(spec.actors) == {"source", "generator", "verify", "learner"}
    runtime = RayRuntime(spec, handle_signals=False)

    def version(records: dict[tuple[str, int], ReplicaStatus]) -> float:
        return float(records[("generator", 0)].counters.get("version", 0))

    def applied(records: dict[tuple[str, int], ReplicaStatus]) -> float:
        return float(records[("learner", 0)].counters.get("samples_applied", 0))

    async def probe(rt: RayRuntime) -> dict[str, Any]:
        before = await _wait(
            rt,
            "generators serving a trained version",
            lambda r: r.get(("generator", 0)) and r.get(("learner", 0)) and version(r) >= 3 and applied(r) >= 32,
        )
        victim = before[("generator", 0)].pid
        os.kill(victim, signal.SIGKILL)
        after = await _wait(
            rt,
            "the generator restarted and the loop going on",
            lambda r: (
                r[("generator", 0)].restarts >= 1
                and r[("generator", 0)].pid != victim
                and version(r) >= version(before) + 2
                and applied(r) >= applied(before) + 32
            ),
        )
        return {"victim": victim, "before": before, "after": after}

    result, seen = anyio.run(_run_until, runtime, probe, 260.0)
    assert result.ok, result.message
    after = seen["after"]
    assert after[("learner", 0)].counters["phase"] == "rl" and after[("learner", 0)].restarts == 0
    assert float(after[("verify", 0)].counters.get("rollouts", 0)) > 0
    assert "Ray actor" in (result.run_dir / "logs" / "learner-0.log").read_text()
    assert (result.run_dir / "export" / "model.safetensors").exists()
