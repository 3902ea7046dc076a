"""Weights reach an SGLang or vLLM server (their fakes: a real TorchEngine behind the servers' HTTP shapes) through
the real WeightSubscriber, whatever transport the learner published through: such servers load a directory, so
the disk transport's directory is handed over as it is, and the tensors of another transport are written to a
directory of the generator's own first."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import torch

from actors.engines import SGLangEngine, TorchEngine, VLLMEngine
from actors.testing import FakeSGLangServer, FakeVLLMServer
from actors.weights import ObjectStoreTransport, SafetensorsDirTransport, WeightPublisher, WeightSubscriber
from tests.actors.engines._rig import make_engine, perturbed
from topology.bus import Bus

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("server", ["sglang", "vllm"])
async def test_an_http_engine_takes_versions_from_disk_and_from_the_object_store(
    bus: Bus, tmp_path: Path, server: str
) -> None:
    served: TorchEngine = make_engine()
    fake, client_type = (FakeSGLangServer, SGLangEngine) if server == "sglang" else (FakeVLLMServer, VLLMEngine)
    events: list[tuple[str, dict[str, object]]] = []
    told, heard = anyio.create_memory_object_stream[tuple[str, dict[str, object]]](16)
    try:
        async with fake(served) as running:
            client = client_type(running.url, timeout_s=30)
            await client.start(health_timeout_s=10)
            transports = {
                "disk": SafetensorsDirTransport(tmp_path / "learner"),
                "object-store": ObjectStoreTransport(bus, "weights_http"),
            }
            subscriber = WeightSubscriber(
                bus,
                bus.topology,
                client,
                transports,
                staging=SafetensorsDirTransport(tmp_path / "generator"),
                on_event=lambda event, fields: told.send_nowait((event, fields)),
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(subscriber.run)
                for version, name in ((1, "disk"), (2, "object-store"), (3, "disk")):
                    state = perturbed(served, seed=version)
                    await WeightPublisher(bus, bus.topology, transports[name]).publish(version, state)
                    with anyio.fail_after(20):  # swapped, and told (the client's version moves a moment before)
                        events.append(await heard.receive())
                    assert client.version == version
                    live = served.policy.state_dict()
                    assert all(torch.equal(live[k], state[k]) for k in state), f"v{version} is not what serves"
                tg.cancel_scope.cancel()
            await client.close()
    finally:
        await served.close()
    assert [e for e, _ in events] == ["weights.swapped"] * 3, events
    staged = sorted(p.name for p in (tmp_path / "generator").iterdir() if p.name.startswith("v"))
    assert staged == ["v2"], staged  # only the object store's version went through the generator's own directory


async def test_a_server_that_outlived_another_run_takes_this_runs_first_version(bus: Bus, tmp_path: Path) -> None:
    """An SGLang server left running reports the version of the run that loaded it last (here 9): the first version
    this run announces replaces it, and the next ones follow as usual."""
    served = make_engine(version=9)
    versions: list[int] = []
    try:
        async with FakeSGLangServer(served) as running:
            client = SGLangEngine(running.url, timeout_s=30)
            await client.start(health_timeout_s=10)
            assert client.version == 9
            transport = SafetensorsDirTransport(tmp_path / "learner")
            told, heard = anyio.create_memory_object_stream[int](8)
            subscriber = WeightSubscriber(
                bus,
                bus.topology,
                client,
                {"disk": transport},
                on_event=lambda event, f: told.send_nowait(f["version"] if event == "weights.swapped" else -1),
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(subscriber.run)
                for version in (1, 2):
                    await WeightPublisher(bus, bus.topology, transport).publish(
                        version, perturbed(served, seed=version)
                    )
                    with anyio.fail_after(20):
                        versions.append(await heard.receive())
                tg.cancel_scope.cancel()
            await client.close()
    finally:
        await served.close()
    assert versions == [1, 2] and served.version == 2
