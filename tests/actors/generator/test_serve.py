"""The serve protocol between a generator and the gateway, over a real nats-server: deltas then a final
message, ``busy`` at capacity, 400 for bad parameters, no responders when nobody serves; a cancel aborts the
request in the engine, even one that overtook its request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from actors.engines import SamplingParams, TorchEngine
from actors.gateway import GenerationError, GeneratorsBusy, NoGenerators, ServeClient
from actors.generator._serve import serve
from actors.policy import GPTConfig, Policy
from actors.protocol import cancel_subject, serve_subject
from topology import load_spec
from topology.bus import Bus
from topology.runtime import ActorContext

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

SPEC = """
name: {name}
policy: {{model: builtin:tiny-gpt}}
domains: {{arithmetic: {{source: builtin:arithmetic, verifier: math}}}}
actors: {{generator: {{serve: true}}}}
channels: {{prompts: {{external: true}}}}
"""


def context(bus: Bus, tmp_path: Path) -> ActorContext:
    (tmp_path / "spec.yaml").write_text(SPEC.format(name=bus.topology))
    spec = load_spec(tmp_path / "spec.yaml")
    return ActorContext(
        topology=bus.topology, actor="generator", replica=0, kind="generator", spec=spec, bus=bus, run_dir=tmp_path
    )


def params(n: int) -> dict[str, Any]:
    return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True).to_wire()


async def test_stream_busy_and_bad_params(bus: Bus, tmp_path: Path) -> None:
    ctx = context(bus, tmp_path)
    engine = TorchEngine(Policy.tiny_gpt(GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=64)))
    client = ServeClient(bus.nc, bus.topology, attempts=2)
    await client.start()
    try:
        with pytest.raises(NoGenerators):
            await client.call("r0", [1, 5, 6], params(3), stream=False, timeout_s=5)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: serve(ctx, engine, max_in_flight=1))
            await anyio.sleep(0.2)
            call = await client.call("r1", [1, 5, 6], params(5), stream=True, timeout_s=5)
            messages = [m async for m in call.messages(5)]
            call.close()
            deltas = [t for m in messages if m["type"] == "delta" for t in m["token_ids"]]
            final = messages[-1]
            assert final["type"] == "final" and final["token_ids"] == deltas and len(deltas) == 5
            assert len(final["logprobs"]) == len(final["versions"]) == 5 and final["generator"] == "generator/0"

            with pytest.raises(GenerationError, match="top_p") as err:
                await client.call("r2", [1, 5], {**params(3), "top_p": 7}, stream=False, timeout_s=5)
            assert err.value.status == 400 and not client.pending

            await engine.pause()  # the one slot stays taken: the next request is refused at once
            held = await _start_call(client, tg)
            with pytest.raises(GeneratorsBusy):
                await client.call("r4", [1, 5], params(2), stream=False, timeout_s=5)
            await engine.resume()
            await held.wait()
            assert ctx.counters.get("serve_busy") >= 2 and ctx.counters.get("serve_requests") == 2
            ctx.stopping.set()
    finally:
        await client.close()
        await engine.close()


async def _start_call(client: ServeClient, tg: anyio.abc.TaskGroup) -> anyio.Event:
    done = anyio.Event()

    async def run() -> None:
        call = await client.call("r3", [1, 5], params(2), stream=False, timeout_s=5)
        _ = [m async for m in call.messages(5)]
        call.close()
        done.set()

    tg.start_soon(run)
    for _ in range(100):  # wait until the generator took it
        await anyio.sleep(0.01)
        if client.pending:
            break
    await anyio.sleep(0.1)
    return done


async def _replies(bus: Bus, request: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """Publish a serve request with a reply inbox of its own; returns the subscription and its growing replies."""
    replies: list[dict[str, Any]] = []

    async def on_reply(msg: Any) -> None:
        replies.append(orjson.loads(msg.data))

    inbox = bus.nc.new_inbox()
    sub = await bus.nc.subscribe(inbox, cb=on_reply)
    await bus.nc.publish(serve_subject(bus.topology), orjson.dumps({"v": 1, **request}), reply=inbox)
    return sub, replies


async def _until(check: Any, timeout_s: float = 10.0) -> None:
    with anyio.fail_after(timeout_s):
        while not check():  # noqa: ASYNC110 -- polls counters that have no event to wait on
            await anyio.sleep(0.01)


async def test_a_cancel_aborts_the_request_in_the_engine(bus: Bus, tmp_path: Path) -> None:
    ctx = context(bus, tmp_path)
    engine = TorchEngine(Policy.tiny_gpt(GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=128)))

    async def slow(_: int) -> None:
        await anyio.sleep(0.02)

    engine.step_hook = slow
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: serve(ctx, engine, max_in_flight=4))
            await anyio.sleep(0.2)
            request = {"request_id": "r-cancel", "prompt_ids": [1, 5, 6], "params": params(100), "stream": True}
            sub, replies = await _replies(bus, request)
            await _until(lambda: len(replies) >= 2)  # it is decoding
            await bus.nc.publish(cancel_subject(bus.topology), orjson.dumps({"v": 1, "request_id": "r-cancel"}))
            await _until(lambda: engine.stats()["requests_aborted"] == 1)
            await _until(lambda: ctx.counters.get("serve_in_flight") == 0)
            seen = len(replies)
            await anyio.sleep(0.3)
            assert len(replies) == seen < 100 and all(r["type"] == "delta" for r in replies)  # nothing after it
            assert ctx.counters.get("serve_cancelled") == 1 and not ctx.counters.get("serve_requests")
            await sub.unsubscribe()
            ctx.stopping.set()
    finally:
        await engine.close()


async def test_a_cancel_that_overtakes_its_request_still_stops_it(bus: Bus, tmp_path: Path) -> None:
    ctx = context(bus, tmp_path)
    engine = TorchEngine(Policy.tiny_gpt(GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=64)))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: serve(ctx, engine, max_in_flight=4))
            await anyio.sleep(0.2)
            await bus.nc.publish(cancel_subject(bus.topology), orjson.dumps({"v": 1, "request_id": "r-early"}))
            await bus.nc.flush()
            await anyio.sleep(0.1)
            request = {"request_id": "r-early", "prompt_ids": [1, 5, 6], "params": params(5), "stream": False}
            sub, replies = await _replies(bus, request)
            await _until(lambda: ctx.counters.get("serve_cancelled") == 1)
            await anyio.sleep(0.2)
            assert replies == [] and engine.stats()["requests_finished"] == 0
            await sub.unsubscribe()
            ctx.stopping.set()
    finally:
        await engine.close()


SERVICE_SPEC = """
name: {name}
policy: {{model: builtin:tiny-gpt, config: {{n_layer: 1, n_embd: 32, n_head: 2}}}}
domains: {{arithmetic: {{source: builtin:arithmetic, verifier: math}}}}
actors:
  source: {{}}
  generator: {{}}
  verify: {{}}
  learner: {{}}
  serving: {{kind: generator, consumes: [], publishes: [], serve: true, follow: serving, device: cpu}}
