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


async def test_healthz_says_in_words_why_no_generator_answers(server: EmbeddedNats, tmp_path: Path) -> None:
    """With no generator serving (none running, or a service's before its gate promotes a first version) /healthz
    gave ``"reason": "NoRespondersError"``: the bus client's exception name, which says nothing to an operator."""
    from actors.gateway import GatewayActor
    from tests.actors.gateway.conftest import SPEC
    from topology import load_spec
    from topology.runtime import ActorContext

    (tmp_path / "keys.txt").write_text("test-key-0123456789\n")
    (tmp_path / "spec.yaml").write_text(SPEC.format(name="nobody-serves"))
    spec = load_spec(tmp_path / "spec.yaml")
    async with await Bus.connect(server.url, topology="nobody-serves", name="gateway") as bus:
        ctx = ActorContext(
            topology="nobody-serves", actor="gateway", replica=0, kind="gateway", spec=spec, bus=bus, run_dir=tmp_path
        )
        report = await GatewayActor(ctx, spec.actors["gateway"].config)._check_health()
    assert report["ok"] is False and report["generators"] == "unavailable"
    assert report["reason"].startswith("no generator is serving: none is running, or none has weights"), report
    assert "Error" not in report["reason"]


async def test_a_gated_services_503_says_the_gate_decides_what_serves(server: EmbeddedNats, tmp_path: Path) -> None:
    """Before its gate promotes a first version (or while an operator keeps the gate paused) a service's serving
    generators answer nobody: users got only "no generator is serving right now", which reads as a crash."""
    import anyio
    import httpx

    from actors.gateway import GatewayActor
    from tests.actors.gateway.conftest import API_KEY, SPEC
    from topology import load_spec
    from topology.runtime import ActorContext

    (tmp_path / "keys.txt").write_text(f"{API_KEY}\n")
    text = SPEC.format(name="gated").replace("  joiner: {window_s: 3600}", "  joiner: {window_s: 3600}\n  gate: {}")
    (tmp_path / "spec.yaml").write_text(text)
    spec = load_spec(tmp_path / "spec.yaml")
    async with await Bus.connect(server.url, topology="gated", name="gateway") as bus:
        ctx = ActorContext(
            topology="gated", actor="gateway", replica=0, kind="gateway", spec=spec, bus=bus, run_dir=tmp_path
        )
        gateway = GatewayActor(ctx, spec.actors["gateway"].config)
        await gateway.start()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(gateway.run)
                async with httpx.AsyncClient(base_url=str(gateway.url), timeout=30) as client:
                    answer = await client.post(
                        "/v1/completions",
                        json={"model": "flywheel", "prompt": "1 + 2 = ", "max_tokens": 2},
                        headers={"authorization": f"Bearer {API_KEY}"},
                    )
                ctx.stopping.set()
        finally:
            await gateway.stop()
    assert answer.status_code == 503, answer.text
    message = answer.json()["error"]["message"]
    assert message.startswith("no generator is serving right now (this service's generators serve only a version")
    assert "`flywheel status` shows which" in message
