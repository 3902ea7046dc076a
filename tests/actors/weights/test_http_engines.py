"""Weights reach an SGLang or vLLM server (their fakes: a real TorchEngine behind the servers' HTTP shapes) through
the real WeightSubscriber, whatever transport the learner published through: such servers load a directory, so
the disk transport's directory is handed over as it is, and the tensors of another transport are written to a
directory of the generator's own first."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import pytest
import torch
from anyio.abc import ObjectReceiveStream
from fastapi import Request, Response
from safetensors.torch import load_file

from actors.engines import EngineHTTPError, SGLangEngine, TorchEngine, VLLMEngine
from actors.protocol import SERVING
from actors.testing import FakeSGLangServer, FakeVLLMServer
from actors.weights import ObjectStoreTransport, SafetensorsDirTransport, WeightPublisher, WeightSubscriber
from tests.actors.engines._rig import make_engine, perturbed, request
from topology.bus import Bus

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("server", ["sglang", "vllm"])
async def test_an_http_engine_takes_versions_from_disk_and_the_object_store_and_back(
    bus: Bus, tmp_path: Path, server: str
) -> None:
    """Under ``serving``: v1 through disk, v2 through the object store, v3 through disk, then a rollback to v1. Each
    goes through the generator's staging directory (the disk transport's files as hard links: the learner prunes its
    own while a server may still be opening them); the rollback's directory is staged last, so it is not the one
    pruned although its version is older."""
    served: TorchEngine = make_engine()
    fake, client_type = (FakeSGLangServer, SGLangEngine) if server == "sglang" else (FakeVLLMServer, VLLMEngine)
    events: list[tuple[str, dict[str, object]]] = []
    told, heard = anyio.create_memory_object_stream[tuple[str, dict[str, object]]](16)
    transports = {
        "disk": SafetensorsDirTransport(tmp_path / "learner", keep_versions=10),
        "object-store": ObjectStoreTransport(bus, "weights_http"),
    }
    staging = SafetensorsDirTransport(tmp_path / "generator")
    states = {}
    try:
        async with fake(served) as running:
            client = client_type(running.url, timeout_s=30)
            await client.start(health_timeout_s=10)
            served.accepts_older = True  # what the generator sets for follow: serving (the fake's own engine too)
            subscriber = WeightSubscriber(
                bus,
                bus.topology,
                client,
                transports,
                key=SERVING,
                staging=staging,
                on_event=lambda event, fields: told.send_nowait((event, fields)),
            )

            async def served_now(version: int) -> None:
                with anyio.fail_after(20):  # swapped, and told (the client's version moves a moment before)
                    events.append(await heard.receive())
                assert client.version == version
                live = served.policy.state_dict()
                assert all(torch.equal(live[k], states[version][k]) for k in live), f"v{version} is not what serves"

            async with anyio.create_task_group() as tg:
                tg.start_soon(subscriber.run)
                manifests = {}
                for version, name in ((1, "disk"), (2, "object-store"), (3, "disk")):
                    states[version] = perturbed(served, seed=version)
                    publisher = WeightPublisher(bus, bus.topology, transports[name], key=SERVING)
                    manifests[version] = await publisher.publish(version, states[version])
                    await served_now(version)
                learners = Path(manifests[3].location) / "model.safetensors"
                stagings = staging.version_dir(3) / "model.safetensors"
                assert learners.stat().st_ino == stagings.stat().st_ino  # a link, not a copy
                await publisher.point(manifests[1], SERVING)  # `flywheel rollback` (to v1, two back)
                await served_now(1)
                await anyio.to_thread.run_sync(staging.wait_tidy, 10.0)  # the staging's pruning has run
                kept = [load_file(str(p)) for p in (tmp_path / "generator").glob("v*/model.safetensors")]
                assert any(all(torch.equal(t[k], states[1][k]) for k in t) for t in kept), "v1 was pruned"
                tg.cancel_scope.cancel()
            await client.close()
    finally:
        await served.close()
    assert [e for e, _ in events] == ["weights.swapped"] * 4, events


@pytest.mark.parametrize("left_at", [9, 1])
async def test_a_server_that_outlived_another_run_takes_this_runs_first_version(
    bus: Bus, tmp_path: Path, left_at: int
) -> None:
    """An SGLang server left running reports the version of the run that loaded it last (9, or 1 — this run's first
    number, which was taken as held: the old run's weights served as this run's v1 until v2): the first version this
    run announces replaces it, and the next ones follow as usual."""
    served = make_engine(version=left_at)
    versions: list[int] = []
    try:
        async with FakeSGLangServer(served) as running:
            client = SGLangEngine(running.url, timeout_s=30)
            await client.start(health_timeout_s=10)
            assert client.version == left_at
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


@pytest.mark.parametrize("left_at", [0, 1])
@pytest.mark.parametrize("server", ["sglang", "vllm"])
async def test_a_version_announced_while_the_server_is_down_is_loaded_once_it_is_back(
    bus: Bus, tmp_path: Path, server: str, left_at: int
) -> None:
    """v1 is announced while the server is down: its load fails, and — with no v2 coming, as before a learner's first
    samples — it is tried again until the server is back, not left waiting for the next announcement for ever; also
    when the server was left at v1 by another run (its number is not this run's v1)."""
    served = make_engine(version=left_at)
    fake, client_type = (FakeSGLangServer, SGLangEngine) if server == "sglang" else (FakeVLLMServer, VLLMEngine)
    told, heard = anyio.create_memory_object_stream[str](16)
    try:
        running = fake(served)
        await running.start()
        client = client_type(running.url, timeout_s=30, retries=0)
        await client.start(health_timeout_s=10)
        transport = SafetensorsDirTransport(tmp_path / "learner")
        subscriber = WeightSubscriber(
            bus,
            bus.topology,
            client,
            {"disk": transport},
            retry_s=0.2,
            on_event=lambda event, fields: told.send_nowait(event),
        )
        await running.stop()
        async with anyio.create_task_group() as tg:
            tg.start_soon(subscriber.run)
            state = perturbed(served, seed=1)
            await WeightPublisher(bus, bus.topology, transport).publish(1, state)
            with anyio.fail_after(20):
                assert await heard.receive() == "weights.rejected"
            assert subscriber.failing.startswith("v1: ") and running.url in subscriber.failing  # what status shows
            await running.start()
            with anyio.fail_after(20):
                while await heard.receive() != "weights.swapped":
                    pass
            assert subscriber.failing == ""
            assert await client.refresh_version() == 1  # the label the server reports (a fake vLLM numbers its own)
            tg.cancel_scope.cancel()
        await client.close()
        await running.stop()
    finally:
        await served.close()
    assert client.version == 1
    live = served.policy.state_dict()
    assert all(torch.equal(live[k], state[k]) for k in live)


class _Rig:
    """A fake SGLang or vLLM server (over ``first``) whose client a weight subscriber gave version 1 (``state``)."""

    def __init__(self, fake: type[FakeSGLangServer | FakeVLLMServer]) -> None:
        self.fake = fake
        self.first, self.second = make_engine(), make_engine()  # the second: the weights a restarted server starts with
        self.server = fake(self.first)
        self.client: SGLangEngine | VLLMEngine
        self.heard: ObjectReceiveStream[str]
        self.state: dict[str, torch.Tensor] = {}

    async def start_again(self) -> None:
        """The server started again on its port, over the second engine: the weights it started with."""
        self.server = self.fake(self.second, port=int(self.server.url.rsplit(":", 1)[1]))
        await self.server.start()

    async def swapped(self) -> None:
        """Until the subscriber loads a version into the client again."""
        with anyio.fail_after(20):
            while await self.heard.receive() != "weights.swapped":
                pass

    def reloaded(self) -> bool:
        """Whether the restarted server holds version 1 again, and its weights."""
        live = self.second.policy.state_dict()
        return (
            self.client.version == 1
            and self.second.version == 1
            and all(torch.equal(live[k], self.state[k]) for k in live)
        )


@contextlib.asynccontextmanager
async def _holding_v1(bus: Bus, tmp_path: Path, server: str) -> AsyncIterator[_Rig]:
    fake = FakeSGLangServer if server == "sglang" else FakeVLLMServer
    rig = _Rig(fake)
    told, rig.heard = anyio.create_memory_object_stream[str](16)
    try:
        await rig.server.start()
        rig.client = (SGLangEngine if server == "sglang" else VLLMEngine)(rig.server.url, timeout_s=30, retries=0)
        await rig.client.start(health_timeout_s=10)
        transport = SafetensorsDirTransport(tmp_path / "learner")
        subscriber = WeightSubscriber(
            bus,
            bus.topology,
            rig.client,
            {"disk": transport},
            retry_s=0.2,
            on_event=lambda event, fields: told.send_nowait(event),
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(subscriber.run)
            rig.state = perturbed(rig.first, seed=1)
            await WeightPublisher(bus, bus.topology, transport).publish(1, rig.state)
            with anyio.fail_after(20):
                assert await rig.heard.receive() == "weights.swapped"
            yield rig
            tg.cancel_scope.cancel()
        await rig.client.close()
        await rig.server.stop()
    finally:
        await rig.first.close()
        await rig.second.close()


@pytest.mark.parametrize("server", ["sglang", "vllm"])
async def test_a_restarted_server_labels_its_tokens_0_and_gets_the_current_version_again(
    bus: Bus, tmp_path: Path, server: str
) -> None:
    """A server restarted on the same port serves the weights it started with and says "default": what it generates
    is labelled 0 (not the version it had before), and the current version is loaded into it again."""
    async with _holding_v1(bus, tmp_path, server) as rig:
        await rig.server.stop()
        with pytest.raises(EngineHTTPError):  # down: a call in between fails
            await rig.client.generate([request("gap", tokens=4)])
        await rig.start_again()
        [completion] = await rig.client.generate([request("after", tokens=4)])
        await rig.swapped()
    assert set(completion.versions) == {0}, completion.versions
    assert rig.reloaded()


async def test_a_server_that_cannot_load_weights_is_told_once_and_not_tried_again_on_a_timer(
    bus: Bus, tmp_path: Path
) -> None:
    """A vLLM server without the routes loading needs (here: not started in dev mode) refused every version, and the
    subscriber tried it again every few seconds for ever, logging the same bare "HTTP 404: Not Found". It now says why
    once (``weights.unsupported``, naming the release and the mode needed), keeps it in ``failing`` (the heartbeat's
    ``weights_error``), and tries again only when a newer version is announced (the server may have been replaced)."""
    served = make_engine()
    events: list[str] = []
    try:
        async with FakeVLLMServer(served, dev_mode=False) as running:
            client = VLLMEngine(running.url, timeout_s=30, retries=0)
            await client.start(health_timeout_s=10)
            transport = SafetensorsDirTransport(tmp_path / "learner")
            subscriber = WeightSubscriber(
                bus,
                bus.topology,
                client,
                {"disk": transport},
                retry_s=0.05,
                retry_max_s=0.05,
                on_event=lambda event, fields: events.append(event),
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(subscriber.run)
                publisher = WeightPublisher(bus, bus.topology, transport)
                await publisher.publish(1, perturbed(served, seed=1))
                with anyio.fail_after(20):
                    for _ in iter(int, 1):
                        if events:
                            break
                        await anyio.sleep(0.02)
                await anyio.sleep(0.5)  # ten retry periods: the version is not tried again
                assert (events, subscriber.rejected) == (["weights.unsupported"], 1)
                assert subscriber.failing.startswith("v1: ") and "VLLM_SERVER_DEV_MODE=1" in subscriber.failing
                await publisher.publish(2, perturbed(served, seed=2))
                with anyio.fail_after(20):
                    for _ in iter(int, 1):
                        if subscriber.rejected == 2:
                            break
                        await anyio.sleep(0.02)
                assert events == ["weights.unsupported"] and subscriber.failing.startswith("v2: ")
                tg.cancel_scope.cancel()
            await client.close()
    finally:
        await served.close()
    assert client.version == 0 and served.version == 0


@pytest.mark.parametrize("server", ["sglang", "vllm"])
async def test_a_server_restarted_between_two_calls_is_found_without_a_failed_call(
    bus: Bus, tmp_path: Path, server: str
) -> None:
    """A vLLM server restarted between two calls, none of which failed, served the weights it started with while its
    tokens were labelled with the version it had before, and nobody loaded that version again: completions carry no
    version, and only a call that could not connect made the client look. The first completion after the restart is
    labelled 0 and the current version is loaded again, as with SGLang (whose completions say their version). The
    vLLM client looks at most once per `restart_check_s`, not after every completion (a round trip each)."""
    async with _holding_v1(bus, tmp_path, server) as rig:
        if isinstance(rig.client, VLLMEngine):
            rig.client.restart_check_s = 1.0
        [before] = await rig.client.generate([request("before", tokens=4)])
        reads = getattr(rig.server, "weight_info_reads", 0)
        await rig.client.generate([request(f"more {i}", tokens=4) for i in range(8)])
        assert getattr(rig.server, "weight_info_reads", 0) - reads <= 1  # within the interval: not one per completion
        await rig.server.stop()  # no call while it is down
        await rig.start_again()
        await anyio.sleep(1.0)  # past the interval since the last look
        [after] = await rig.client.generate([request("after", tokens=4)])
        await rig.swapped()
        [reloaded] = await rig.client.generate([request("reloaded", tokens=4)])
    assert (set(before.versions), set(after.versions), set(reloaded.versions)) == ({1}, {0}, {1})
    assert rig.reloaded()


@pytest.mark.parametrize("server", ["sglang", "vllm"])
async def test_a_load_that_runs_long_is_said_while_it_runs_and_one_past_the_update_timeout_is_tried_again(
    bus: Bus, tmp_path: Path, server: str
) -> None:
    """A server reading a large model takes minutes over a version: the generator's log said nothing for up to the
    update timeout (600 s by default). Now a load still running is said every ``slow_update_log_s``; one past the
    client's ``update_timeout_s`` is rejected, the server keeps serving, and the version is tried again."""
    served = make_engine()
    fake, client_type = (FakeSGLangServer, SGLangEngine) if server == "sglang" else (FakeVLLMServer, VLLMEngine)
    load_path = "/update_weights_from_disk" if server == "sglang" else "/collective_rpc"
    slow_loads = [2.5]  # the first load waits this long before the server starts it

    async def slow(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path == load_path and slow_loads:
            await anyio.sleep(slow_loads.pop())
        return await call_next(request)

    events: list[tuple[str, dict[str, object]]] = []
    told, heard = anyio.create_memory_object_stream[tuple[str, dict[str, object]]](64)
    try:
        running = fake(served)
        running.app.middleware("http")(slow)
        async with running:
            client = client_type(running.url, timeout_s=30, retries=0, update_timeout_s=1.0)
            await client.start(health_timeout_s=10)
            transport = SafetensorsDirTransport(tmp_path / "learner")
            subscriber = WeightSubscriber(
                bus,
                bus.topology,
                client,
                {"disk": transport},
                retry_s=0.2,
                slow_update_log_s=0.3,
                on_event=lambda event, fields: told.send_nowait((event, fields)),
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(subscriber.run)
                state = perturbed(served, seed=1)
                await WeightPublisher(bus, bus.topology, transport).publish(1, state)
                with anyio.fail_after(20):
                    for _ in iter(int, 1):
                        events.append(await heard.receive())
                        if events[-1][0] == "weights.swapped":
                            break
                tg.cancel_scope.cancel()
            await client.close()
    finally:
        await served.close()
    names = [event for event, _ in events]
    assert names[:3] == ["weights.update_slow"] * 3, events  # at 0.3, 0.6, 0.9 s into the first load
    slow_said = [fields for event, fields in events if event == "weights.update_slow"]
    assert all(f["version"] == 1 and f["serving"] == 0 for f in slow_said), slow_said
    rejected = [fields for event, fields in events if event == "weights.rejected"]
    assert len(rejected) == 1 and "no whole answer within 1 s" in str(rejected[0]["reason"]), events
    assert names[-1] == "weights.swapped" and client.version == 1 and served.version == 1
    live = served.policy.state_dict()
    assert all(torch.equal(live[k], state[k]) for k in live)
