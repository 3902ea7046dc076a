"""`flywheel replay`: a report by domain (markdown, JSON, PNG) with throughput; user mistakes are one line."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import orjson
import pytest
from click.testing import CliRunner
from safetensors.torch import save_file

from actors.policy import Policy
from actors.protocol import policy_of
from tests.actors.gate._support import expected_answers, gate_spec, record_traffic
from tests.actors.replay._support import PROMPTS, other_weights, record_many, record_run, replay_spec
from topology import Spec
from topology.cli import main
from topology.runtime._rundir import RunInfo, write_run_info

pytestmark = pytest.mark.timeout(120)


def test_replay_writes_a_report_against_another_version(tmp_path: Path) -> None:
    spec = replay_spec(tmp_path)
    run_dir = tmp_path / "run"
    anyio.run(lambda: record_run(spec, run_dir, version=1), backend="asyncio")
    other = other_weights(tmp_path / "other.safetensors")
    out = tmp_path / "report"
    args = [
        "replay",
        str(run_dir / "recordings"),
        "--spec",
        str(spec.source_path),
        "--weights",
        "v1",
        "--against",
        str(other),
        "--greedy",
        "--run-dir",
        str(run_dir),
        "--out",
        str(out),
        "--concurrency",
        "4",
        "--engine-throughput",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = orjson.loads((out / "report.json").read_bytes())
    echo = report["domains"]["echo"]
    assert echo["replayed_mean_reward"] == 1.0 and echo["agreement"] == 1.0
    assert echo["against_mean_reward"] < 1.0
    assert report["throughput"]["replay_tokens_per_s"] > 0 and report["throughput"]["engine_tokens_per_s"] > 0
    assert "tokens/s" in result.output and "| echo |" in result.output
    assert "verify_verdict" not in result.output, "logs at info: not a debug line per failed re-scored completion"
    assert (out / "report.png").stat().st_size > 0 and (out / "report.md").is_file()


def test_a_channels_folder_given_for_the_recordings_names_the_folder_to_give(tmp_path: Path) -> None:
    """`flywheel replay RUN/recordings/scored` (one channel's folder, which does hold parquet files) said only that
    nothing was recorded there."""
    spec = replay_spec(tmp_path)
    run_dir = tmp_path / "run"
    anyio.run(lambda: record_run(spec, run_dir, version=1), backend="asyncio")
    channel = run_dir / "recordings" / "scored"
    assert any(channel.rglob("*.parquet"))
    args = ["replay", str(channel), "--spec", str(spec.source_path), "--weights", "v1", "--run-dir", str(run_dir)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"give the recordings folder that holds it ({run_dir / 'recordings'}) or the run dir" in result.output


def test_unknown_version_is_a_one_line_error(tmp_path: Path) -> None:
    spec = replay_spec(tmp_path)
    run_dir = tmp_path / "run"
    anyio.run(lambda: record_run(spec, run_dir, version=1), backend="asyncio")
    args = [
        "replay",
        str(run_dir / "recordings"),
        "--spec",
        str(spec.source_path),
        "--weights",
        "v9",
        "--run-dir",
        str(run_dir),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert "version 9 not found" in result.output and "Traceback" not in result.output
    # the versions that are left, so a user need not list the folder (the gate keeps only a few pinned ones)
    assert result.output.rstrip().endswith(f"{run_dir / 'weights'} holds v1")


def test_ctrl_c_stops_a_long_replay_at_once_and_writes_no_report(tmp_path: Path) -> None:
    """Replay started a task per recorded sample: a Ctrl-C during a replay of a week's recordings waited for every
    one of them to be cancelled, or the replay ran on to its report. It stops now, says that nothing was written
    and exits 130."""
    spec = replay_spec(tmp_path)
    run_dir = tmp_path / "run"
    anyio.run(lambda: record_run(spec, run_dir, version=1), backend="asyncio")
    record_many(run_dir, 50_000)
    out = tmp_path / "report"
    args = ["replay", str(run_dir), "--spec", str(spec.source_path), "--run-dir", str(run_dir), "--weights", "v1"]
    cmd = [
        sys.executable,
        "-c",
        "from topology.cli import main; main()",
        *args,
        "--concurrency",
        "1",
        "--out",
        str(out),
    ]
    replay = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert replay.stderr is not None and "replaying 50,012 recorded samples" in replay.stderr.readline()
        time.sleep(2)  # into the replay itself
        replay.send_signal(signal.SIGINT)
        _out, err = replay.communicate(timeout=30)
    finally:
        if replay.poll() is None:
            replay.kill()
            replay.communicate()
    assert replay.returncode == 130, err
    assert f"replay interrupted (Ctrl-C): no report written to {out}" in err and "Traceback" not in err
    assert not out.exists()


def test_from_traffic_replays_users_requests_only_and_says_how_many_first(tmp_path: Path) -> None:
    """A service run records every training sample beside users' requests (tens of thousands in minutes), and
    they are newer: replaying the recordings replayed all of them, with nothing said until the report, and
    ``--limit`` took the newest, so users' requests fell out first. ``--from traffic`` keeps those alone."""
    spec, run_dir = _service_run(tmp_path)
    anyio.run(lambda: record_run(spec, run_dir, version=1), backend="asyncio")  # training samples, newer
    out = tmp_path / "report"
    args = ["replay", str(run_dir), "--from", "traffic", "--limit", "5", "--weights", "v1", "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = orjson.loads((out / "report.json").read_bytes())
    assert list(report["domains"]) == ["users"] and report["domains"]["users"]["samples"] == 5
    assert "replaying 5 recorded samples (5 traffic, 0 scored) with v1" in result.output
    assert "engine_tokens_per_s" not in report["throughput"]  # the bare engine's pass only with --engine-throughput
    both = ["replay", str(run_dir), "--weights", "v1", "--out", str(tmp_path / "both")]
    result = CliRunner().invoke(main, both)
    assert result.exit_code == 0, result.output
    n = len(PROMPTS)
    assert f"replaying {2 * n} recorded samples ({n} traffic, {n} scored) with v1; --from traffic" in result.output


def test_weights_that_are_not_a_safetensors_file_are_a_one_line_error(tmp_path: Path) -> None:
    """A path to the wrong file (the run's run.json, a torch .pt) as --weights: it raised safetensors' own
    'header too large' with a traceback."""
    _spec, run_dir = _service_run(tmp_path)
    wrong = run_dir / "run.json"
    result = CliRunner().invoke(main, ["replay", str(run_dir), "--weights", str(wrong), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: {str(wrong)!r} is not a safetensors file")
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def _service_run(tmp_path: Path, *, rated: int = len(PROMPTS)) -> tuple[Spec, Path]:
    """A stopped service run whose recordings hold users' requests answered at a pinned serving v1, the first
    ``rated`` of them rated 1 by their user; the domain's file holds the policy's greedy answers as what is
    expected."""
    spec = gate_spec(tmp_path, "{}")
    anyio.run(expected_answers, spec, backend="asyncio")
    run_dir = tmp_path / "runs" / "service-1"
    record_traffic(run_dir, [(p, 1, 1.0 if i < rated else None) for i, p in enumerate(PROMPTS)])
    pinned = run_dir / "weights" / "serving-v1"
    pinned.mkdir(parents=True)
    policy = Policy.from_spec(policy_of(spec))
    save_file({k: v.contiguous() for k, v in policy.state_dict().items()}, str(pinned / "model.safetensors"))
    info = RunInfo(spec.name, "nats://127.0.0.1:1", 0, str(spec.source_path), time.time(), 1.0, stopped_at=time.time())
    info.spec = dict(spec.data) if spec.data is not None else None
    write_run_info(run_dir, info)
    return spec, run_dir


def test_replay_scores_a_service_runs_own_traffic(tmp_path: Path) -> None:
    """A service's recordings hold users' requests (traffic, no verifier fields) and pinned serving versions: replay
    finds the run's spec and weights from the recordings path alone and scores each request through the domain's
    task of its prompt."""
    _spec, run_dir = _service_run(tmp_path)
    out = tmp_path / "report"
    args = ["replay", str(run_dir / "recordings"), "--weights", "v1", "--greedy", "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    users = orjson.loads((out / "report.json").read_bytes())["domains"]["users"]
    assert users["samples"] == users["scored"] == len(PROMPTS) and users["note"] == ""
    assert users["replayed_mean_reward"] == 1.0


def test_agreement_and_the_recorded_mean_are_over_the_rated_requests_only(tmp_path: Path) -> None:
    """Served traffic has a recorded outcome only where its user rated it: a request nobody rated neither agrees
    nor disagrees with its replay (agreement was divided by every scored request, so a third rated and all
    agreeing read 0.33), and the recorded mean says how many ratings it is over."""
    rated = len(PROMPTS) // 3
    _spec, run_dir = _service_run(tmp_path, rated=rated)
    out = tmp_path / "report"
    args = ["replay", str(run_dir / "recordings"), "--weights", "v1", "--greedy", "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    users = orjson.loads((out / "report.json").read_bytes())["domains"]["users"]
    assert users["scored"] == len(PROMPTS) and users["agreement"] == 1.0
    assert users["recorded_samples"] == rated
    assert users["recorded_mean_reward"] == users["replayed_mean_reward"] == 1.0
    assert f"| users | {len(PROMPTS)} | {len(PROMPTS)} | 1.000 (of {rated}) | 1.000 |" in result.output


def test_replay_of_a_run_whose_spec_is_gone_uses_the_copy_in_run_json(tmp_path: Path) -> None:
    spec, run_dir = _service_run(tmp_path)
    spec.source_path.unlink()  # the domain's users.jsonl stays beside it: relative paths still resolve there
    out = tmp_path / "report"
    args = ["replay", str(run_dir / "recordings"), "--weights", "v1", "--greedy", "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert f"the run's spec {spec.source_path} is gone; using the copy in {run_dir / 'run.json'}" in result.output
    assert orjson.loads((out / "report.json").read_bytes())["domains"]["users"]["replayed_mean_reward"] == 1.0


def test_a_domain_the_spec_replayed_with_does_not_have_is_said_so(tmp_path: Path) -> None:
    """Replayed with another spec (``--spec``) than the run's, users' requests of a domain that spec lacks were
    marked "no verifier", which sent the user looking at the verifier."""
    _spec, run_dir = _service_run(tmp_path)
    (tmp_path / "other").mkdir()
    other = replay_spec(tmp_path / "other")  # the same policy, domain echo only
    out = tmp_path / "report"
    args = ["replay", str(run_dir / "recordings"), "--spec", str(other.source_path), "--run-dir", str(run_dir)]
    result = CliRunner().invoke(main, [*args, "--weights", "v1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    users = orjson.loads((out / "report.json").read_bytes())["domains"]["users"]
    assert users["scored"] == 0 and users["note"] == "not a domain of the spec replayed with: compared by text only"


def test_run_dir_takes_a_runs_folder_as_every_command_does_and_a_wrong_one_is_one_line(tmp_path: Path) -> None:
    """`--run-dir runs` (the folder every other command takes) and a path that is not there were FileNotFoundError
    tracebacks."""
    spec = replay_spec(tmp_path)
    run_dir = tmp_path / "runs" / "replay-1"
    anyio.run(lambda: record_run(spec, run_dir, version=1), backend="asyncio")
    info = RunInfo(topology=spec.name, bus_url="nats://127.0.0.1:1", pid=0, spec_path=str(spec.source_path),
                   started_at=0.0, heartbeat_s=1.0, stopped_at=1.0)  # fmt: skip
    write_run_info(run_dir, info)
    (tmp_path / "runs" / "latest").symlink_to(run_dir.name)
    base = ["replay", str(run_dir / "recordings"), "--spec", str(spec.source_path), "--weights", "v1", "--greedy"]
    out = tmp_path / "report"
    result = CliRunner().invoke(main, [*base, "--run-dir", str(tmp_path / "runs"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "report.json").is_file()
    wrong = CliRunner().invoke(main, [*base, "--run-dir", str(tmp_path / "nowhere")])
    assert wrong.exit_code == 1 and "Traceback" not in wrong.output, wrong.output
    assert f"--run-dir {tmp_path / 'nowhere'}: no such folder" in wrong.output
