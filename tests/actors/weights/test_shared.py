"""The shared-memory weight slots: one copy by the learner, views for every generator, slots settled by flock.

Real files on a real filesystem, a real TorchEngine, and a real second process for the lock that outlives (or
dies with) its holder.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
import torch

from actors.engines import GenerationRequest, SamplingParams, TorchEngine, WeightUpdateError
from actors.engines._packing import is_packed
from actors.policy import GPTConfig, Policy
from actors.weights import (
    SharedMemoryTransport,
    WeightManifest,
    WeightPayloadError,
    WeightPublisher,
    WeightSubscriber,
    shm_root,
)
from topology.bus import Bus

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]


def _state(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "wte.weight": torch.randn(32, 16, generator=gen),
        "ln.bias": torch.randn(16, generator=gen),
        "half": torch.randn(3, generator=gen).to(torch.float16),  # odd byte sizes: later offsets unaligned
        "steps": torch.arange(5, dtype=torch.int64),
    }


def _slot(manifest: WeightManifest) -> str:
    return Path(manifest.location).name


async def test_round_trip_is_views_of_the_slot_and_a_held_version_is_never_rewritten(tmp_path: Path) -> None:
    transport = SharedMemoryTransport(tmp_path / "slots")
    v1 = await transport.put(1, _state(1))
    got = await transport.get(WeightManifest.from_json(v1.to_json()))
    assert got.shared and got.values_checked
    assert all(torch.equal(_state(1)[k], got[k]) for k in got)
    v2 = await transport.put(2, _state(2))
    v3 = await transport.put(3, _state(3))  # v1 is still held (``got``), v2 is the newest: a third slot
    assert len({_slot(v1), _slot(v2), _slot(v3)}) == 3
    assert all(torch.equal(_state(1)[k], got[k]) for k in got), "a held version was rewritten"
    del got
    gc.collect()
    v4 = await transport.put(4, _state(4))  # v1's slot is free again, and the oldest one
    assert _slot(v4) == _slot(v1)
    with pytest.raises(WeightPayloadError, match=r"v1: superseded \(its slot holds v4 now\)"):
        await transport.get(v1)
    again = await transport.get(v4)
    assert all(torch.equal(_state(4)[k], again[k]) for k in again)


def test_a_slot_held_by_another_process_is_free_once_that_process_is_killed(tmp_path: Path) -> None:
    transport = SharedMemoryTransport(tmp_path / "slots")

    def put(version: int) -> WeightManifest:
        return anyio.run(transport.put, version, _state(version))

    v1 = put(1)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import asyncio, sys, time
                from actors.weights import SharedMemoryTransport, WeightManifest
                manifest = WeightManifest.from_json({v1.to_json()!r})
                held = asyncio.run(SharedMemoryTransport({str(tmp_path / "slots")!r}).get(manifest))
                print(float(held["ln.bias"].sum()), flush=True)
                time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert float(holder.stdout.readline()) == pytest.approx(float(_state(1)["ln.bias"].sum()))
        v2 = put(2)
        v3 = put(3)
        assert _slot(v1) not in (_slot(v2), _slot(v3)), "rewrote the slot another process serves from"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    v4 = put(4)
    assert _slot(v4) == _slot(v1)


async def test_non_finite_values_are_not_published_and_the_newest_good_version_stays_readable(
    tmp_path: Path,
) -> None:
    transport = SharedMemoryTransport(tmp_path / "slots")
    good = await transport.put(1, _state(1))
    bad = _state(2)
    bad["wte.weight"][3, 4] = float("nan")
    with pytest.raises(WeightPayloadError, match=r"wte\.weight: contains NaN or infinite values: not published"):
        await transport.put(2, bad)
    got = await transport.get(good)
    assert torch.equal(got["wte.weight"], _state(1)["wte.weight"])
    after = await transport.put(3, _state(3))
    assert torch.equal((await transport.get(after))["ln.bias"], _state(3)["ln.bias"])


async def test_tensors_of_several_pieces_arrive_whole_and_a_bad_value_in_a_late_piece_is_caught(
    tmp_path: Path,
) -> None:
    """The copy goes in pieces over several threads: a tensor of 2.5 pieces (odd byte offsets after the fp16
    one, sorted last) round-trips bit for bit, so do finite values too large to sum, and an infinity in its last
    piece fails the publish with its name."""
    from actors.weights._copy import PIECE

    transport = SharedMemoryTransport(tmp_path / "slots")
    state = _state(1)
    state["zz.big"] = torch.randn(PIECE * 5 // 2 // 4, generator=torch.Generator().manual_seed(7))
    got = await transport.get(await transport.put(1, state))
    assert all(torch.equal(got[k], state[k]) for k in state)
    state["zz.big"].fill_(3e38)  # finite values whose sum is not: checked value by value, then published
    got = await transport.get(await transport.put(2, state))
    assert torch.equal(got["zz.big"], state["zz.big"])
    state["zz.big"][-1] = float("inf")
    with pytest.raises(WeightPayloadError, match=r"zz\.big: contains NaN or infinite values: not published"):
        await transport.put(3, state)


def test_publishing_leaves_the_torch_threads_of_the_learner_alone(tmp_path: Path) -> None:
    """The copier threads run torch on one thread each; the learner's threads, those started after a publish
    included (its next training step's), keep the pool the process was given."""
    script = textwrap.dedent(
        f"""
        import asyncio, threading, torch
        from actors.weights import _copy
        from actors.weights import _shared
        from tests.actors.weights.test_shared import _state
        torch.set_num_threads(2)
        asyncio.run(_shared.SharedMemoryTransport({str(tmp_path / "slots")!r}).put(1, _state(1)))
        seen = {{}}
        later = threading.Thread(target=lambda: seen.update(later=torch.get_num_threads()))
        later.start(); later.join()
        print(torch.get_num_threads(), seen["later"], _copy._pool().submit(torch.get_num_threads).result())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "2", "1"]


async def test_when_every_slot_is_held_the_publish_waits_then_says_why(tmp_path: Path) -> None:
    transport = SharedMemoryTransport(tmp_path / "slots", max_slots=2, wait_s=0.2)
    held = [await transport.get(await transport.put(v, _state(v))) for v in (1, 2)]
    with pytest.raises(WeightPayloadError, match="every one of the 2 shared-memory weight slots"):
        await transport.put(3, _state(3))
    del held
    gc.collect()
    assert _slot(await transport.put(3, _state(3))) == "slot-0"


async def test_a_manifest_whose_slot_is_gone_or_mislabelled_is_rejected(tmp_path: Path) -> None:
    transport = SharedMemoryTransport(tmp_path / "slots")
    v1 = await transport.put(1, _state(1))
    wrong = WeightManifest(1, "shm", v1.location, {"other": v1.tensors["ln.bias"]}, v1.nbytes)
    with pytest.raises(WeightPayloadError, match=r"v1 rejected: missing other; unexpected half, ln\.bias"):
        await transport.get(wrong)
    transport.close()
    with pytest.raises(WeightPayloadError, match=r"v1: shared-memory slot \S+ is gone"):
        await transport.get(v1)


async def test_slots_of_a_run_whose_run_dir_is_gone_are_removed(tmp_path: Path) -> None:
    parent = tmp_path / "shm"
    gone = SharedMemoryTransport(parent / "old", owner=tmp_path / "old-run")
    (tmp_path / "old-run").mkdir()
    await gone.put(1, _state(1))
    alive = SharedMemoryTransport(parent / "alive", owner=tmp_path)
    await alive.put(1, _state(1))
    (tmp_path / "old-run").rmdir()
    await SharedMemoryTransport(parent / "new", owner=tmp_path / "new-run").put(1, _state(1))
    assert sorted(p.name for p in parent.iterdir()) == ["alive", "new"]
    assert shm_root(tmp_path) == shm_root(tmp_path / "." / "")  # every replica of a run agrees on it


async def test_a_cpu_engine_serves_from_the_slot_and_lets_a_replaced_version_go(tmp_path: Path) -> None:
    policy = Policy.tiny_gpt(GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=64), seed=0)
    trained = [Policy.tiny_gpt(GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=64), seed=s) for s in (1, 2, 3)]
    engine = TorchEngine(policy, max_batch_size=4)
    transport = SharedMemoryTransport(tmp_path / "slots", max_slots=2)
    prompt = tuple(policy.tokenizer.encode("1+2="))
    request = GenerationRequest("r", prompt, SamplingParams(max_new_tokens=6, temperature=0.0, seed=0))
    try:
        own = {name: t.data_ptr() for name, t in policy.state_dict().items()}
        v1 = await transport.put(1, trained[0].state_dict())
        await engine.update_weights_from(1, lambda into: transport.get(v1, into=into))
        live = policy.state_dict()
        assert all(torch.equal(live[k], trained[0].state_dict()[k]) for k in live)
        assert not any(live[k].data_ptr() == own[k] for k in live), "copied instead of served from the slot"
        assert (await engine.generate([request]))[0].versions[-1] == 1
        del live
        v2 = await transport.put(2, trained[1].state_dict())
        await engine.update_weights_from(2, lambda into: transport.get(v2, into=into))
        gc.collect()
        v3 = await transport.put(3, trained[2].state_dict())  # two slots: v1's was let go by the engine
        assert _slot(v3) == _slot(v1)
        # a copying update after shared ones goes into the engine's own set, never into a slot
        await engine.update_weights(4, trained[0].state_dict())
        live = policy.state_dict()
        assert all(torch.equal(live[k], trained[0].state_dict()[k]) for k in live)
        assert is_packed(live), "not the engine's own set"
        slot = await transport.get(v2)
        assert all(torch.equal(slot[k], trained[1].state_dict()[k]) for k in slot), "wrote into a published slot"
    finally:
        await engine.close()


async def test_an_engine_refuses_a_slot_of_another_model_and_keeps_serving(tmp_path: Path) -> None:
    """The writer checked the values; the names and shapes are checked against the engine's own model, which the
    manifest knows nothing of."""
    policy = Policy.tiny_gpt(GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=64), seed=0)
    wider = Policy.tiny_gpt(GPTConfig(n_layer=1, n_embd=48, n_head=2, block_size=64), seed=1)
    engine = TorchEngine(policy, max_batch_size=4)
    transport = SharedMemoryTransport(tmp_path / "slots")
    before = {name: t.clone() for name, t in policy.state_dict().items()}
    try:
        manifest = await transport.put(1, wider.state_dict())
        with pytest.raises(WeightUpdateError, match="does not match the model"):
            await engine.update_weights_from(1, lambda into: transport.get(manifest, into=into))
        assert engine.version == 0
        assert all(torch.equal(t, before[name]) for name, t in policy.state_dict().items())
    finally:
        await engine.close()


def test_a_slot_that_does_not_fit_fails_the_publish_with_a_message_not_a_crash(tmp_path: Path) -> None:
    """A full tmpfs would fail the copy with a SIGBUS mid-write; the slot's pages are taken first, so it fails
    there, with a message. (A file-size limit stands in for the full filesystem: the same failing call.)"""
    script = textwrap.dedent(
        f"""
        import asyncio, resource, signal, torch
        from actors.weights import SharedMemoryTransport, WeightPayloadError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
        try:
            asyncio.run(SharedMemoryTransport({str(tmp_path / "slots")!r}).put(1, {{"w": torch.ones(1 << 16)}}))
        except WeightPayloadError as exc:
            print(exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("no room for a 0.3 MB weight slot in "), done.stdout
    assert "set the learner's weight_transport to disk" in done.stdout


async def test_a_slot_takes_a_version_of_another_size_and_readers_map_it_anew(tmp_path: Path) -> None:
    transport = SharedMemoryTransport(tmp_path / "slots", max_slots=2)
    reader = SharedMemoryTransport(tmp_path / "slots")
    small = await transport.put(1, _state(1))
    assert torch.equal((await reader.get(small))["ln.bias"], _state(1)["ln.bias"])
    await transport.put(2, _state(2))
    bigger = {**_state(3), "extra": torch.randn(4096)}  # into the first slot again, now larger
    third = await transport.put(3, bigger)
    assert _slot(third) == _slot(small)
    got = await reader.get(third)  # the reader's cached mapping of the old size is replaced
    assert all(torch.equal(got[k], bigger[k]) for k in bigger)


def test_a_writer_killed_mid_copy_leaves_a_slot_that_names_no_version(tmp_path: Path) -> None:
    """SIGKILL between two pieces of v2 (the second piece's copy kills its own process): no slot claims v2, v1 is
    intact, and the next life of the learner writes v2 for real."""
    script = textwrap.dedent(
        f"""
        import asyncio, os, signal, torch
        from actors.weights import _shared
        from tests.actors.weights.test_shared import _state
        transport = _shared.SharedMemoryTransport({str(tmp_path / "slots")!r})
        asyncio.run(transport.put(1, _state(1)))
        from actors.weights import _copy
        copy, calls = _copy._copy_piece, []
        def dying(*args):
            calls.append(1)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            copy(*args)
        _copy._copy_piece = dying
        transport._newest = None  # rewrite v1's own slot: the worst place to die
        asyncio.run(transport.put(2, _state(2)))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    again = SharedMemoryTransport(tmp_path / "slots")
    assert again.find(2) is None and again.find(1) is None  # v1's slot was being rewritten: it names nothing
    v2 = anyio.run(again.put, 2, _state(2))
    assert torch.equal(anyio.run(again.get, v2)["wte.weight"], _state(2)["wte.weight"])


async def test_a_version_whose_slot_went_with_the_run_before_a_resume_is_not_retried_nor_shown_failing(
    bus: Bus, tmp_path: Path
) -> None:
    """After a resume the bus still announces the last version of the run before, whose slot was removed with it: each
    generator was told it could not load it, again and again (a retried rejection), and the live view showed
    "cannot load vN" until the learner published. It is a version that can never be loaded, not a failure."""
    policy = Policy.tiny_gpt(GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=64), seed=0)
    before = SharedMemoryTransport(tmp_path / "before")
    await WeightPublisher(bus, bus.topology, before).publish(1, policy.state_dict())
    before.close()  # the run stopped; its slots are gone
    engine = TorchEngine(Policy.tiny_gpt(GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=64), seed=1))
    now = SharedMemoryTransport(tmp_path / "now")
    events: list[str] = []
    subscriber = WeightSubscriber(
        bus, bus.topology, engine, {now.name: now}, retry_s=0.05, on_event=lambda event, _: events.append(event)
    )
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(subscriber.run)
            await anyio.sleep(1.0)  # twenty retries' time
            assert events == ["weights.unavailable"] and subscriber.rejected == 0 and subscriber.failing == ""
            await WeightPublisher(bus, bus.topology, now).publish(2, policy.state_dict())  # the resumed learner's
            with anyio.fail_after(10):
                for _ in iter(int, 1):  # until the resumed learner's version is swapped in
                    if engine.version == 2:
                        break
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    finally:
        now.close()
        await engine.close()
