"""The generator actor against a real nats-server: a prompt the engine can never serve is refused at once, not
retried."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from actors.generator._actor import GeneratorActor
from actors.generator._config import GeneratorConfig
from actors.protocol import PromptMsg, RolloutMsg
from actors.testing import actor_context
from tests.actors.learner._helpers import wait_until
from topology import BusSpec, Spec, load_spec
from topology.bus import DEADLETTER, Bus, EmbeddedNats

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@asynccontextmanager
async def _generator(
    embedded_nats: EmbeddedNats, tmp_path: Path, *, ack_wait_s: float | None = None
) -> AsyncIterator[tuple[Bus, GeneratorActor]]:
    """A started generator of `_spec` on a bus connection of its own, with its channels; stopped at the end."""
    spec = _spec(tmp_path)
    settings = BusSpec(ack_wait_s=ack_wait_s or spec.bus.ack_wait_s, max_deliver=spec.bus.max_deliver)
    async with await Bus.connect(embedded_nats.url, topology=spec.name, name="gen", settings=settings) as bus:
        for channel in ("prompts", "rollouts", DEADLETTER):
            await bus.ensure_channel(channel)
        config = spec.actors["generator"].config
        assert isinstance(config, GeneratorConfig)
        actor = GeneratorActor(actor_context(spec, "generator", bus, tmp_path), config)
        await actor.start()
        try:
            yield bus, actor
        finally:
            await actor.stop()


async def _first_rollout(bus: Bus, within_s: float = 30.0) -> RolloutMsg:
    """The next rollout on `rollouts` (consumer group ``check``), acked."""
    with anyio.fail_after(within_s):
        async with bus.consume("rollouts", "check", model=RolloutMsg) as rollouts:
            async for delivery in rollouts:
                await delivery.ack()
                assert isinstance(delivery.payload, RolloutMsg)
                return delivery.payload
    raise AssertionError("the rollouts consumer ended")


def _spec(tmp_path: Path) -> Spec:
    """A generator of a one-layer builtin model (a context of 32 tokens) on the arithmetic domain, alone."""
    path = tmp_path / "spec.yaml"
    path.write_text(
        f"name: g-{uuid.uuid4().hex[:8]}\nbus: {{embedded: true}}\nruntime: local\n"
        "policy: {model: builtin:tiny-gpt, config: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 32}}\n"
        "domains:\n  arithmetic: {source: builtin:arithmetic, verifier: math, max_new_tokens: 4}\n"
        "actors:\n  generator: {device: cpu}\n"
        "channels:\n  prompts: {external: true}\n  rollouts: {external: true}\n"
    )
    return load_spec(path)


async def test_a_prompt_longer_than_the_context_is_dead_lettered_on_its_first_delivery(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    # a JSONL row whose prompt does not fit the model's context was nak'ed and retried max_deliver times on every
    # draw (a warning each time), then dead-lettered: a permanent refusal taken for a passing failure
    async with _generator(embedded_nats, tmp_path) as (bus, actor):
        for task, prompt in (("long", "1+" * 40 + "1="), ("short", "1+1=")):
            msg = PromptMsg(task_id=task, domain="arithmetic", prompt=prompt, group_size=2)
            await bus.publish("prompts", "prompt", msg.model_dump(mode="json"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(actor.run)
            with anyio.fail_after(30):
                async with bus.consume("rollouts", "check", model=RolloutMsg) as rollouts:
                    async for delivery in rollouts:  # the short prompt is answered...
                        assert delivery.payload.task_id == "short"
                        await delivery.ack()
                        break
                async with bus.consume(DEADLETTER, "check") as dead:
                    async for delivery in dead:  # ...and the long one refused, on its first delivery
                        letter = dict(delivery.payload)
                        await delivery.ack()
                        break
            actor.ctx.stopping.set()
    assert letter["num_delivered"] == 1 and "leaves no room in the model's context of 32" in letter["reason"], letter
    counters = actor.report()
    assert counters.get("prompts_refused.arithmetic") == 1 and not counters.get("errors"), counters


async def test_a_generation_that_outlasts_the_ack_wait_is_kept_alive_and_published_once(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """A prompt whose generation took longer than `bus.ack_wait_s` (a slow or restarting SGLang/vLLM server) was
    redelivered while it was still being generated — and its redelivery to the same replica crashed the generator
    (a second handler of one message asked the batch limiter for tokens the first still held). The ack timer of a
    prompt in flight is now kept reset, and a redelivery that comes anyway is settled by the generation under way."""
    async with _generator(embedded_nats, tmp_path, ack_wait_s=1.0) as (bus, actor):
        msg = PromptMsg(task_id="slow", domain="arithmetic", prompt="1+1=", group_size=2)
        await bus.publish("prompts", "prompt", msg.model_dump(mode="json"))
        rollouts: list[str] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(actor.run)
            with anyio.fail_after(30):
                async with bus.consume("rollouts", "check", model=RolloutMsg) as stream:
                    async for delivery in stream:
                        rollouts.append(delivery.payload.task_id)
                        await delivery.ack()
                        break
            await anyio.sleep(2.5)  # a redelivery would be generated and published again by now
            async with bus.consume("rollouts", "check", model=RolloutMsg) as stream:
                with anyio.move_on_after(1.0):
                    async for delivery in stream:
                        rollouts.append(delivery.payload.task_id)
                        await delivery.ack()
            actor.ctx.stopping.set()
    assert rollouts == ["slow"]
    counters = actor.report()
    assert not counters.get("errors") and not counters.get("redelivered_while_generating"), counters


async def test_a_prompt_of_a_domain_removed_from_the_spec_is_dropped_ungenerated(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """A run resumed without a domain still has its prompts on the bus: each was generated, then dropped downstream.
    Now the generator acks it unanswered, counts it by domain, and goes on with the domains the spec has."""
    async with _generator(embedded_nats, tmp_path) as (bus, actor):
        for task, domain in (("gone", "extract"), ("kept", "arithmetic")):
            msg = PromptMsg(task_id=task, domain=domain, prompt="1+1=", group_size=2)
            await bus.publish("prompts", "prompt", msg.model_dump(mode="json"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(actor.run)
            assert (await _first_rollout(bus)).task_id == "kept"
            with anyio.fail_after(10):  # the kept prompt's handler ends just after its rollout is out; the dropped
                for _ in iter(int, 1):  # one was never kept alive as if it were being generated
                    if len(actor._generating) == 0:
                        break
                    await anyio.sleep(0.02)
            actor.ctx.stopping.set()
    counters = actor.report()
    assert counters.get("removed_domain.extract") == 1 and counters.get("prompts") == 1, counters


async def test_a_rollout_the_bus_refuses_for_want_of_storage_is_sent_again_not_its_prompt_given_back(
    tmp_path: Path,
) -> None:
    """At the bus's storage budget (a full disk alike) JetStream refuses the rollout's publish: the generator gave its
    prompt back, and the consumer dead-lettered a healthy prompt on its fifth delivery, as poison. It keeps the prompt
    and sends the same rollout again until the bus takes it."""
    import nats.js.errors

    async with (
        EmbeddedNats(tmp_path / "nats", max_file_store=512 * 1024) as server,
        _generator(server, tmp_path) as (bus, actor),
    ):
        js = bus.nc.jetstream()
        msg = PromptMsg(task_id="t1", domain="arithmetic", prompt="1+1=", group_size=2)
        await bus.publish("prompts", "prompt", msg.model_dump(mode="json"))
        await js.add_stream(name="FILLER", subjects=["filler.>"])
        with pytest.raises(nats.js.errors.APIError):  # the budget, filled by another stream
            for i in range(1000):
                await js.publish(f"filler.{i}", b"x" * 8192)
        async with anyio.create_task_group() as tg:
            tg.start_soon(actor.run)
            await wait_until(lambda: actor.ctx.counters.get("rollout_send_waits") >= 3, timeout_s=30)
            assert bus.stats.naked == 0 and actor.ctx.counters.get("errors") == 0  # nothing given back
            await js.delete_stream("FILLER")  # room again
            assert (await _first_rollout(bus)).task_id == "t1"
            actor.ctx.stopping.set()
    assert bus.stats.naked == 0
