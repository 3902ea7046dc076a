"""A run survives its bad day: nats-server killed mid-run, `flywheel up` and everything under it killed with SIGKILL
then resumed, and a local process without the run's token refused by its bus. Real processes throughout: the
`flywheel up` CLI, its replicas (test kinds ``ticker`` → ``tally`` with on-disk ledgers) and nats-server.

"Nothing acknowledged is lost" is checked on the ledgers: every id whose publish JetStream acknowledged to the
ticker (``published.txt``) reaches the tally (``consumed.txt``), whatever was killed in between.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from tests.topology.runtime._helpers import gone, live_rows, status_json, wait_for, write_spec
from topology.bus import Bus, BusError, EmbeddedNats
from topology.runtime import bus_token, read_run_info

pytestmark = [pytest.mark.usefixtures("kinds_env"), pytest.mark.timeout(150)]


def start(spec: Path, *args: str) -> subprocess.Popen[str]:
    """`flywheel up` as the leader of its own process group (so the test can kill the group, as a user would)."""
    cmd = [sys.executable, "-c", "from topology.cli import main; main()", "up", "--every", "0.5", *args]
    if spec.is_file():
        cmd.insert(4, str(spec))
    return subprocess.Popen(
        cmd, cwd=spec.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def run_json(run_dir: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
    return doc


def ledger(run_dir: Path, actor: str, name: str) -> list[str]:
    path = run_dir / "state" / actor / "0" / name
    return path.read_text().split() if path.exists() else []


def consumed_since(run_dir: Path, count: int) -> bool:
    return len(ledger(run_dir, "tally", "consumed.txt")) > count


def stop(up: subprocess.Popen[str], timeout_s: float = 40) -> str:
    if up.poll() is None:
        up.send_signal(signal.SIGINT)
    try:
        out, err = up.communicate(timeout=timeout_s)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.communicate()
    assert up.returncode == 0, err
    return out


def the_run(tmp_path: Path) -> Path:
    latest = tmp_path / "runs" / "latest"
    return wait_for("the run dir", lambda: latest.resolve() if (latest / "run.json").exists() else None)


def assert_nothing_acked_lost(run_dir: Path) -> None:
    """Every message whose publish was acknowledged reached the tally, or is still in the stream waiting for it. A
    stop signals every replica at once, so the ticker's last publishes can land after the tally stopped pulling, or
    one the tally had fetched stays un-acked: they are kept for the next resume, not lost (about 1 run in 15 on a
    loaded machine ended one way or the other)."""
    published = ledger(run_dir, "ticker", "published.txt")
    consumed = set(ledger(run_dir, "tally", "consumed.txt"))
    assert published, "the ticker published nothing"
    missing = {mid for mid in published if mid not in consumed}
    if missing:
        missing -= waiting_in_the_stream(run_dir, "ticks", "tally", missing)
    assert not missing, (
        f"{len(missing)} of {len(published)} acknowledged messages lost: not consumed, not in the stream"
    )


def waiting_in_the_stream(run_dir: Path, channel: str, group: str, wanted: set[str]) -> set[str]:
    """Which of ``wanted`` a stopped run's store still holds for consumer ``group``: stored after the group's ack
    floor, so never delivered yet, or delivered and not acked (redelivered after ``ack_wait``: a message the tally
    had fetched when the stop came). Read from the run's own store, served by a fresh nats-server (the run's token),
    message by message: reading as the group would not see a delivered one before its ack_wait ran out."""
    token = bus_token(read_run_info(run_dir))

    async def read(url: str) -> set[str]:
        found: set[str] = set()
        async with await Bus.connect(url, topology="rt-test", name="inspector", token=token) as bus:
            js = bus.nc.jetstream()
            stream = bus.stream(channel)
            last = (await js.stream_info(stream)).state.last_seq
            floor = (await js.consumer_info(stream, group)).ack_floor.stream_seq or 0
            for seq in range(floor + 1, last + 1):
                message = await js.get_msg(stream, seq)
                found.add((message.headers or {}).get("Nats-Msg-Id", ""))
        return found & wanted

    with EmbeddedNats(run_dir / "nats", token=token) as server:
        return anyio.run(read, server.url, backend="asyncio")


def test_killed_nats_server_comes_back_on_its_port_and_the_run_goes_on(tmp_path: Path) -> None:
    up = start(write_spec(tmp_path), "--duration", "60")
    try:
        run_dir = the_run(tmp_path)
        wait_for("replicas running", lambda: live_rows(run_dir))
        before = run_json(run_dir)
        wait_for("traffic", lambda: consumed_since(run_dir, 10))
        os.kill(before["nats_pid"], signal.SIGKILL)
        after = wait_for(
            "a new nats-server", lambda: (doc := run_json(run_dir))["bus_restarts"] == 1 and doc, timeout_s=30
        )
        assert after["nats_pid"] != before["nats_pid"] and after["bus_url"] == before["bus_url"]
        bus = status_json(run_dir)["bus"]  # flywheel status shows the server beside the replicas
        assert bus["pid"] == after["nats_pid"] and bus["restarts"] == 1 and bus["state"] == "running"
        seen = len(ledger(run_dir, "tally", "consumed.txt"))
        wait_for("traffic after the restart", lambda: consumed_since(run_dir, seen + 20), timeout_s=30)
        rows = wait_for("replicas running", lambda: live_rows(run_dir))
        assert {r["restarts"] for r in rows} == {0}  # the replicas rode it out on their connections
    finally:
        out = stop(up)
    # the final line tells of the bus's restart as of a replica's crash (it counted only those, and said nothing)
    assert "stopped cleanly" in out and "after 1 nats-server restart, all recovered" in out, out
    assert "nats-server died once (last: killed by SIGKILL)" in out, out
    assert_nothing_acked_lost(run_dir)


def test_sigkill_of_the_whole_tree_then_resume_continues_the_run(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    up = start(spec)
    try:
        run_dir = the_run(tmp_path)
        rows = wait_for("replicas running", lambda: live_rows(run_dir))
        wait_for("traffic", lambda: consumed_since(run_dir, 60))
        first = run_json(run_dir)
        pids = [first["pid"], first["nats_pid"], *(r["pid"] for r in rows)]
    finally:
        os.killpg(up.pid, signal.SIGKILL)  # `flywheel up` and its process group; the rest must die with it
        up.communicate()
    assert wait_for("every process of the run gone", lambda: gone(pids), timeout_s=10)
    consumed_before = ledger(run_dir, "tally", "consumed.txt")

    resumed = start(tmp_path / "runs", "--resume", "latest")  # found through ./runs/latest, the spec from run.json
    try:
        wait_for("replicas running again", lambda: run_json(run_dir)["pid"] == resumed.pid and live_rows(run_dir))
        wait_for("traffic after the resume", lambda: consumed_since(run_dir, len(consumed_before) + 20))
        second = run_json(run_dir)
        assert second["resumes"] == 1 and second["first_started_at"] == first["started_at"]
        refused = start(spec, "--resume", str(run_dir))  # a live run is not resumed twice
        _, err = refused.communicate(timeout=60)
        assert refused.returncode == 1 and "is live" in err
    finally:
        out = stop(resumed)
    assert f"resuming {run_dir}" in out
    assert (tmp_path / "runs" / "latest").resolve() == run_dir
    assert_nothing_acked_lost(run_dir)
    # the consumer group's cursor survived: what was acked before the kill is not delivered again. What comes back
    # is what was in flight — the tally's pull window (17 at most) — and the acks of the last moments before
    # nats-server died (it persists a consumer's state within 100 ms; the ticker sends 20 a second); a lost cursor
    # would bring back all of the 60 and more
    again = [mid for mid in ledger(run_dir, "tally", "consumed.txt")[len(consumed_before) :] if mid in consumed_before]
    assert len(again) <= 30


def test_the_embedded_bus_refuses_a_client_without_the_run_token(tmp_path: Path) -> None:
    up = start(write_spec(tmp_path), "--duration", "60")
    try:
        run_dir = the_run(tmp_path)
        rows = wait_for("replicas running", lambda: live_rows(run_dir))
        info = run_json(run_dir)
        token_file = Path(info["token_file"])
        token = token_file.read_text().strip()
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert (run_dir / "nats" / "nats-server.conf").stat().st_mode & 0o777 == 0o600
        for pid in [info["pid"], info["nats_pid"], *(r["pid"] for r in rows)]:  # never on a command line
            assert token not in " ".join(psutil.Process(pid).cmdline())

        async def probe() -> None:
            with pytest.raises(BusError, match="Authorization Violation"):
                await Bus.connect(info["bus_url"], topology="rt-test", name="intruder", connect_timeout_s=5)
            with pytest.raises(BusError, match="Authorization Violation"):
                await Bus.connect(info["bus_url"], topology="rt-test", name="guess", token="x" * 43)
            async with await Bus.connect(info["bus_url"], topology="rt-test", name="owner", token=token) as bus:
                assert await bus.kv_get("fw_rt_test_status", "tally.0") is not None

        anyio.run(probe, backend="asyncio")
    finally:
        stop(up)


def test_resume_needs_a_run_dir_of_the_same_topology(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    (tmp_path / "runs" / "nothing-here").mkdir(parents=True)
    up = start(spec, "--resume", str(tmp_path / "runs" / "nothing-here"))
    _, err = up.communicate(timeout=60)
    assert up.returncode == 1 and "no run found" in err and "Traceback" not in err
    assert not (tmp_path / "runs" / "latest").exists()
    other = tmp_path / "runs" / "other-run"
    other.mkdir()
    (other / "run.json").write_text(json.dumps({**EMPTY_RUN, "topology": "other"}))
    up = start(spec, "--resume", str(other))
    _, err = up.communicate(timeout=60)
    assert up.returncode == 1 and "the run is topology 'other', the spec is 'rt-test'" in err
    assert "Traceback" not in err and "ExceptionGroup" not in err


EMPTY_RUN = {"bus_url": "nats://127.0.0.1:1", "pid": 1, "spec_path": "x", "started_at": 0.0, "heartbeat_s": 1.0}
