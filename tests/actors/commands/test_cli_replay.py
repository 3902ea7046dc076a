"""`flywheel replay`: a report by domain (markdown, JSON, PNG) with throughput; user mistakes are one line."""

from __future__ import annotations

from pathlib import Path

import anyio
import orjson
import pytest
from click.testing import CliRunner

from tests.actors.replay._support import other_weights, record_run, replay_spec
from topology.cli import main

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
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = orjson.loads((out / "report.json").read_bytes())
    echo = report["domains"]["echo"]
    assert echo["replayed_mean_reward"] == 1.0 and echo["agreement"] == 1.0
    assert echo["against_mean_reward"] < 1.0
    assert report["throughput"]["replay_tokens_per_s"] > 0 and report["throughput"]["engine_tokens_per_s"] > 0
    assert "tokens/s" in result.output and "| echo |" in result.output
    assert (out / "report.png").stat().st_size > 0 and (out / "report.md").is_file()


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
