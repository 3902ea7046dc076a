"""Run a topology with ``flywheel up`` in child processes for a benchmark (or a test) that is its client.

``start(root, spec_text)`` writes the spec, starts ``flywheel up`` and returns once the gateway printed its URL;
``wait_healthy(url)`` waits for ``/healthz``; ``stop(proc)`` interrupts ``up`` (its replicas stop cleanly) and
kills it if it does not end in time. ``heartbeats(bus, topology)`` reads every replica's latest status.

Non-goal: a general process manager; one topology at a time, the gateway's URL read from ``up``'s output.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import httpx

from topology.bus import Bus
from topology.runtime._status import ReplicaStatus, read_status

ROOT = Path(__file__).resolve().parents[1]


def start(root: Path, spec_text: str, *, timeout_s: float = 180.0) -> tuple[subprocess.Popen[str], Path, str]:
    """``(process, run_dir, gateway_url)`` of ``flywheel up root/spec.yaml``; connect to its bus with
    ``topology.runtime.connect_run(run_dir, ...)`` (the embedded bus admits only the run's token)."""
    (root / "spec.yaml").write_text(spec_text)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from topology.cli import main; main()", "up", str(root / "spec.yaml"), "--every", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    run_dir, gateway_url = "", ""
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    try:
        while not gateway_url and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("flywheel up exited before the gateway listened")
            if line.startswith("run dir:"):
                run_dir = line.split(":", 1)[1].strip()
            elif line.startswith("gateway:"):
                gateway_url = line.split()[1]
        if not gateway_url:
            raise RuntimeError(f"the gateway did not report its URL within {timeout_s:g} s")
    except BaseException:
        stop(proc)
        raise
    # keep reading up's progress lines: over a long run a full pipe would block it
    threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
    return proc, Path(run_dir), gateway_url


def _drain(stream: IO[str]) -> None:
    for _ in stream:
        pass


def stop(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def wait_healthy(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get(url + "/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("the gateway never became healthy")


async def heartbeats(bus: Bus, replicas: list[tuple[str, int]]) -> dict[str, ReplicaStatus]:
    """The latest status record of each ``(actor, replica)``, by actor name."""
    return {status.actor: status for status in await read_status(bus, bus.topology, replicas)}
