"""A version under evaluation cannot be deleted from under the gate: it evaluates its own copy (``hold``), which the
learner's stores never prune; a version pruned before the gate could hold it is skipped, not an error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from actors.protocol import weights_bucket
from actors.replay import hold, read_decisions, release
from actors.weights import (
    ObjectStoreTransport,
    SafetensorsDirTransport,
    SharedMemoryTransport,
    WeightPublisher,
    WeightTransport,
)
from tests.actors.gate._support import gate_rig, gate_spec
from tests.conftest import fresh_topology
from topology.bus import Bus, EmbeddedNats

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def weights(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((4, 4), value), "b": torch.full((4,), value)}


@pytest.mark.parametrize("transport", ["disk", "object-store", "shm"])
async def test_a_held_version_survives_the_learner_pruning_it(
    embedded_nats: EmbeddedNats, tmp_path: Path, transport: str
) -> None:
    topology = fresh_topology()
    async with await Bus.connect(embedded_nats.url, topology=topology, name="hold") as bus:
        stores: dict[str, WeightTransport] = {
            "disk": SafetensorsDirTransport(tmp_path / "weights", keep_versions=2),
            "object-store": ObjectStoreTransport(bus, weights_bucket(topology), keep_versions=2),
            "shm": SharedMemoryTransport(tmp_path / "slots", max_slots=2),  # v2's slot is rewritten by v4
        }
        store = stores[transport]
        publisher = WeightPublisher(bus, topology, store)
        v2 = await publisher.publish(2, weights(2.0))
        held = await hold(bus, tmp_path, v2)
        for version in (3, 4, 5):
            await publisher.publish(version, weights(float(version)))
        if isinstance(store, SafetensorsDirTransport):
            store.wait_tidy(10.0)  # the disk store prunes a quarter second after a publish, in a thread
        with pytest.raises(Exception, match="v2"):
            await store.get(v2)  # the learner's own copy is gone...
        assert held.transport == ("disk" if transport == "shm" else transport)  # a slot's copy is a directory
        got = await stores[held.transport].get(held)  # ...the gate's is not
        assert torch.equal(got["w"], torch.full((4, 4), 2.0))
        await release(bus, tmp_path, held)
        with pytest.raises(Exception, match="v2"):
            await stores[held.transport].get(held)


async def test_a_version_pruned_before_it_was_held_is_skipped(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    spec = gate_spec(tmp_path, "{min_samples: 4}")
    run_dir = tmp_path / "run"
    async with gate_rig(spec, embedded_nats.url, run_dir) as rig:
        shapes = {k: v.clone() for k, v in rig.gate.replayer.policy.state_dict().items()}  # type: ignore[union-attr]
        first = await rig.publish(1, shapes)
        for version in (2, 3):
            await rig.publish(version, shapes)  # the disk store keeps 2: v1 is pruned
        assert await rig.gate.consider(first) is None
        assert rig.ctx.counters.snapshot()["superseded"] == 1
        assert read_decisions(run_dir) == []
        entry = await rig.gate.consider(await rig.publisher.current())  # type: ignore[arg-type]
        assert entry is not None and (entry["action"], entry["version"]) == ("promote", 3)
        assert not list((run_dir / "weights").glob("gate-v*"))  # the gate's copy went once it had decided
