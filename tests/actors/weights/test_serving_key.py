"""The ``serving`` key moves back as well as forward (a rollback, a manual promotion of an older version), and a
serving generator's engine follows it; the learner's ``current`` key never goes back."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import torch

from actors.engines import TorchEngine
from actors.protocol import CURRENT, SERVING, served_key
from actors.weights import SafetensorsDirTransport, WeightPublisher, WeightSubscriber
from tests.actors.engines._rig import make_engine, perturbed
from topology.bus import Bus

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("key", [SERVING, CURRENT])
async def test_an_older_version_under_serving_is_swapped_in_and_under_current_ignored(
    bus: Bus, tmp_path: Path, key: str
) -> None:
    engine: TorchEngine = make_engine()
    engine.accepts_older = key == SERVING  # as the generator sets it for follow: serving
    transport = SafetensorsDirTransport(tmp_path / "weights", keep_versions=10)
    publisher = WeightPublisher(bus, bus.topology, transport, key=key)
    swapped, told = anyio.create_memory_object_stream[int](8)
    subscriber = WeightSubscriber(
        bus,
        bus.topology,
        engine,
        {"disk": transport},
        key=key,
        on_event=lambda event, fields: swapped.send_nowait(int(fields["version"])),
    )
    versions = {v: perturbed(engine, seed=v) for v in (1, 2)}
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(subscriber.run)
            manifests = {}
            for version, state in versions.items():
                manifests[version] = await publisher.publish(version, state)
                with anyio.fail_after(20):
                    assert await told.receive() == version
            await publisher.point(manifests[1], key)  # what `flywheel rollback` does to the key
            if key == SERVING:
                with anyio.fail_after(20):
                    assert await told.receive() == 1
            else:
                await anyio.sleep(1.0)  # time enough for a swap that must not come
                assert subscriber.applied == 2
            tg.cancel_scope.cancel()
    finally:
        await engine.close()
    expected = 1 if key == SERVING else 2
    assert engine.version == expected
    live = engine.policy.state_dict()
    assert all(torch.equal(live[name], versions[expected][name]) for name in live)


async def test_a_swap_whose_served_mark_fails_still_counts(
    bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``served.<actor>.<replica>`` mark is informational (the source's sync mode reads it sooner than heartbeats):
    a put of it that fails must not undo a swap the engine made. Raised, the swap would count as failed while the engine
    serves the new weights, and the subscriber would end or try the same version again and again."""
    engine: TorchEngine = make_engine()
    transport = SafetensorsDirTransport(tmp_path / "weights", keep_versions=10)
    events: list[tuple[str, dict[str, object]]] = []
    subscriber = WeightSubscriber(
        bus,
        bus.topology,
        engine,
        {"disk": transport},
        served_key=served_key("generator", 0),
        on_event=lambda event, fields: events.append((event, fields)),
    )
    try:
        manifest = await WeightPublisher(bus, bus.topology, transport).publish(1, perturbed(engine, seed=1))
        put = bus.kv_put

        async def refused(bucket: str, key: str, value: bytes) -> int:
            if key == served_key("generator", 0):
                raise RuntimeError("the bus is away")
            return await put(bucket, key, value)

        monkeypatch.setattr(bus, "kv_put", refused)
        with anyio.fail_after(20):
            assert await subscriber.apply(manifest) is True
    finally:
        await engine.close()
    assert subscriber.applied == 1 and subscriber.rejected == 0 and engine.version == 1
    assert [event for event, _ in events] == ["weights.served_put_failed", "weights.swapped"]
    assert events[0][1]["version"] == 1 and "the bus is away" in str(events[0][1]["error"])
