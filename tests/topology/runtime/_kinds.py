"""Test-only actor kinds for the runtime tests: small but real actors on a real bus.

- ``ticker`` publishes ``{"n": i}`` to its first ``publishes`` channel every ``interval_s``; each message id whose
  publish was acknowledged goes to ``<state_dir>/published.txt`` (ids are unique across restarts and resumes).
- ``tally`` consumes its first ``consumes`` channel as one group, acks and counts; each message id goes to
  ``<state_dir>/consumed.txt`` before it is acked (at-least-once: a redelivered id may appear twice).
- ``crasher`` raises after ``crash_after_s`` — every time (leaving a thread behind that sleeps ``leave_thread_s``).
- ``finisher`` returns from ``run()`` at once: its work is done.
Every kind appends its lifecycle steps to ``<state_dir>/lifecycle.txt`` so tests can check the order.
Processes of a run find these kinds through ``FLYWHEEL_PLUGINS=tests.topology.runtime._kinds``.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import anyio
from pydantic import BaseModel, ConfigDict

from topology import ActorKind, register_actor_kind
from topology.runtime import Actor

MODULE = "tests.topology.runtime._kinds"


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TickerConfig(_Config):
    interval_s: float = 0.05


class TallyConfig(_Config):
    pass


class CrasherConfig(_Config):
    crash_after_s: float = 0.2
    leave_thread_s: float = 0.0  # > 0: leave a (non-daemon) thread sleeping this long behind, as a cancelled
    # `anyio.to_thread` call does


class _Recording(Actor[_Config]):
    def note(self, step: str) -> None:
        with open(self.ctx.state_dir / "lifecycle.txt", "a") as f:
            f.write(f"{step} {os.getpid()}\n")

    async def start(self) -> None:
        self.note("start")

    async def drain(self) -> None:
        self.note("drain")

    async def stop(self) -> None:
        self.note("stop")


class Ticker(_Recording):
    async def run(self) -> None:
        self.note("run")
        config = self.config
        assert isinstance(config, TickerConfig)
        channel = self.ctx.spec.actors[self.ctx.actor].publishes[0]
        life = uuid.uuid4().hex[:8]  # one per process: ids never repeat across restarts or resumes
        n = 0
        with open(self.ctx.state_dir / "published.txt", "a") as ledger:
            while not self.ctx.stopping.is_set():
                mid = f"{self.ctx.actor}-{self.ctx.replica}-{self.ctx.restarts}-{life}-{n}"
                await self.ctx.bus.publish(channel, "tick", {"n": n}, id=mid)
                ledger.write(mid + "\n")
                ledger.flush()
                self.ctx.counters.inc("published")
                n += 1
                with anyio.move_on_after(config.interval_s):
                    await self.ctx.stopping.wait()


class Tally(_Recording):
    async def run(self) -> None:
        self.note("run")
        channel = self.ctx.spec.actors[self.ctx.actor].consumes[0]
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                with open(self.ctx.state_dir / "consumed.txt", "a") as ledger:
                    async for delivery in self.ctx.bus.consume(channel, self.ctx.actor, batch=8):
                        ledger.write(delivery.id + "\n")
                        ledger.flush()
                        self.ctx.counters.inc("consumed")
                        await delivery.ack()

            tg.start_soon(consume)
            await self.ctx.stopping.wait()
            tg.cancel_scope.cancel()


class Crasher(_Recording):
    async def run(self) -> None:
        self.note("run")
        config = self.config
        assert isinstance(config, CrasherConfig)
        await anyio.sleep(config.crash_after_s)
        if config.leave_thread_s > 0:
            threading.Thread(target=time.sleep, args=(config.leave_thread_s,), daemon=False).start()
        raise RuntimeError("deliberate crash (test kind 'crasher')")


class Finisher(_Recording):
    async def run(self) -> None:
        self.note("run")


register_actor_kind(
    ActorKind(
        "ticker",
        TickerConfig,
        f"{MODULE}:Ticker",
        publishes=("ticks",),
        summary="test: publishes a tick every interval_s",
    )
)
register_actor_kind(
    ActorKind("tally", TallyConfig, f"{MODULE}:Tally", consumes=("ticks",), summary="test: consumes and counts")
)
register_actor_kind(ActorKind("crasher", CrasherConfig, f"{MODULE}:Crasher", summary="test: always crashes"))
register_actor_kind(ActorKind("finisher", _Config, f"{MODULE}:Finisher", summary="test: returns at once"))
