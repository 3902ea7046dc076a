"""`flywheel up` / `flywheel status` end to end: --duration, status --json, bad specs, no run, --help."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.topology.runtime._helpers import (  # noqa: E402
    gone,
    lifecycle,
    live_rows,
    start_up,
    status_json,
    wait_for,
    write_spec,
)
from tests.topology.runtime.conftest import kinds_env  # noqa: E402,F401
from topology.cli import main  # noqa: E402


@pytest.mark.usefixtures("kinds_env")
def test_up_with_duration_stops_by_itself(tmp_path: Path) -> None:
    up = start_up(write_spec(tmp_path), "--duration", "3")
    try:
        out, err = up.communicate(timeout=40)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 0, err
    run_dir = (tmp_path / "runs" / "latest").resolve()
    assert f"run dir: {run_dir}" in out and "bus:     nats://127.0.0.1:" in out
    assert "stopped cleanly (--duration 3s elapsed)" in out
    info = json.loads((run_dir / "run.json").read_text())
    assert info["exit"] == "ok" and info["stopped_at"] >= info["started_at"]
    assert wait_for("nats-server gone", lambda: gone([info["nats_pid"]]), 5)
    after = status_json(run_dir)
    assert after["live"] is False and "stopped" in after["reason"]


@pytest.mark.usefixtures("kinds_env")
def test_status_shows_heartbeats_and_ctrl_c_drains(tmp_path: Path) -> None:
    up = start_up(write_spec(tmp_path), "--duration", "60")
    try:
        latest = tmp_path / "runs" / "latest"
        run_dir = wait_for("the run dir", lambda: latest.resolve() if (latest / "run.json").exists() else None)
        rows = wait_for("heartbeats of every replica", lambda: live_rows(run_dir))
        assert {(r["actor"], r["replica"]) for r in rows} == {("ticker", 0), ("tally", 0)}
        for row in rows:
            assert row["pid"] > 0 and row["restarts"] == 0 and not row["stale"]
            assert row["heartbeat_age_s"] < 5 and row["uptime_s"] is not None
        # the table form, found through the runs folder's `latest` link
        table = CliRunner().invoke(main, ["status", "--run-dir", str(tmp_path / "runs")])
        assert table.exit_code == 0 and "ticker" in table.output and "running" in table.output
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=30)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 0, err
    assert "stopped cleanly (SIGINT received)" in out
    assert lifecycle(run_dir, "tally") == ["start", "run", "drain", "stop"]
    assert wait_for("replicas gone", lambda: gone([r["pid"] for r in rows]), 5)


@pytest.mark.usefixtures("kinds_env")
def test_status_of_a_live_run_whose_bus_does_not_answer_says_so(tmp_path: Path) -> None:
    """With the run's nats-server frozen (SIGSTOP) `flywheel status` said "no live run … TimeoutError: " of a run whose
    supervisor was running, and `up`'s own view printed empty lines: both say the bus does not answer."""
    import os
    import time

    up = start_up(write_spec(tmp_path), "--duration", "60")
    try:
        latest = tmp_path / "runs" / "latest"
        run_dir = wait_for("the run dir", lambda: latest.resolve() if (latest / "run.json").exists() else None)
        wait_for("heartbeats of every replica", lambda: live_rows(run_dir))
        nats_pid = json.loads((run_dir / "run.json").read_text())["nats_pid"]
        os.kill(nats_pid, signal.SIGSTOP)
        try:
            result = CliRunner().invoke(main, ["status", str(run_dir)])
            time.sleep(5.0)  # `up`'s own view looks every 0.5 s meanwhile
        finally:
            os.kill(nats_pid, signal.SIGCONT)
        assert result.exit_code == 1
        assert f"its status cannot be read now at {run_dir}: its supervisor (pid " in result.output, result.output
        assert "is running, but its bus at nats://127.0.0.1:" in result.output and "did not answer within 5 s" in (
            result.output
        )
        assert "no live run" not in result.output
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
        assert "] the bus does not answer (" in out and "); the run goes on" in out  # not an empty line
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()


