"""A running gateway + serving generator (tiny GPT) over the session's real nats-server, in a thread.

The actors run on their own event loop in a background thread, so tests can use the official, synchronous
``openai`` client exactly as a user would (only ``base_url`` and ``api_key`` set).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from actors.gateway import GatewayActor
from actors.generator._actor import GeneratorActor
from actors.protocol import FeedbackMsg, TrafficMsg
from tests.conftest import fresh_topology
from topology import load_spec
from topology.bus import Bus, EmbeddedNats
from topology.runtime import ActorContext

T = TypeVar("T")
API_KEY = "test-key-0123456789"

SPEC = """
name: {name}
bus: {{embedded: true}}
policy:
  model: builtin:tiny-gpt
  config: {{preset: tiny, n_layer: 1, n_embd: 32, n_head: 2}}
domains:
  arithmetic: {{source: builtin:arithmetic, verifier: math, group_size: 2, heldout: 10}}
actors:
  generator: {{max_batch_size: 8, device: cpu, serve: true}}
  gateway:
    port: 0
    api_keys_file: keys.txt
    default_domain: arithmetic
    max_concurrency: 6
    max_streams: 3
    max_tokens: 64
    default_max_tokens: 8
    max_body_bytes: 4096
    request_timeout_s: 20
    body_timeout_s: 1
  joiner: {{window_s: 3600}}   # not run here: it makes feedback count once per request, as the gateway then says
channels:
  prompts: {{external: true}}
"""


@dataclass
class Running:
    url: str
    loop: asyncio.AbstractEventLoop
    bus: Bus
    generator: GeneratorActor
    gateway: GatewayActor
    groups: list[int] = field(default_factory=lambda: [0])

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 20) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def stored(self, channel: str) -> int:
        """Messages stored on a channel's stream right now."""

        async def count() -> int:
            info = await self.bus.nc.jetstream().stream_info(self.bus.stream(channel))
            return int(info.state.messages)

        try:
            return self.run(count())
        except Exception:  # the stream does not exist yet: nothing was ever published
            return 0

    def read(self, channel: str, wanted: int) -> list[Any]:
        """Every message on ``channel`` from the start (a fresh consumer group), waiting for ``wanted`` of them."""
        model = TrafficMsg if channel == "traffic" else FeedbackMsg
        self.groups[0] += 1
        group = f"reader-{self.groups[0]}"

        async def read() -> list[Any]:
            out: list[Any] = []
            with anyio.move_on_after(5):
                async with self.bus.consume(channel, group, model=model) as deliveries:
                    async for delivery in deliveries:
                        out.append((delivery.id, delivery.payload))
                        await delivery.ack()
                        if len(out) >= wanted:
                            break
            return out

        return self.run(read())


@pytest.fixture(scope="package")
def gateway(embedded_nats: EmbeddedNats, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = tmp_path_factory.mktemp("gateway")
    name = fresh_topology()
    (root / "spec.yaml").write_text(SPEC.format(name=name))
    (root / "keys.txt").write_text(f"# test keys\n{API_KEY}\n")
    spec = load_spec(root / "spec.yaml")
    loop = asyncio.new_event_loop()
    ready: Future[Running] = Future()
    stop = asyncio.Event()

    async def main() -> None:
        async with await Bus.connect(embedded_nats.url, topology=name, name="gateway-test") as bus:
            ctxs = {
                actor: ActorContext(
                    topology=name, actor=actor, replica=0, kind=actor, spec=spec, bus=bus, run_dir=Path(root)
                )
                for actor in ("generator", "gateway")
            }
            generator = GeneratorActor(ctxs["generator"], spec.actors["generator"].config)
            gateway = GatewayActor(ctxs["gateway"], spec.actors["gateway"].config)
            await generator.start()
            await gateway.start()
            async with anyio.create_task_group() as tg:
                tg.start_soon(generator.run)
                tg.start_soon(gateway.run)
                assert gateway.url is not None
                await _wait_until_served(bus, name)
                ready.set_result(Running(gateway.url, loop, bus, generator, gateway))
                await stop.wait()
                for ctx in ctxs.values():
                    ctx.stopping.set()
            await gateway.stop()
            await generator.stop()

    def thread_main() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(main())
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    thread = threading.Thread(target=thread_main, name="gateway-test-loop", daemon=True)
    thread.start()
    running = ready.result(timeout=60)
    yield running
    loop.call_soon_threadsafe(stop.set)
    thread.join(timeout=30)


async def _wait_until_served(bus: Bus, topology: str) -> None:
    from actors.generator._serve import ping_subject

    for _ in range(100):
        try:
            await bus.nc.request(ping_subject(topology), b"{}", timeout=0.5)
            return
        except Exception:
            await asyncio.sleep(0.05)
    raise RuntimeError("the generator never started serving")
