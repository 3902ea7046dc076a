"""SingleProcessRuntime (``flywheel up --single-process``): every replica as a task of one event loop.

Contract: the same session (run dir, bus, channels, run.json), the same lifecycle and heartbeats, the same
restart policy and stop rules as :class:`LocalRuntime` — only without process boundaries, so a debugger or
a profiler sees every actor at once. Replicas share the supervisor's bus connection. On stop every replica's
``ctx.stopping`` is set; replicas still running after ``drain_timeout_s`` are cancelled.

Non-goals: isolation. A replica that blocks the event loop (CPU-bound code without awaits) stalls all of them,
and a hard crash (segfault, ``os._exit``) takes the whole topology down.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import structlog

from topology.runtime._actor import ActorContext
from topology.runtime._lifecycle import Replica
from topology.runtime._runtime import RunResult, RuntimeBase
from topology.runtime._session import Session, open_session

_log = structlog.get_logger("flywheel.runtime")


class SingleProcessRuntime(RuntimeBase):
    """All replicas in this process's event loop. See the module docstring."""

    async def run(self, *, duration_s: float | None = None) -> RunResult:
        from topology._registry import actor_kinds, resolve_factory

        kinds = actor_kinds()
        factories = {name: resolve_factory(kinds[a.kind]) for name, a in self.spec.actors.items()}
        self._contexts: dict[tuple[str, int], ActorContext] = {}
        async with open_session(self.spec, run_root=self.run_root, single_process=True, resume=self.resume) as session:
            self.session = session
            _log.info("topology up (single process)", topology=self.spec.name, run_dir=str(session.run_dir))
            async with anyio.create_task_group() as tg:
                self.start_watchers(tg, session, duration_s)
                async with anyio.create_task_group() as replicas:
                    for key in self.replica_keys():
                        replicas.start_soon(self._supervise, session, key, factories[key[0]])
                    self.started.set()
                    await self.wait_stop()
                    for ctx in self._contexts.values():
                        ctx.stopping.set()
                    with anyio.move_on_after(self.drain_timeout_s) as grace:
                        if self._contexts:
                            await self._hurry.wait()
                    if grace.cancel_called:
                        _log.warning("replicas did not drain in time; cancelling them", grace_s=self.drain_timeout_s)
                    replicas.cancel_scope.cancel()
                tg.cancel_scope.cancel()
            return self.result(session)

    async def _supervise(self, session: Session, key: tuple[str, int], factory: type[Any]) -> None:
        actor, replica = key
        actor_spec = self.spec.actors[actor]
        restarts = 0
        while not self.stopping:
            ctx = ActorContext(
                topology=self.spec.name,
                actor=actor,
                replica=replica,
                kind=actor_spec.kind,
                spec=self.spec,
                bus=session.bus,
                run_dir=session.run_dir,
                restarts=restarts,
            )
            self._contexts[key] = ctx
            runner = Replica(ctx, factory, actor_spec.config, heartbeat_s=self.spec.runtime.heartbeat_s)
            ok = await runner.run()
            if self.stopping:
                break
            if ok:
                self.replica_finished(key)
                break
            if not await self.after_crash(
                session,
                key,
                pid=os.getpid(),
                restarts=restarts,
                started_at=runner.started_at,
                how=runner.error,
                log=None,
            ):
                break
            restarts += 1
        self._contexts.pop(key, None)
        if not self._contexts and self.stopping:
            self._hurry.set()  # every replica is done: no need to wait out the grace period
