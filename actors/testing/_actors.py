"""Run one replica of an actor kind inside a test's event loop, as a runtime would start it.

Contract: :func:`actor_context` is the :class:`ActorContext` a runtime hands replica ``replica`` of ``actor`` (its
kind, its spec block, the run dir). :func:`running_actor` builds the actor with its spec's config, awaits
``start()``, runs ``run()`` in a task (unless ``run=False``: then the test drives it) and yields it; leaving the
block sets ``ctx.stopping``, waits for ``run()`` to return, then ``drain()`` and — also after an error — ``stop()``:
the lifecycle of :class:`topology.runtime.LocalRuntime`'s replicas.

Non-goals: no heartbeats, no restarts, no process of its own; the bus connection is the caller's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio

from topology import Spec
from topology.bus import Bus
from topology.runtime import Actor, ActorContext

__all__ = ["actor_context", "running_actor"]

A = TypeVar("A", bound=Actor[Any])


def actor_context(spec: Spec, actor: str, bus: Bus, run_dir: Path, *, replica: int = 0) -> ActorContext:
    """The context a runtime would give replica ``replica`` of ``spec``'s actor ``actor``."""
    kind = spec.actors[actor].kind
    return ActorContext(
        topology=spec.name, actor=actor, replica=replica, kind=kind, spec=spec, bus=bus, run_dir=run_dir
    )


@asynccontextmanager
async def running_actor(
    factory: type[A], spec: Spec, actor: str, bus: Bus, run_dir: Path, *, run: bool = True, replica: int = 0
) -> AsyncIterator[A]:
    """``factory`` (the kind's class) started as replica ``replica`` of ``actor``, its ``run()`` going when ``run``."""
    ctx = actor_context(spec, actor, bus, run_dir, replica=replica)
    instance = factory(ctx, spec.actors[actor].config)
    try:
        await instance.start()
        async with anyio.create_task_group() as tg:
            if run:
                tg.start_soon(instance.run)
            try:
                yield instance
            finally:
                ctx.stopping.set()
        await instance.drain()
    finally:
        await instance.stop()
