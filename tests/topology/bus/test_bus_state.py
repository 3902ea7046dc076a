from __future__ import annotations

import os

import anyio
import pytest

from topology.bus import Bus, BusError

pytestmark = pytest.mark.anyio


async def test_kv_put_get(bus: Bus) -> None:
    assert await bus.kv_get("weights", "version") is None
    rev1 = await bus.kv_put("weights", "version", b"1")
    rev2 = await bus.kv_put("weights", "version", b"2")
    assert rev2 > rev1
    assert await bus.kv_get("weights", "version") == b"2"
    await bus.kv_put("weights", "gen.0", b"alive")
    assert await bus.kv_items("weights") == {"version": b"2", "gen.0": b"alive"}


async def test_kv_watch_sees_current_then_new_values(bus: Bus) -> None:
    await bus.kv_put("weights", "version", b"1")
    seen: list[bytes] = []
    with anyio.fail_after(10):
        watch = bus.kv_watch("weights", "version")
        seen.append(await anext(watch))
        await bus.kv_put("weights", "version", b"2")
        await bus.kv_put("weights", "other", b"x")
        await bus.kv_put("weights", "version", b"3")
        seen.append(await anext(watch))
        seen.append(await anext(watch))
        await watch.aclose()  # type: ignore[attr-defined]
    assert seen == [b"1", b"2", b"3"]


async def test_kv_watch_skips_a_delete(bus: Bus) -> None:
    """A watcher yields values only: a deleted key's tombstone (empty bytes) yielded as a value would reach e.g. a
    weight subscriber as a manifest to parse and reject, or a waiter as the key's new value."""
    await bus.kv_put("weights", "version", b"a")
    kv = await bus.nc.jetstream().key_value("weights")
    seen: list[bytes] = []
    with anyio.fail_after(10):
        watch = bus.kv_watch("weights", "version")
        seen.append(await anext(watch))
        await kv.delete("version")
        await bus.kv_put("weights", "version", b"b")
        seen.append(await anext(watch))
        await watch.aclose()  # type: ignore[attr-defined]
    assert seen == [b"a", b"b"]


async def test_invalid_bucket_is_a_clear_error(bus: Bus) -> None:
    with pytest.raises(BusError, match="invalid KV bucket name"):
        await bus.kv_put("no spaces", "k", b"v")


async def test_object_store_roundtrip_of_a_few_megabytes(bus: Bus) -> None:
    blob = os.urandom(5 * 1024 * 1024 + 17)
    size, digest = await bus.object_put("weights", "v1.safetensors", blob)
    assert size == len(blob) and digest.startswith("SHA-256=")
    assert await bus.object_get("weights", "v1.safetensors", expect_digest=digest) == blob
    await bus.object_put("weights", "v1.safetensors", blob[::-1])
    with pytest.raises(BusError, match="replaced"):
        await bus.object_get("weights", "v1.safetensors", expect_digest=digest)
    await bus.object_put("weights", "v1.safetensors", blob)
    assert await bus.object_get("weights", "v1.safetensors") == blob
    with pytest.raises(BusError, match="not found"):
        await bus.object_get("weights", "v2.safetensors")
    assert await bus.object_info("weights", "v1.safetensors") == (size, digest)  # without reading it
    await bus.object_delete("weights", "v1.safetensors")
    with pytest.raises(BusError, match="not found"):
        await bus.object_info("weights", "v1.safetensors")


async def test_an_object_whose_bytes_changed_under_its_info_is_refused(bus: Bus) -> None:
    """A chunk whose bytes changed on the server (a corrupted or tampered stream) while the object's info stayed as it
    was must not be read back as the object: the digest recorded at put time is checked on every read, and a weight
    subscriber then keeps the weights it has instead of loading garbage."""
    blob = os.urandom(4096)
    await bus.object_put("weights", "v1.safetensors", blob)
    js = bus.nc.jetstream()
    info = await (await js.object_store("weights")).get_info("v1.safetensors")
    subject = f"$O.weights.C.{info.nuid}"
    chunk = await js.get_last_msg("OBJ_weights", subject)
    await js.delete_msg("OBJ_weights", chunk.seq)
    await js.publish(subject, bytes(b ^ 0xFF for b in blob[:16]) + blob[16:])  # same size, other bytes
    with pytest.raises(BusError, match="does not match its digest"):
        await bus.object_get("weights", "v1.safetensors")


async def test_ephemeral_publish_subscribe(bus: Bus) -> None:
    sub = await bus.subscribe_ephemeral("heartbeat.>")
    await bus.publish_ephemeral("heartbeat.gen.0", {"state": "running"})
    await bus.nc.publish(f"fw.{bus.topology}.eph.heartbeat.junk", b"not json")
    await bus.publish_ephemeral("heartbeat.gen.1", {"state": "starting"})
    with anyio.fail_after(5):
        first = await anext(sub)
        second = await anext(sub)
    assert (first.subject_suffix, first.payload) == ("heartbeat.gen.0", {"state": "running"})
    assert second.subject_suffix == "heartbeat.gen.1" and sub.dropped == 1
    await sub.aclose()
    with anyio.fail_after(5):
        assert [m async for m in sub] == []
