"""The serve protocol between a generator and the gateway, over a real nats-server: deltas then a final
message, ``busy`` at capacity, 400 for bad parameters, no responders when nobody serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.engines import SamplingParams, TorchEngine
from actors.gateway import GenerationError, GeneratorsBusy, NoGenerators, ServeClient
from actors.generator._serve import serve
from actors.policy import GPTConfig, Policy
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

            bad = await client.call("r2", [1, 5], {**params(3), "top_p": 7}, stream=False, timeout_s=5)
            with pytest.raises(GenerationError, match="top_p") as err:
                _ = [m async for m in bad.messages(5)]
            assert err.value.status == 400

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
        if client._pending:
            break
    await anyio.sleep(0.1)
    return done
