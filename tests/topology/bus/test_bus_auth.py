"""External buses that require credentials: a token (``bus.token_env``) and a creds file (``bus.creds_file``, an
operator-mode nats-server checking a JWT chain made here). Connecting with them works; without them the
connection is refused with a one-line error that says so."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.topology.bus._jwt import decentralized
from topology import BusSpec
from topology.bus import Bus, BusError, EmbeddedNats, find_nats_server
from topology.runtime._session import connect_bus

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def spec_for(bus: BusSpec) -> Any:
    """What `connect_bus` reads of a spec: its name and its validated bus section."""
    return SimpleNamespace(name="auth-test", bus=bus)


@pytest.fixture
def creds_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    config, creds = decentralized(tmp_path)
    probe = EmbeddedNats(tmp_path / "probe").start()  # a free port: the one a probe server got, then released
    port = probe.port
    probe.stop()
    conf = tmp_path / "operator.conf"
    log = tmp_path / "operator.log"
    conf.write_text(
        "\n".join(
            [f"listen: 127.0.0.1:{port}", f'log_file: "{log}"', f'jetstream {{ store_dir: "{tmp_path}/js" }}', *config]
        )
    )
    proc = subprocess.Popen(
        [str(find_nats_server()), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 10
        while "Server is ready" not in _read(log) and time.monotonic() < deadline:
            time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}", creds
    finally:
        proc.kill()
        proc.wait()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


async def test_token_env_connects_to_a_server_that_requires_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with EmbeddedNats(tmp_path, token="the-cluster-token") as server:
        spec = spec_for(BusSpec(url=server.url, token_env="FW_TEST_TOKEN"))
        monkeypatch.setenv("FW_TEST_TOKEN", "the-cluster-token")
        async with await connect_bus(spec, server.url, client_name="ok") as bus:
            await bus.ensure_channel("prompts")
            assert await bus.publish("prompts", "x", {}) != ""
        monkeypatch.delenv("FW_TEST_TOKEN")
        with pytest.raises(BusError, match="Authorization Violation"):
            await connect_bus(spec, server.url, client_name="no-token")


async def test_creds_file_connects_to_a_server_that_requires_one(creds_server: tuple[str, Path]) -> None:
    url, creds = creds_server
    spec = spec_for(BusSpec(url=url, creds_file=str(creds)))
    async with await connect_bus(spec, url, client_name="ok") as bus:
        await bus.ensure_channel("prompts")
        assert await bus.publish("prompts", "x", {}) != ""
    with pytest.raises(BusError, match="Authorization Violation"):
        await Bus.connect(url, topology="auth-test", name="anonymous", connect_timeout_s=5)
