"""Drive one replica through ``start → run → drain → stop`` next to its heartbeat task.

Contract: :meth:`Replica.run` constructs the actor, runs its hooks in order inside an anyio task group that
also heartbeats, always calls ``stop()`` (also after a crash in ``start``/``run``/``drain``), puts a final
heartbeat (``stopped`` or ``crashed`` with the error) and returns whether the replica ended cleanly. The same
code runs in a child process (``_child``) and in ``--single-process`` mode, so both behave alike.
The heartbeat's counters are the actor's ``report()`` plus, once its consumers dead-lettered anything, the
framework's ``dead_lettered`` and ``dead_lettered.<channel>`` (what consumers of the actor's group refused).

Non-goals: no restarts here (the supervisor decides), no timeout on ``run()`` ignoring ``stopping`` (the
supervisor kills a child that does not drain in time).
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio

from topology.runtime._actor import Actor, ActorContext, ActorState
from topology.runtime._status import ReplicaStatus, heartbeat_loop, put_status


class Replica:
    """One actor replica's lifecycle and its heartbeat record."""

    def __init__(
        self,
        ctx: ActorContext,
        factory: type[Actor[Any]],
        config: Any,
        *,
        heartbeat_s: float,
        pid: int | None = None,
    ) -> None:
        self.ctx = ctx
        self.factory = factory
        self.config = config
        self.heartbeat_s = heartbeat_s
        self.pid = os.getpid() if pid is None else pid
        self.state = ActorState.STARTING
        self.error: str | None = None
        self.started_at = time.time()
        self.actor: Actor[Any] | None = None

    def status(self) -> ReplicaStatus:
        counters: dict[str, Any] = {}
        if self.actor is not None:
            try:
                counters = self.actor.report()
            except Exception as exc:  # a broken report() must not silence the heartbeat
                counters = {"report_error": f"{type(exc).__name__}: {exc}"}
        # what this actor's consumers sent to the dead-letter channel: malformed input is counted where it was refused
        counters = {**counters, **self.ctx.bus.stats.dead_letter_counters(self.ctx.actor)}
        return ReplicaStatus(
            actor=self.ctx.actor,
            replica=self.ctx.replica,
            kind=self.ctx.kind,
            state=self.state.value,
            pid=self.pid,
            restarts=self.ctx.restarts,
            started_at=self.started_at,
            ts=time.time(),
            counters=counters,
            error=self.error,
        )

    async def run(self) -> bool:
        """Run the lifecycle to the end; True when it ended without an exception."""
        log = self.ctx.log
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                heartbeat_loop, self.ctx.bus, self.ctx.topology, self.status, self.heartbeat_s, self.ctx.beats
            )
            try:
                self.actor = self.factory(self.ctx, self.config)
                log.info("starting")
                await self.actor.start()
                self.state = ActorState.RUNNING
                log.info("running")
                await self.actor.run()
                self.state = ActorState.DRAINING
                log.info("draining", stopping=self.ctx.stopping.is_set())
                await self.actor.drain()
                self.state = ActorState.STOPPING
            except Exception as exc:
                self.state = ActorState.CRASHED
                self.error = f"{type(exc).__name__}: {exc}"
                log.exception("crashed", error=self.error)
            finally:
                with anyio.CancelScope(shield=True):
                    await self._stop_actor()
                tg.cancel_scope.cancel()
        if self.state is not ActorState.CRASHED:
            self.state = ActorState.STOPPED
            log.info("stopped", counters=self.ctx.counters.snapshot())
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                await put_status(self.ctx.bus, self.ctx.topology, self.status())
            except Exception as exc:
                log.warning("final heartbeat failed", error=f"{type(exc).__name__}: {exc}")
        return self.state is ActorState.STOPPED

    async def _stop_actor(self) -> None:
        if self.actor is None:
            return
        try:
            await self.actor.stop()
        except Exception as exc:
            if self.state is not ActorState.CRASHED:
                self.state = ActorState.CRASHED
                self.error = f"{type(exc).__name__} in stop(): {exc}"
            self.ctx.log.error("stop failed", error=f"{type(exc).__name__}: {exc}")
