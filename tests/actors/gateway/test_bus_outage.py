"""A request that waited through a nats-server restart is told so (503 ``bus_unavailable``, retry), not blamed on
the generators (504 ``timeout``): its answer may have been sent into the outage."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from actors.gateway import ServeClient
from tests.topology.bus.test_bus_reconnect import kill_and_restart, until
from topology.bus import Bus, EmbeddedNats

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[EmbeddedNats]:
    async with EmbeddedNats(tmp_path) as running:
        yield running


async def test_a_call_open_across_a_restart_knows_the_bus_was_away(server: EmbeddedNats) -> None:
    async with await Bus.connect(server.url, topology="outage", name="gateway") as bus:
        client = ServeClient(bus.nc, bus.topology)
        await client.start()
        try:
            before = client.open("r1", [1, 2], {}, stream=False, timeout_s=1)
            assert not before.bus_was_away()
            await kill_and_restart(server)
            await until(client.connected, 15)
            assert before.bus_was_away()  # a 504 for it would blame the generators for the outage
            after = client.open("r2", [1, 2], {}, stream=False, timeout_s=1)
            assert not after.bus_was_away()  # a call opened once the bus was back is judged on its own
        finally:
            await client.close()
