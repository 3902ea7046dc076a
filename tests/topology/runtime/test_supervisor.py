"""LocalRuntime through `flywheel up`: restarts after SIGKILL, the crash budget, graceful SIGTERM, no orphans."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.topology.runtime._helpers import (
    gone,
    lifecycle,
    live_rows,
    start_up,
    status_json,
    wait_for,
    write_spec,
)
from topology.bus import Bus, EmbeddedNats
from topology.runtime._rundir import run_token
from topology.runtime._status import read_status

pytestmark = pytest.mark.usefixtures("kinds_env")


def kill_tally_when_running(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """Once the run under ``tmp_path`` has every replica running, SIGKILL tally: (run dir, tally's row before)."""
    run_dir = wait_for(
        "the run dir",
        lambda: (
            (tmp_path / "runs" / "latest").resolve() if (tmp_path / "runs" / "latest" / "run.json").exists() else None
        ),
    )
    rows = wait_for("every replica running", lambda: live_rows(run_dir))
    tally = next(r for r in rows if r["actor"] == "tally")
    os.kill(tally["pid"], signal.SIGKILL)
    return run_dir, tally


def test_sigkilled_replica_is_restarted_and_messages_keep_flowing(tmp_path: Path) -> None:
    up = start_up(write_spec(tmp_path))
    try:
        run_dir, tally = kill_tally_when_running(tmp_path)

        def restarted() -> dict[str, object] | None:
            rows = live_rows(run_dir) or []
            row = next((r for r in rows if r["actor"] == "tally"), None)
            ok = row and row["restarts"] == 1 and row["pid"] != tally["pid"] and row["counters"].get("consumed", 0) > 0
            return row if ok else None

        row = wait_for("tally restarted and consuming again", restarted)
        assert row["state"] == "running"
        frozen = wait_for(
            "the restarted replica froze its heap",
            lambda: next(
                (r for r in live_rows(run_dir) or [] if r["actor"] == "tally" and r["counters"].get("gc_freezes")), None
            ),
        )
        assert frozen["counters"]["gc_frozen"] > 1000  # the imported modules' objects: out of the collector's way
        ticker = next(r for r in status_json(run_dir)["replicas"] if r["actor"] == "ticker")
        assert ticker["restarts"] == 0, "only the killed replica restarts"
        pids = [ticker["pid"], row["pid"], json.loads((run_dir / "run.json").read_text())["nats_pid"]]

        up.send_signal(signal.SIGTERM)
        out, err = up.communicate(timeout=30)
        assert up.returncode == 0, err
        assert "stopped cleanly (SIGTERM received) after 1 replica crash, all recovered: tally[0] crashed once" in out
        assert lifecycle(run_dir, "ticker")[-2:] == ["drain", "stop"]
        assert lifecycle(run_dir, "tally")[-2:] == ["drain", "stop"]
        assert "signal received" in (run_dir / "logs" / "tally-0.log").read_text()
        assert wait_for("children and nats-server gone", lambda: gone(pids), timeout_s=5)
        assert json.loads((run_dir / "run.json").read_text())["exit"] == "ok"
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()


def test_a_stop_right_after_one_kill_is_still_a_clean_stop(tmp_path: Path) -> None:
    """One kill of a running replica is no crash loop: a stop that comes before its next life is up (in the
    restart backoff, or while it starts) still ends the run cleanly, naming the crash."""
    up = start_up(write_spec(tmp_path))
    try:
        _, tally = kill_tally_when_running(tmp_path)
        wait_for("the kill seen", lambda: not psutil.pid_exists(tally["pid"]) or None)
        up.send_signal(signal.SIGTERM)
        out, err = up.communicate(timeout=30)
        assert up.returncode == 0, err
        assert "stopped cleanly (SIGTERM received) after 1 replica crash, all recovered: tally[0] crashed once" in out
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()


def _until_it_stops(up: subprocess.Popen[str], *, timeout_s: float) -> tuple[int, str]:
    """``flywheel up``'s exit status and stderr once it stopped by itself (killed after ``timeout_s``)."""
    try:
        _out, err = up.communicate(timeout=timeout_s)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    return up.returncode, err


def test_actor_that_keeps_crashing_stops_the_topology(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "  boom: {kind: crasher, crash_after_s: 0.05}", max_restarts=1)
    returncode, err = _until_it_stops(start_up(spec), timeout_s=60)
    assert returncode == 1
    assert "actor 'boom' replica 0 crashed 2 times within 60s" in err
    assert "deliberate crash (test kind 'crasher')" in err, "the message quotes the replica's log"
    run_dir = (tmp_path / "runs" / "latest").resolve()
    assert lifecycle(run_dir, "boom") == ["start", "run", "stop"] * 2, "stop() runs after a crash too"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["exit"].startswith("actor 'boom'")
    assert wait_for("nats-server gone", lambda: gone([info["nats_pid"]]), timeout_s=5)


def test_a_replica_out_of_restarts_is_recorded_as_failed(tmp_path: Path) -> None:
    """A replica whose crash budget ran out is not restarted: its status record says ``failed``, the state a resumed
    run's status and an operator read. Left at ``restarting``, it would promise a restart that never comes."""
    spec = write_spec(tmp_path, "  boom: {kind: crasher, crash_after_s: 0.05}", max_restarts=1)
    returncode, err = _until_it_stops(start_up(spec), timeout_s=60)
    assert returncode == 1, err
    run_dir = (tmp_path / "runs" / "latest").resolve()

    async def records() -> list[Any]:  # the stopped run's own bus store, read back
        token = run_token(run_dir)
        async with (
            EmbeddedNats(run_dir / "nats", token=token) as server,
            await Bus.connect(server.url, topology="rt-test", name="check", token=token) as bus,
        ):
            return await read_status(bus, "rt-test", [("boom", 0)])

    (record,) = asyncio.run(records())
    assert record.state == "failed" and record.restarts == 1, record
    assert record.error and "deliberate crash" in record.error


def test_a_run_whose_actors_all_finished_ends_cleanly(tmp_path: Path) -> None:
    """A replica whose ``run()`` returned has done its work (a bounded job, an evaluation): it is not a crash to
    restart, and once every replica finished the run stops by itself with status 0 — not one that runs on, doing
    nothing, until someone stops it, nor one that starts the finished work again and again."""
    spec = write_spec(tmp_path, "  done: {kind: finisher}\n  also: {kind: finisher, replicas: 2}")
    up = start_up(spec)
    try:
        out, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 0, err
    assert "stopped cleanly (every actor finished)" in out, out + err
    run_dir = (tmp_path / "runs" / "latest").resolve()
    for actor, replica in (("done", 0), ("also", 0), ("also", 1)):
        assert lifecycle(run_dir, actor, replica)[:2] == ["start", "run"]
        assert lifecycle(run_dir, actor, replica).count("run") == 1, "finished work is not started again"
    assert "replica crashed" not in err


def test_a_crashed_replica_holding_a_thread_still_exits_and_is_restarted(tmp_path: Path) -> None:
    """A crashed verify actor whose verifier calls still waited in worker threads never exited (the interpreter
    joins them), so it sat 'crashed' and STALE and was never restarted. Its process now exits after a grace."""
    spec = write_spec(tmp_path, "  boom: {kind: crasher, crash_after_s: 0.05, leave_thread_s: 600}", max_restarts=1)
    returncode, err = _until_it_stops(start_up(spec), timeout_s=90)
    assert returncode == 1, err
    assert "actor 'boom' replica 0 crashed 2 times within 60s" in err


def test_each_crash_says_why_and_a_run_stopped_while_crash_looping_is_not_clean(tmp_path: Path) -> None:
    """The crasher dies 50 ms into every life. The stop comes once two crashes were told (each with its reason): the
    replica is in a crash loop, so the run is not clean, whatever moment of a life the stop lands in."""
    spec = write_spec(tmp_path, "  boom: {kind: crasher, crash_after_s: 0.05}", max_restarts=1000)
    up = start_up(spec, "--duration", "600")
    crashed: list[str] = []
    try:
        assert up.stderr is not None
        for line in up.stderr:
            crashed += [line] if "replica crashed" in line else []
            if len(crashed) == 2:
                up.send_signal(signal.SIGTERM)
                break
        _out, rest = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    err = "".join(crashed) + rest
    assert len(crashed) == 2, err
    assert all("RuntimeError: deliberate crash (test kind 'crasher')" in line for line in crashed), crashed
    assert up.returncode == 1, err
    assert "stopped (SIGTERM received) with replicas that were crashing, not running: boom[0] crashed" in err
    assert "exited with status 1: RuntimeError: deliberate crash" in err


def test_a_replica_killed_at_the_stop_is_named_not_called_a_clean_stop(tmp_path: Path) -> None:
    """Ctrl-C while a replica could not drain (the learner in its warm start) logged "killing replicas … no drain
    within 10s" and then said "stopped cleanly": the final line names who was killed without a drain, and why."""
    actors = "  ticker: {interval_s: 0.05}\n  crasher: {crash_after_s: 600}"  # its run() never looks at the stop
    up = start_up(write_spec(tmp_path, actors), "--duration", "3", "--drain-timeout", "1")
    try:
        out, err = up.communicate(timeout=60)
        assert up.returncode == 0, err
        assert "stopped (--duration 3s elapsed); killed without a drain (no drain within 1s): crasher[0]" in out
        assert "stopped cleanly" not in out
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()


def test_a_replica_log_past_its_limit_is_rotated(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    spec.write_text(spec.read_text().replace("  heartbeat_s: 0.2\n", "  heartbeat_s: 0.2\n  logs: {max_mb: 0.0001}\n"))
    up = start_up(spec)
    try:
        run_dir = wait_for("every replica running", lambda: (tmp_path / "runs" / "latest").resolve())
        wait_for("the ticker's log rotated", lambda: (run_dir / "logs" / "ticker-0.log.1").exists(), timeout_s=30)
        up.send_signal(signal.SIGTERM)
        _, err = up.communicate(timeout=30)
        assert up.returncode == 0, err
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()


def test_a_replica_log_that_cannot_be_written_does_not_bring_the_supervisor_down(tmp_path: Path) -> None:
    """On a full disk the line the supervisor writes into a replica's log before each life raised out of its
    supervision task: `flywheel up` died with a bare "[Errno 28] No space left on device", every replica SIGKILLed
    without a drain, the stop unrecorded. Here the replica's log is made a directory (it cannot be opened for writing)
    and the replica killed: the supervisor logs that the log was not written, starts the replica again, and stops
    on SIGTERM with its own verdict."""
    up = start_up(write_spec(tmp_path))
    try:
        run_dir, _ = kill_tally_when_running(tmp_path)  # a first restart: the run is under way
        wait_for("tally restarted", lambda: next((r for r in live_rows(run_dir) or [] if r["restarts"] == 1), None))
        log = run_dir / "logs" / "tally-0.log"
        log.unlink()
        log.mkdir()
        victim = next(r for r in live_rows(run_dir) or [] if r["actor"] == "tally")
        os.kill(victim["pid"], signal.SIGKILL)
        wait_for(
            "tally running again",
            lambda: next(
                (
                    r
                    for r in live_rows(run_dir) or []
                    if r["actor"] == "tally" and r["restarts"] == 2 and r["state"] == "running"
                ),
                None,
            ),
        )
        assert up.poll() is None, "the supervisor is still running"
        up.send_signal(signal.SIGTERM)
        out, err = up.communicate(timeout=60)
        assert "replica log not written" in err and "Is a directory" in err, err
        # stopped by its own verdict (two kills in a few seconds read as a crash loop), not by an unhandled error
        assert "rt-test: stopped (SIGTERM received)" in out + err and "Error:" not in out + err, out + err
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
