"""Weight transports over a real nats-server and a real directory: round trips and rejected payloads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from actors.weights import (
    ObjectStoreTransport,
    SafetensorsDirTransport,
    WeightManifest,
    WeightPayloadError,
    WeightPublisher,
    WeightSubscriber,
    WeightTransport,
    check_state_dict,
    describe,
)
from topology.bus import Bus

pytestmark = pytest.mark.anyio


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"wte.weight": torch.randn(32, 16, generator=gen), "ln.bias": torch.randn(16, generator=gen)}


async def test_object_store_round_trip(bus: Bus) -> None:
    transport = ObjectStoreTransport(bus, "weights_rt")
    state = _state()
    manifest = await transport.put(1, state)
    again = await transport.get(WeightManifest.from_json(manifest.to_json()))
    assert all(torch.equal(state[k], again[k]) for k in state)


async def test_object_store_rejects_truncated_and_corrupted_payloads(bus: Bus) -> None:
    transport = ObjectStoreTransport(bus, "weights_bad")
    manifest = await transport.put(1, _state())
    blob = await bus.object_get("weights_bad", manifest.location)
    await bus.object_put("weights_bad", manifest.location, blob[: len(blob) // 2])
    with pytest.raises(WeightPayloadError, match="replaced"):
        await transport.get(manifest)
    await bus.object_put("weights_bad", manifest.location, blob[:-4] + b"\x00\x01\x02\x03")
    with pytest.raises(WeightPayloadError, match="replaced"):
        await transport.get(manifest)
    # a manifest that lies about the size is caught too (no digest to lean on)
    _, digest = await bus.object_put("weights_bad", manifest.location, blob)
    lying = WeightManifest(1, manifest.transport, manifest.location, manifest.tensors, manifest.nbytes + 1, digest)
    with pytest.raises(WeightPayloadError, match="truncated"):
        await transport.get(lying)


async def test_object_store_keeps_only_recent_versions(bus: Bus) -> None:
    transport = ObjectStoreTransport(bus, "weights_keep", keep_versions=2)
    manifests = [await transport.put(v, _state(v)) for v in range(1, 5)]
    with pytest.raises(Exception, match="not found"):
        await transport.get(manifests[0])
    assert (await transport.get(manifests[-1]))["ln.bias"].shape == (16,)


async def test_the_object_store_keeps_four_versions_by_default(bus: Bus) -> None:
    """A generator slower than the learner may still be reading a version three publishes old: the object store keeps
    the last four by default, so that read finishes instead of stalling on an object deleted under it."""
    transport = ObjectStoreTransport(bus, "weights_default_keep")
    manifests = {v: await transport.put(v, _state(v)) for v in range(1, 7)}
    for version in (1, 2):
        with pytest.raises(WeightPayloadError, match="not found"):
            await transport.get(manifests[version])
    for version in (3, 4, 5, 6):
        assert torch.equal((await transport.get(manifests[version]))["ln.bias"], _state(version)["ln.bias"])


async def test_safetensors_dir_is_hf_layout_and_atomic(tmp_path: Path) -> None:
    transport = SafetensorsDirTransport(tmp_path, extra_files={"config.json": b"{}"})
    manifest = await transport.put(3, _state())
    version_dir = Path(manifest.location)
    assert sorted(p.name for p in version_dir.iterdir()) == ["config.json", "model.safetensors"]
    assert not list(tmp_path.glob(".*partial*"))  # nothing half-written is left behind
    loaded = await transport.get(manifest)
    assert torch.equal(loaded["wte.weight"], _state()["wte.weight"])


async def test_safetensors_dir_rejects_a_truncated_file(tmp_path: Path) -> None:
    transport = SafetensorsDirTransport(tmp_path)
    manifest = await transport.put(1, _state())
    path = Path(manifest.location) / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(WeightPayloadError, match="not a valid safetensors"):
        await transport.get(manifest)


async def test_safetensors_dir_rejects_non_finite_values(tmp_path: Path) -> None:
    transport = SafetensorsDirTransport(tmp_path)
    bad = _state()
    bad["ln.bias"][3] = float("inf")
    manifest = await transport.put(1, bad)
    with pytest.raises(WeightPayloadError, match=r"v1: rejected: ln\.bias: contains NaN or infinite values"):
        await transport.get(manifest)


def test_check_state_dict_names_every_problem() -> None:
    expected = describe(_state())
    bad = {"wte.weight": torch.zeros(32, 8), "extra": torch.zeros(1)}
    with pytest.raises(WeightPayloadError) as info:
        check_state_dict(bad, expected)
    message = str(info.value)
    assert "missing ln.bias" in message and "unexpected extra" in message and "shape [32, 8]" in message
    with pytest.raises(WeightPayloadError, match="dtype float16"):
        check_state_dict({**_state(), "ln.bias": torch.zeros(16, dtype=torch.float16)}, expected)


async def test_publisher_refuses_non_monotonic_versions(bus: Bus) -> None:
    publisher = WeightPublisher(bus, bus.topology, ObjectStoreTransport(bus, "weights_mono"))
    await publisher.publish(2, _state())
    with pytest.raises(ValueError, match="monotonic"):
        await publisher.publish(2, _state())
    current = await publisher.current()
    assert current is not None and current.version == 2


async def test_every_transport_holds_the_tensors_as_they_were_when_put_returned(bus: Bus, tmp_path: Path) -> None:
    """The learner publishes its live parameters, not a copy, and steps them right after the publish."""
    from actors.weights import SharedMemoryTransport

    transports: list[WeightTransport] = [
        ObjectStoreTransport(bus, "weights_live"),
        SafetensorsDirTransport(tmp_path / "disk"),
        SharedMemoryTransport(tmp_path / "shm"),
    ]
    for transport in transports:
        live = _state(1)
        manifest = await transport.put(1, live)
        for tensor in live.values():
            tensor.add_(1.0)  # the next optimizer step
        got = await transport.get(manifest)
        assert all(torch.equal(got[k], _state(1)[k]) for k in live), transport.name


class _FailingOnce:
    """A transport whose next put fails after the tensors were handled: a publish that may or may not have landed."""

    name = "object-store"

    def __init__(self, inner: ObjectStoreTransport) -> None:
        self.inner, self.fail = inner, False

    async def put(self, version: int, state: dict[str, torch.Tensor]) -> WeightManifest:
        if self.fail:
            self.fail = False
            raise WeightPayloadError("the store went away")
        return await self.inner.put(version, state)


async def test_a_publisher_reads_the_current_version_once_and_again_after_a_failed_publish(bus: Bus) -> None:
    """The key is read at the first publish and kept as the publisher publishes (the learner is its only writer);
    after a failed publish the bus may hold what the publisher does not know of, so it reads the key again."""
    other = WeightPublisher(bus, "once", ObjectStoreTransport(bus, "weights_once"))
    await other.publish(3, _state(3))  # an earlier life of the learner
    transport = _FailingOnce(ObjectStoreTransport(bus, "weights_once"))
    publisher = WeightPublisher(bus, "once", transport)  # type: ignore[arg-type]
    assert await publisher.newest() == 3
    with pytest.raises(ValueError, match="monotonic: cannot publish v3 after v3"):
        await publisher.publish(3, _state(3))
    await publisher.publish(4, _state(4))
    assert await publisher.newest() == 4
    await other.publish(7, _state(7))  # (not a learner's case: a second writer of the key)
    assert await publisher.newest() == 4, "read the key again without a failure"
    transport.fail = True
    with pytest.raises(WeightPayloadError):
        await publisher.publish(5, _state(5))
    assert await publisher.newest() == 7
    with pytest.raises(ValueError, match="after v7"):
        await publisher.publish(6, _state(6))


async def test_safetensors_dir_writes_into_a_file_allocated_ahead_and_never_rewrites_a_published_one(
    tmp_path: Path,
) -> None:
    from safetensors.torch import load_file

    transport = SafetensorsDirTransport(tmp_path, keep_versions=2)
    first = await transport.put(1, _state(1))
    held = load_file(str(Path(first.location) / "model.safetensors"))  # the library may hand out mmap views
    transport.wait_tidy(10)
    second = await transport.put(2, _state(2))
    assert transport.spares_used == 1
    assert not list(tmp_path.glob(".*partial*"))
    transport.wait_tidy(10)
    await transport.put(3, _state(3))
    transport.wait_tidy(10)  # the tidying thread pruned v1: its file deleted, never overwritten
    assert not Path(first.location).exists() and Path(second.location).exists()
    assert torch.equal(held["wte.weight"], _state(1)["wte.weight"])
    assert torch.equal((await transport.get(second))["wte.weight"], _state(2)["wte.weight"])
    stale = WeightManifest(1, second.transport, second.location, second.tensors, second.nbytes)
    with pytest.raises(WeightPayloadError, match="expected '1'"):
        await transport.get(stale)  # a manifest and a file that disagree on the version


class _SlowEngine:
    """Takes 0.3 s per swap — slower than the publisher below — and records what it applied."""

    def __init__(self, last: int) -> None:
        self.version = 0
        self.applied: list[int] = []
        self.reached_last = anyio.Event()
        self._last = last

    async def update_weights(self, version: int, source: object) -> None:
        await anyio.sleep(0.3)
        self.version = version
        self.applied.append(version)
        if version == self._last:
            self.reached_last.set()


async def test_a_subscriber_slower_than_the_publisher_skips_to_the_newest_version(bus: Bus) -> None:
    """Applying every announced version in turn fell ever further behind, until the objects being read had been
    deleted (two versions are kept) and the loop stood still; the subscriber must catch up to the newest."""
    transport = ObjectStoreTransport(bus, "weights_slow", keep_versions=2)
    publisher = WeightPublisher(bus, "slow", transport)
    engine = _SlowEngine(last=12)
    subscriber = WeightSubscriber(bus, "slow", engine, {transport.name: transport})  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(subscriber.run)
        for version in range(1, 13):  # 12 versions, one every 50 ms: six times faster than the engine swaps
            await publisher.publish(version, _state(version))
            await anyio.sleep(0.05)
        with anyio.fail_after(10):
            await engine.reached_last.wait()
        tg.cancel_scope.cancel()
    assert engine.applied == sorted(engine.applied) and engine.applied[-1] == 12
    assert len(engine.applied) < 8, engine.applied  # intermediate versions were skipped
    assert subscriber.rejected == 0, subscriber.last_error


async def test_reading_an_object_deleted_mid_read_fails_instead_of_hanging(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats-py waits forever for the remaining chunks of an object deleted while it is read; the bus gives up once
    no chunk has come for ``stall_s`` (a lagging generator reading a version the learner just pruned).

    The delete lands after the read's first pull of chunks and before its second, by construction: deleting after a
    fixed sleep raced the read (the delete could reach the server after the read's last pull had been served), and a
    read that got every chunk before the delete rightly returns the object."""
    from nats.js.client import JetStreamContext

    from topology.bus import BusError

    blob = bytes(range(256)) * (48 * 4096)  # 48 MiB: 48 chunks, pulled 16 at a time
    await bus.object_put("weights_pruned", "v1", blob)
    outcome: list[object] = []
    pulls: list[int] = []
    fetch = JetStreamContext.PullSubscription.fetch

    async def fetch_then_delete(self: JetStreamContext.PullSubscription, *args: Any, **kwargs: Any) -> Any:
        messages = await fetch(self, *args, **kwargs)
        pulls.append(len(messages))
        if len(pulls) == 1:  # the first chunks are in: the learner prunes the version now
            await bus.object_delete("weights_pruned", "v1")
        return messages

    monkeypatch.setattr(JetStreamContext.PullSubscription, "fetch", fetch_then_delete)

    with anyio.fail_after(20):
        try:
            outcome.append(len(await bus.object_get("weights_pruned", "v1", stall_s=1.0)))
        except BusError as exc:
            outcome.append(exc)
    assert pulls[0] == 16, pulls  # the delete came with 32 chunks still on the server
    assert len(outcome) == 1
    assert isinstance(outcome[0], BusError), outcome  # not the whole object, and not a hang
    assert "stalled" in str(outcome[0]) or "not found" in str(outcome[0]), outcome