def test_up_rejects_an_invalid_spec_with_located_errors(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: Bad Name\npolicy: {model: 'builtin:tiny-gpt'}\nactors: {}\n")
    result = CliRunner().invoke(main, ["up", str(spec)])
    assert result.exit_code == 1
    assert f"{spec}:1:" in result.output and "name" in result.output
    assert "nothing was started" in result.output
    assert not (tmp_path / "runs").exists()


def test_status_without_a_run_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 1
    assert "no run found" in result.output and "Traceback" not in result.output
    # --json: the same keys as for a run, so `status --json | jq .live` works with no run too (it printed text)
    as_json = CliRunner().invoke(main, ["status", "--json"])
    assert as_json.exit_code == 1
    doc = json.loads(as_json.stdout)
    assert doc["live"] is False and "no run found" in doc["reason"] and doc["replicas"] == []
    assert set(doc) == {"run_dir", "topology", "bus_url", "live", "reason", "bus_unreachable", "replicas", "bus"}


def test_status_rows_have_the_same_keys_whether_a_replica_reported_yet_or_not() -> None:
    """A replica that had not reported yet had no `kind` in `status --json`."""
    import time

    from topology.cli._up import _rows
    from topology.runtime._status import ReplicaStatus

    now = time.time()
    reported = ReplicaStatus("source", 0, "source", "running", 12, 0, now - 5, now)
    rows = _rows([reported], [("source", 0), ("learner", 0)], 1.0, {"source": "source", "learner": "learner"})
    assert set(rows[0]) == set(rows[1]) and rows[1]["kind"] == "learner" and rows[1]["state"] == "pending"


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("[1, 2]", "expected a JSON object, got a list"),
        ('{"topology": "x"', "not JSON"),
        ('{"topology": "x"}', "it lacks bus_url, pid, spec_path, started_at, heartbeat_s"),
    ],
)
def test_a_folder_whose_run_json_is_not_one_is_a_one_line_error(tmp_path: Path, content: str, said: str) -> None:
    """A run.json that is not one (a stray file, one cut short by a full disk) was a JSONDecodeError or TypeError
    traceback from every command that read it."""
    (tmp_path / "run.json").write_text(content)
    result = CliRunner().invoke(main, ["status", str(tmp_path)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert f"{tmp_path / 'run.json'} is not a flywheel run.json: {said}" in result.output


def test_status_of_a_killed_run_whose_pid_another_process_has_now_says_it_is_gone(tmp_path: Path) -> None:
    """After a ``kill -9`` of the supervisor (or a reboot) its pid may belong to another process: the run read as
    live, and `status` tried its bus. No supervisor holds the run dir's lock: the run is not live."""
    import os

    from topology.runtime._rundir import RunInfo, write_run_info

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_run_info(run_dir, RunInfo("t", "nats://127.0.0.1:1", os.getpid(), "spec.yaml", 0.0, 1.0, {"a": 1}))
    after = status_json(run_dir)
    assert after["live"] is False and after["reason"].startswith(f"its supervisor (pid {os.getpid()}) is gone")


@pytest.mark.parametrize("command", ["up", "status"])
def test_help_explains_the_command(command: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.output


@pytest.mark.usefixtures("kinds_env")
def test_up_serves_every_replicas_counters_as_prometheus_metrics(tmp_path: Path) -> None:
    import httpx

    spec = write_spec(tmp_path)
    spec.write_text(spec.read_text().replace("  heartbeat_s: 0.2\n", "  heartbeat_s: 0.2\n  metrics_port: 0\n"))
    up = start_up(spec, "--duration", "60")
    try:
        assert up.stdout is not None
        url = ""
        while not url:
            line = up.stdout.readline()
            assert line, "flywheel up ended without printing the metrics URL"
            url = line.split("metrics: ", 1)[1].strip() if line.startswith("metrics: ") else ""

        def published() -> float | None:
            for line in httpx.get(url, timeout=5).text.splitlines():
                if line.startswith("flywheel_published{") and 'actor="ticker"' in line:
                    return float(line.rsplit(" ", 1)[1]) or None
            return None

        assert wait_for("the ticker's counter on the endpoint", published) > 0
        # a ticker publishing says nothing of whether the tally has finished starting (or written its first
        # heartbeat): asserted the moment the ticker's counter showed, this failed once beside busy cores
        tally = 'flywheel_replica_up{actor="tally",kind="tally",replica="0",state="running",topology="rt-test"} 1.0'
        shown: list[str] = []

        def tally_running() -> bool:
            text = httpx.get(url, timeout=5).text
            shown[:] = [line for line in text.splitlines() if line.startswith('flywheel_replica_up{actor="tally"')]
            return tally in shown

        try:
            wait_for("the tally running on the endpoint", tally_running)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the endpoint's tally lines: {shown}") from None
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=30)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 0


@pytest.mark.usefixtures("kinds_env")
def test_resuming_a_live_run_says_it_is_live_not_that_its_own_port_is_taken(tmp_path: Path) -> None:
    """`up --resume latest` of a live run checked the spec first, and the metrics port the run itself serves on was
    "taken": the error sent the user after another process. The run dir's lock is looked at first."""
    import os
    import socket

    from topology.runtime._rundir import create_run_dir, lock_run_dir

    with socket.socket() as metrics:  # the live run's own endpoint
        metrics.bind(("127.0.0.1", 0))
        metrics.listen()
        spec = write_spec(tmp_path)
        port = metrics.getsockname()[1]
        spec.write_text(
            spec.read_text().replace("  heartbeat_s: 0.2\n", f"  heartbeat_s: 0.2\n  metrics_port: {port}\n")
        )
        run = create_run_dir(tmp_path / "runs", "rt-test")
        info = {"topology": "rt-test", "bus_url": "nats://127.0.0.1:1", "pid": 1, "spec_path": str(spec)}
        (run / "run.json").write_text(json.dumps({**info, "started_at": 0.0, "heartbeat_s": 1.0}))
        held = lock_run_dir(run)
        try:
            result = CliRunner().invoke(main, ["up", "--resume", "latest", "--run-dir", str(tmp_path / "runs")])
        finally:
            os.close(held)
    assert result.exit_code == 1, result.output
    assert f"Error: --resume latest: the run at {run.resolve()} is live" in result.output, result.output
    assert "metrics_port" not in result.output


@pytest.mark.usefixtures("kinds_env")
@pytest.mark.parametrize("problem", ["another topology", "a live run"])
def test_a_run_that_cannot_be_resumed_is_one_line_not_a_traceback(tmp_path: Path, problem: str) -> None:
    """RunNotFound / RunLocked are raised inside `up`'s task group, so they reach the CLI in an exception group."""
    import os

    from topology.runtime._rundir import create_run_dir, lock_run_dir

    spec = write_spec(tmp_path)
    topology = "other" if problem == "another topology" else "rt-test"
    run = create_run_dir(tmp_path / "runs", topology)
    info = {"bus_url": "nats://127.0.0.1:1", "pid": 1, "spec_path": str(spec), "started_at": 0.0, "heartbeat_s": 1.0}
    (run / "run.json").write_text(json.dumps({**info, "topology": topology}))
    held = lock_run_dir(run) if problem == "a live run" else None
    try:
        result = CliRunner().invoke(main, ["up", str(spec), "--resume", str(run)])
    finally:
        if held is not None:
            os.close(held)
    assert result.exit_code == 1, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    expected = "the run is topology 'other', the spec is 'rt-test'" if problem == "another topology" else "is live"
    assert len(error) == 1 and expected in error[0], result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
