from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from topology.bus import Bus, BusError, EmbeddedNats, find_nats_server


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


def test_binary_comes_from_the_wheel_next_to_python() -> None:
    assert find_nats_server().parent == Path(sys.executable).parent


def test_sync_start_serves_loopback_and_stop_kills(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path) as server:
        pid = server.pid
        assert pid is not None and server.url.startswith("nats://127.0.0.1:")
        host, port = server.url.removeprefix("nats://").split(":")
        with socket.create_connection((host, int(port)), timeout=2) as sock:
            assert b'"jetstream":true' in sock.recv(65536)
        assert (tmp_path / "nats-server.log").exists()
    assert _wait_gone(pid)
    assert not server.running
    with pytest.raises(BusError, match="not running"):
        _ = server.url


@pytest.mark.anyio
async def test_async_context_manager_serves_jetstream(tmp_path: Path) -> None:
    async with EmbeddedNats(tmp_path) as server:
        pid = server.pid
        assert pid is not None
        async with await Bus.connect(server.url, topology="t", name="probe") as bus:
            await bus.ensure_channel("prompts")
            assert await bus.publish("prompts", "x", {}) != ""
    assert _wait_gone(pid)


def test_taken_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BusError, match="embedded nats-server exited"):
            EmbeddedNats(tmp_path, port=port).start()


def test_no_orphan_after_parent_is_sigkilled(tmp_path: Path, repo_root: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("_bus_server_owner.py")), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=repo_root,
        env={**os.environ, "PYTHONPATH": str(repo_root)},
    )
    try:
        assert owner.stdout is not None
        server_pid = int(owner.stdout.readline())
        assert not _gone(server_pid)
        owner.send_signal(signal.SIGKILL)
        owner.wait(5)
        assert _wait_gone(server_pid), f"nats-server {server_pid} outlived its SIGKILLed parent"
    finally:
        owner.kill()
        owner.wait()
