"""Helpers shared by the runtime and CLI tests: spec files, the `flywheel` CLI as a process, waiting."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil

T = TypeVar("T")

SPEC = """\
name: rt-test
bus: {{embedded: true}}
runtime:
  run_dir: runs
  restart: {{max_restarts: {max_restarts}, window_s: 60, backoff_s: 0.05, backoff_max_s: 0.2}}
  heartbeat_s: 0.2
policy: {{model: "builtin:tiny-gpt"}}
actors:
{actors}
"""
TICK_TALLY = "  ticker: {interval_s: 0.05, resources: {num_cpus: 0.5}}\n  tally: {replicas: 1}"


def write_spec(folder: Path, actors: str = TICK_TALLY, *, max_restarts: int = 3) -> Path:
    path = folder / "spec.yaml"
    path.write_text(SPEC.format(actors=actors, max_restarts=max_restarts))
    return path


def start_up(spec: Path, *args: str) -> subprocess.Popen[str]:
    """`flywheel up SPEC ARGS` as a child process (stdout and stderr captured, text)."""
    cmd = [sys.executable, "-c", "from topology.cli import main; main()", "up", str(spec), "--every", "0.5", *args]
    return subprocess.Popen(cmd, cwd=spec.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 30.0, every_s: float = 0.2) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")


def status_json(run_dir: Path) -> dict[str, Any]:
    from click.testing import CliRunner

    from topology.cli import main

    result = CliRunner().invoke(main, ["status", str(run_dir), "--json"])
    doc: dict[str, Any] = json.loads(result.output)
    return doc


def live_rows(run_dir: Path, states: tuple[str, ...] = ("running",)) -> list[dict[str, Any]] | None:
    """Status rows once every replica reports one of ``states``, else None."""
    if not (run_dir / "run.json").exists():
        return None
    doc = status_json(run_dir)
    rows: list[dict[str, Any]] = doc["replicas"]
    if doc["live"] and rows and all(r["state"] in states for r in rows):
        return rows
    return None


def lifecycle(run_dir: Path, actor: str, replica: int = 0) -> list[str]:
    path = run_dir / "state" / actor / str(replica) / "lifecycle.txt"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def gone(pids: list[int]) -> bool:
    return not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