"""


async def test_a_serving_generator_of_an_untrained_model_answers_users_only_once_a_version_is_promoted(
    bus: Bus, tmp_path: Path
) -> None:
    """A builtin model starts from random weights: until the gate promotes a version, the gateway hears that no
    generator serves (its 503) instead of answers from them."""
    from actors.generator._actor import GeneratorActor
    from actors.protocol import SERVING
    from actors.testing import running_actor
    from actors.weights import SafetensorsDirTransport, WeightPublisher

    (tmp_path / "spec.yaml").write_text(SERVICE_SPEC.format(name=bus.topology))
    spec = load_spec(tmp_path / "spec.yaml")
    client = ServeClient(bus.nc, bus.topology, attempts=2)
    await client.start()
    try:
        async with running_actor(GeneratorActor, spec, "serving", bus, tmp_path) as actor:
            await anyio.sleep(1.0)  # time enough to subscribe, were it going to
            with pytest.raises(NoGenerators):
                await client.call("r0", [1, 5, 6], params(3), stream=False, timeout_s=5)
            assert actor.engine is not None and actor.engine.version == 0
            state = {name: t.clone() for name, t in actor.engine.policy.state_dict().items()}
            publisher = WeightPublisher(bus, bus.topology, SafetensorsDirTransport(tmp_path / "weights"), key=SERVING)
            await publisher.publish(1, state)
            with anyio.fail_after(20):
                while True:
                    try:
                        call = await client.call("r1", [1, 5, 6], params(3), stream=False, timeout_s=5)
                        break
                    except NoGenerators:
                        await anyio.sleep(0.1)
            final = [m async for m in call.messages(5)][-1]
            call.close()
            assert final["type"] == "final" and final["versions"] == [1, 1, 1]
    finally:
        await client.close()
