"""Kill -9 the producer (gateway stand-in), the recorder and nats-server mid-traffic; restart them all.

Afterwards every request and feedback event whose publish JetStream acknowledged is in the parquet files
exactly once, and nothing is there twice.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest

from actors.protocol import read_recordings
from tests.actors.recorder._support import recorder_spec
from topology.bus import Bus, EmbeddedNats

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(script: str, *args: object, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, str(HERE / script), *map(str, args)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def acked(path: Path) -> list[tuple[str, str]]:
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(row[0], row[1]) for row in rows if len(row) == 2]


def wait_for(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def kill9(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


@pytest.mark.timeout(90)
def test_kill_minus_nine_everything_loses_and_duplicates_nothing_acknowledged(tmp_path: Path) -> None:
    spec = recorder_spec(tmp_path, flush=0.1)
    port, nats_dir, acked_file, log = free_port(), tmp_path / "nats", tmp_path / "acked.txt", tmp_path / "procs.log"
    server = EmbeddedNats(nats_dir, port=port).start()
    procs: list[subprocess.Popen[bytes]] = []
    try:

        async def channels() -> None:
            async with await Bus.connect(server.url, topology=spec.name, name="setup") as bus:
                for channel in ("traffic", "feedback", "scored"):
                    await bus.ensure_channel(channel)

        anyio.run(channels, backend="asyncio")
        url = server.url
        recorder = spawn("_recorder_proc.py", spec.source_path, url, tmp_path, log=log)
        publisher = spawn("_publisher_proc.py", url, spec.name, acked_file, 0, 100_000, 0.01, log=log)
        procs += [recorder, publisher]
        wait_for(lambda: read_recordings(tmp_path / "recordings", "traffic").height >= 60, 30, "first files")
        kill9(recorder)  # the recorder dies with a buffer and perhaps a flush in flight
        seen = len(acked(acked_file))
        wait_for(lambda: len(acked(acked_file)) >= seen + 100, 30, "more publishes")
        kill9(publisher)  # the gateway dies mid-stream
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)  # and so does nats-server, with JetStream on disk
        server.stop()
        server = EmbeddedNats(nats_dir, port=port).start()
        assert server.url == url
        recorder = spawn("_recorder_proc.py", spec.source_path, url, tmp_path, log=log)
        publisher = spawn("_publisher_proc.py", url, spec.name, acked_file, 1_000_000, 150, 0.002, log=log)
        procs += [recorder, publisher]
        assert publisher.wait(60) == 0
        expected = Counter(acked(acked_file))
        assert len(expected) >= seen + 100 + 300

        def recorded() -> Counter[tuple[str, str]]:
            rows: Counter[tuple[str, str]] = Counter()
            for channel in ("traffic", "feedback"):
                frame = read_recordings(tmp_path / "recordings", channel)
                rows.update((channel, rid) for rid in frame["request_id"].to_list())
            return rows

        wait_for(lambda: set(expected) <= set(recorded()), 45, "every acked event in parquet")
        recorder.send_signal(signal.SIGTERM)
        assert recorder.wait(20) == 0
        final = recorded()
        duplicated = {key: n for key, n in final.items() if n > 1}
        assert not duplicated, f"recorded more than once: {sorted(duplicated)[:10]}"
        missing = set(expected) - set(final)
        assert not missing, f"acknowledged but not recorded: {sorted(missing)[:10]}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        server.stop()
