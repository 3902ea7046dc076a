from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
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


def _wait_reaped(server: EmbeddedNats, timeout_s: float = 5.0) -> bool:
    """Until the server's process is reaped — not only a zombie: the leader thread of a Go program shows Z while its
    other threads (and its sockets) are still going away."""
    deadline = time.monotonic() + timeout_s
    while server.running:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


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


@pytest.mark.anyio
async def test_restart_comes_back_on_the_same_port_with_the_same_store(tmp_path: Path) -> None:
    server = await EmbeddedNats(tmp_path).astart()
    try:
        url, first_pid = server.url, server.pid
        assert first_pid is not None
        async with await Bus.connect(url, topology="t", name="probe") as bus:
            await bus.ensure_channel("prompts")
            await bus.publish("prompts", "x", {"n": 1}, id="kept")
        os.kill(first_pid, signal.SIGKILL)
        assert _wait_reaped(server) and server.returncode == -signal.SIGKILL
        await server.arestart()
        assert server.url == url and server.pid != first_pid and server.restarts == 1
        async with await Bus.connect(url, topology="t", name="probe") as bus:
            info = await bus.nc.jetstream().stream_info(bus.stream("prompts"))
            assert info.state.messages == 1  # the store came back with the server
    finally:
        await server.astop()


def test_a_token_is_required_and_kept_off_the_command_line(tmp_path: Path) -> None:
    token = "s3cret-token-for-this-run"
    with EmbeddedNats(tmp_path, token=token) as server:
        assert server.pid is not None
        assert token not in " ".join(psutil.Process(server.pid).cmdline())
        assert (tmp_path / "nats-server.conf").stat().st_mode & 0o777 == 0o600

        async def connect(with_token: str | None) -> None:
            async with await Bus.connect(server.url, topology="t", name="probe", token=with_token) as bus:
                await bus.ensure_channel("prompts")

        anyio.run(connect, token, backend="asyncio")
        for wrong in (None, "guess"):
            with pytest.raises(BusError, match=r"Authorization Violation.*refused the credentials"):
                anyio.run(connect, wrong, backend="asyncio")


def test_durability_settings_reach_the_server(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path, sync_interval="always", max_file_store=64 * 1024 * 1024) as server:
        config = (tmp_path / "nats-server.conf").read_text()
        assert 'sync_interval: "always"' in config and "max_file_store: 67108864" in config
        assert server.running
        log = (tmp_path / "nats-server.log").read_text()
    assert "Max Storage:     64.00 MB" in log


def test_a_taken_port_on_restart_is_waited_for_then_a_clear_error(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path, port_retry_s=1.0).start()
    pid = server.pid
    assert pid is not None
    port = server.port
    os.kill(pid, signal.SIGKILL)
    assert _wait_reaped(server)  # its listening socket is closed once the whole process is gone
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port or 0))
        taken.listen()
        started = time.monotonic()
        with pytest.raises(BusError, match="address already in use"):
            anyio.run(server.arestart, backend="asyncio")
        assert time.monotonic() - started >= 1.0  # it waited for the port before giving up
