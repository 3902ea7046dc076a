"""Weight broadcast groups: trainer (rank 0) ↔ fake SGLang server (rank 1), and across two processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest
import torch

from actors.engines import EngineHTTPError, GenerationRequest, SamplingParams, SGLangEngine
from actors.engines._group import DistributedWeights, WeightBroadcaster, describe, parse_dtype
from actors.testing import FakeSGLangServer, free_port
from tests.actors.engines._rig import make_engine, perturbed

REQUEST = GenerationRequest(
    "r", (23, 17, 23, 35), SamplingParams(max_new_tokens=10, temperature=1.0, seed=3, ignore_eos=True)
)


def test_sglang_update_through_a_gloo_group() -> None:
    async def main() -> None:
        engine = make_engine()
        broadcaster = WeightBroadcaster("127.0.0.1", free_port(), world_size=2, timeout_s=30)
        try:
            async with FakeSGLangServer(engine) as server, SGLangEngine(server.url) as client:
                [before] = await client.generate([REQUEST])
                for version in (1, 2):  # joins once, then reuses the group
                    new = perturbed(engine, seed=version)
                    await client.update_weights(version, DistributedWeights(broadcaster, new))
                    assert client.version == version == engine.version
                    assert all(torch.equal(t, new[n]) for n, t in engine.policy.state_dict().items())
                [after] = await client.generate([REQUEST])
                assert after.versions == (2,) * 10 and after.logprobs != before.logprobs
                assert not server.host.paused
        finally:
            broadcaster.close()
            await engine.close()

    asyncio.run(main())


def test_bad_broadcast_is_drained_rejected_and_old_weights_serve() -> None:
    async def main() -> None:
        engine = make_engine()
        broadcaster = WeightBroadcaster("127.0.0.1", free_port(), world_size=2, timeout_s=30)
        try:
            async with FakeSGLangServer(engine) as server, SGLangEngine(server.url) as client:
                [before] = await client.generate([REQUEST])
                bad = perturbed(engine, seed=1)
                name = sorted(bad)[0]
                bad[name] = torch.ones(5, 5)
                with pytest.raises(EngineHTTPError) as info:
                    await asyncio.wait_for(client.update_weights(1, DistributedWeights(broadcaster, bad)), 30)
                assert info.value.status == 400 and name in str(info.value) and "still serving 0" in str(info.value)
                assert engine.version == client.version == 0 and not server.host.paused
                [after] = await client.generate([REQUEST])
                assert after.token_ids == before.token_ids
                good = perturbed(engine, seed=2)  # the group is still usable after a rejected payload
                await client.update_weights(1, DistributedWeights(broadcaster, good))
                assert engine.version == 1
        finally:
            broadcaster.close()
            await engine.close()

    asyncio.run(main())


RECEIVER = textwrap.dedent(
    """
    import sys, torch
    from actors.engines._group import WeightGroup, receive_weights
    port = int(sys.argv[1])
    group = WeightGroup("127.0.0.1", port, 2, 1, timeout_s=30)
    expected = {"a.weight": ((3, 4), torch.float32), "b.bias": ((5,), torch.float32)}
    got = receive_weights(group, ["a.weight", "b.bias"], ["bfloat16", "float32"], [[3, 4], [5]], expected)
    group.close()  # left to interpreter teardown, gloo's threads can outlive it: "terminate called ..." (abort)
    print(repr({n: (t.dtype, float(t.sum())) for n, t in sorted(got.items())}))
    """
)


@pytest.mark.slow  # a second interpreter importing torch
def test_two_process_broadcast_in_name_order() -> None:
    port = free_port()
    receiver = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    broadcaster = WeightBroadcaster("127.0.0.1", port, world_size=2, timeout_s=30)
    try:
        tensors = {"b.bias": torch.arange(5.0), "a.weight": torch.full((3, 4), 2.0, dtype=torch.bfloat16)}
        assert describe(tensors) == (["a.weight", "b.bias"], ["bfloat16", "float32"], [[3, 4], [5]])
        broadcaster.connect()
        assert broadcaster.broadcast(tensors) == ["a.weight", "b.bias"]
        out, err = receiver.communicate(timeout=60)
        assert receiver.returncode == 0, err
        assert out.strip() == "{'a.weight': (torch.float32, 24.0), 'b.bias': (torch.float32, 10.0)}"
    finally:
        broadcaster.close()
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


def test_parse_dtype_names_the_bad_string() -> None:
    assert parse_dtype("torch.bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="'float33'"):
        parse_dtype("float33")
    with pytest.raises(ValueError, match="world_size"):
        WeightBroadcaster("127.0.0.1", 1, world_size=1)


PACKED_RECEIVER = textwrap.dedent(
    """
    import sys, torch
    from actors.engines._group import WeightGroup, receive_weights
    from actors.engines._packing import allocate_packed
    group = WeightGroup("127.0.0.1", int(sys.argv[1]), 2, 1, timeout_s=30)
    names, dtypes, shapes = ["a.weight", "b.bias", "c.half"], ["bfloat16", "float32", "float16"], [[3, 4], [5], [3]]
    expected = {n: (tuple(s), getattr(torch, d)) for n, d, s in zip(names, dtypes, shapes)}
    into = allocate_packed({n: torch.empty(s, dtype=getattr(torch, d)) for n, d, s in zip(names, dtypes, shapes)})
    direct = receive_weights(group, names, dtypes, shapes, expected, into=into, packed=True)
    same = all(direct[n].data_ptr() == into[n].data_ptr() for n in names)
    own = receive_weights(group, names, dtypes, shapes, expected, packed=True)
    try:
        wrong = {**expected, "a.weight": ((4, 3), torch.bfloat16)}
        receive_weights(group, names, dtypes, shapes, wrong, packed=True)
        error = ""
    except ValueError as exc:
        error = str(exc)
    group.close()
    sums = [{n: float(t.float().sum()) for n, t in sorted(got.items())} for got in (direct, own)]
    print(repr((same, direct.values_checked, *sums, error)))
    """
)


@pytest.mark.slow  # a second interpreter importing torch
def test_a_packed_broadcast_lands_in_a_packed_standby_set_without_a_copy() -> None:
    """One collective per version between our own ends: received straight into a packed set (the CPU engine's
    standby), else into a buffer of its own; a payload the engine cannot take is still drained, then refused; the
    sender checks the values (the receivers need not), and does not send a version with a NaN."""
    port = free_port()
    receiver = subprocess.Popen(
        [sys.executable, "-c", PACKED_RECEIVER, str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    broadcaster = WeightBroadcaster("127.0.0.1", port, world_size=2, timeout_s=30)
    try:
        tensors = {
            "b.bias": torch.arange(5.0),
            "a.weight": torch.full((3, 4), 2.0, dtype=torch.bfloat16),
            "c.half": torch.ones(3, dtype=torch.float16),  # 6 bytes: the next tensor would start unaligned
        }
        broadcaster.connect()
        for _ in range(3):
            assert broadcaster.broadcast(tensors, packed=True) == ["a.weight", "b.bias", "c.half"]
        out, err = receiver.communicate(timeout=60)
        assert receiver.returncode == 0, err
        sums = {"a.weight": 24.0, "b.bias": 10.0, "c.half": 3.0}
        expected = (True, True, sums, sums, "a.weight: shape [3, 4] does not match the model's [4, 3]")
        assert out.strip() == repr(expected)
        poisoned = {**tensors, "c.half": torch.tensor([1.0, float("nan"), 1.0], dtype=torch.float16)}
        with pytest.raises(ValueError, match=r"c\.half: contains NaN or infinite values: not sent"):
            broadcaster.broadcast(poisoned, packed=True)  # checked before the collective: nobody waits for it
    finally:
        broadcaster.close()
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


def test_a_cpu_engine_keeps_both_weight_sets_packed_and_serves_the_same_values() -> None:
    from actors.engines._packing import is_packed

    async def main() -> None:
        engine = make_engine()
        try:
            new = perturbed(engine, seed=1)
            [before] = await engine.generate([REQUEST])
            await engine.update_weights(1, new)
            live = engine.policy.state_dict()
            assert is_packed(live) and is_packed(engine._spare or {})
            assert all(torch.equal(live[n], new[n]) for n in new)
            [after] = await engine.generate([REQUEST])
            assert after.versions == (1,) * 10 and after.logprobs != before.logprobs
        finally:
            await engine.close()

    asyncio.run(main())


def test_free_port_is_outside_the_range_sockets_bound_to_port_0_draw_from() -> None:
    """The TCPStore's port came from free_port, which bound port 0 and let it go; before the store bound it, an HTTP
    server bound to port 0 (the test's own fake SGLang server, or another worker's) got it, and the store's handshake
    was answered in HTTP (a stress run: a racy test). Ports drawn below the ephemeral range cannot go to a socket bound
    to port 0."""
    import socket

    from actors.testing._server import _ephemeral_low

    for _ in range(20):
        port = free_port()
        assert 10000 <= port < _ephemeral_low()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free, as said
