"""Test-only kinds for the ``distributed`` weight transport: a sender (the learner's side) and receivers.

- ``wsender`` (config ``weight_transport: distributed``) publishes version 1, 2, … every ``interval_s`` through
  :class:`~actors.weights.WeightPublisher`; every tensor of version v is filled with ``v / 100``.
- ``wreceiver`` (config ``weight_sync: distributed``) serves a real :class:`TorchEngine` and swaps each version
  in with :class:`~actors.weights.WeightSubscriber`; after each swap it checks every parameter holds ``v / 100``
  and counts ``verified`` (or ``mismatched``); counter ``version`` is the engine's version.
Found by processes of a run through ``FLYWHEEL_PLUGINS=tests.topology.runtime._weight_kinds``.
Torch is imported when a replica starts, never by this module's import (the spec layer loads it).
"""

from __future__ import annotations

from typing import Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict

from actors.protocol import policy_of
from topology import ActorKind, register_actor_kind
from topology.runtime import Actor

MODULE = "tests.topology.runtime._weight_kinds"


class SenderConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    weight_transport: Literal["distributed"] = "distributed"
    interval_s: float = 1.0


class ReceiverConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    weight_sync: Literal["distributed"] = "distributed"


class Sender(Actor[SenderConfig]):
    async def run(self) -> None:
        import torch

        from actors.policy import Policy
        from actors.weights import DistributedTransport, WeightPublisher

        torch.set_num_threads(1)
        template = Policy.from_spec(policy_of(self.ctx.spec)).state_dict()
        transport = DistributedTransport.for_context(self.ctx)
        publisher = WeightPublisher(self.ctx.bus, self.ctx.topology, transport)
        current = await publisher.current()
        version = current.version if current is not None else 0
        while not self.ctx.stopping.is_set():
            version += 1
            state = {name: torch.full_like(t, version / 100) for name, t in template.items()}
            await publisher.publish(version, state)
            self.ctx.counters.set("version", version)
            self.ctx.counters.set("broadcast_failures", transport.failures)
            with anyio.move_on_after(self.config.interval_s):
                await self.ctx.stopping.wait()


class Receiver(Actor[ReceiverConfig]):
    engine: Any = None

    async def start(self) -> None:
        from actors.engines import TorchEngine
        from actors.policy import Policy

        self.engine = TorchEngine(Policy.from_spec(policy_of(self.ctx.spec)), num_threads=1)

    async def run(self) -> None:
        from actors.weights import DistributedTransport, WeightSubscriber

        def on_event(event: str, fields: dict[str, Any]) -> None:
            self.ctx.counters.inc(event)
            if event == "weights.swapped":
                self.check(int(fields["version"]))

        subscriber = WeightSubscriber(
            self.ctx.bus,
            self.ctx.topology,
            self.engine,
            {"distributed": DistributedTransport.for_context(self.ctx)},
            log=self.ctx.log,
            on_event=on_event,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(subscriber.run)
            await self.ctx.stopping.wait()
            tg.cancel_scope.cancel()

    def check(self, version: int) -> None:
        want = version / 100
        state = self.engine.policy.state_dict()
        same = all(bool((t.float() - want).abs().max() < 1e-6) for t in state.values())
        self.ctx.counters.inc("verified" if same else "mismatched")
        self.ctx.counters.set("version", self.engine.version)

    async def stop(self) -> None:
        if self.engine is not None:
            await self.engine.close()


register_actor_kind(
    ActorKind(
        "wsender",
        SenderConfig,
        f"{MODULE}:Sender",
        summary="test: publishes constant-filled weights over the distributed transport",
    )
)
register_actor_kind(
    ActorKind(
        "wreceiver",
        ReceiverConfig,
        f"{MODULE}:Receiver",
        summary="test: swaps distributed weights into a TorchEngine and checks them",
    )
)
