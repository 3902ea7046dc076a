"""RayRuntime (``runtime: {kind: ray}`` or ``flywheel up --runtime ray``): each replica is a Ray actor.

Contract:
- The driver (the machine running ``flywheel up``, usually the Ray head) opens the same session as
  :class:`LocalRuntime`: run dir, ``run.json``, the embedded ``nats-server`` or the spec's ``bus.url``, every
  channel. It then joins the Ray cluster at ``runtime.address`` / ``--address`` (``auto``, ``ray://…``), or
  uses the Ray instance this process already initialized, or starts a local one — and shuts down only what
  it started. A local instance it starts runs its workers at the driver's priority (``worker_niceness: 0``): Ray's
  default of nice 15 lets any other busy process on the machine starve every actor.
  A cluster joined keeps its own setting (start its nodes with ``RAY_worker_niceness=0`` on shared machines).
- Each replica is one Ray actor (:class:`ReplicaHost`) asking for its actor's ``resources`` (``num_cpus``,
  ``num_gpus``, ``memory_mb``, ``custom``). Inside it runs the very lifecycle code of a local child process
  (:func:`topology.runtime._child.run_replica`): same bus, heartbeats, ``ctx.stopping``, actor code.
  Its stdout/stderr go to ``<run_dir>/logs/<actor>-<replica>.log`` on the node it runs on.
- Placement: ``runtime.colocate`` groups → one STRICT_PACK placement group each; the other replicas → one
  SPREAD / PACK placement group with ``runtime.placement``, or Ray's default scheduling when it is null.
  A replica no node can hold, or placement groups not reserved within ``placement_timeout_s``, stop the run
  with a message saying what was asked and what the cluster has.
- Supervision: Ray restarts a dead actor process (``max_restarts`` = ``runtime.restart.max_restarts``, on
  another node if its node is gone); the driver sees the replica's ``run`` call fail, records ``restarting``
  in the status KV, waits the restart policy's backoff and calls ``run`` again — on the fresh process. A
  replica whose actor raised (exit status 1) gets a fresh process too (``ray.kill`` with restart). After
  ``max_restarts`` crashes within ``window_s`` the topology stops with the same message as the local
  runtime. When Ray's own restart budget (which never resets) is spent, the driver creates a new actor.
- Stopping: every replica is asked to stop (it drains), the driver waits up to ``drain_timeout_s``, then kills
  every actor and removes the placement groups.

Non-goals and limits: the embedded bus listens on the driver's loopback only, so a cluster with more than one
node needs ``bus.url`` (the run refuses otherwise, in one sentence). Bus credentials are never shipped through
Ray: ``token_env`` / ``creds_file`` must be set on every node; the embedded bus's token is read from the run dir's
0600 token file by each replica (one node, one user). ``run_dir`` (logs, checkpoints in
``state/``) should be on a filesystem every node shares, or a restarted learner may not find its checkpoint.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Unpack

import anyio
import anyio.to_thread
import structlog

from topology.runtime._actor import ActorContext
from topology.runtime._runtime import RunResult, RuntimeBase, RuntimeOptions, life_banner, replica_log
from topology.runtime._session import Session, open_session
from topology.runtime._status import ReplicaStatus, read_status
from topology.runtime._threads import thread_env

if TYPE_CHECKING:
    from topology._spec import ResourcesSpec, Spec

__all__ = ["RayRuntime", "RayUnavailable", "ReplicaHost", "bundle_for", "forwarded_env"]

_log = structlog.get_logger("flywheel.runtime")
LOCAL_RAY_SYSTEM_CONFIG = MappingProxyType({"worker_niceness": 0})  # Ray starts workers at nice 15 unless told so
_MIN_CPU = 0.01  # a placement-group bundle may not be empty: a replica asking for nothing reserves this much
_UNAVAILABLE_FAST_S = 2.0  # a call that fails this fast right after a counted death hit a restarting actor
_UNAVAILABLE_RETRY_S = 0.5  # then it is retried this often...
_UNAVAILABLE_GRACE_S = 60.0  # ...for at most this long before it counts as another crash
_FORWARDED = ("FLYWHEEL_PLUGINS", "PYTHONPATH")  # what replicas need to import the same kinds


class RayUnavailable(RuntimeError):
    """Ray is not installed, or the cluster cannot be reached."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable("runtime kind 'ray' needs Ray: pip install 'flywheel[ray]'") from None
    return ray


def forwarded_env(num_cpus: float) -> dict[str, str]:
    """Environment of a replica's Ray worker: thread counts from ``num_cpus`` plus the kinds to import."""
    env = {name: os.environ[name] for name in _FORWARDED if os.environ.get(name)}
    return {**env, **thread_env(num_cpus), "PYTHONUNBUFFERED": "1"}


def bundle_for(resources: ResourcesSpec, *, in_group: bool) -> dict[str, float]:
    """The Ray resources of one replica (``CPU``, ``GPU``, ``memory`` in bytes, custom ones)."""
    bundle: dict[str, float] = {"CPU": float(resources.num_cpus)}
    if resources.num_gpus:
        bundle["GPU"] = float(resources.num_gpus)
    if resources.memory_mb:
        bundle["memory"] = float(resources.memory_mb * 1024 * 1024)
    bundle.update({name: float(amount) for name, amount in resources.custom.items()})
    if in_group and not any(amount > 0 for amount in bundle.values()):
        bundle["CPU"] = _MIN_CPU
    return {name: amount for name, amount in bundle.items() if amount > 0 or name == "CPU"}


class ReplicaHost:
    """The Ray actor class body (wrapped with ``ray.remote`` by the runtime): hosts one replica's lifecycle.

    ``run(restarts)`` returns 0 after a clean stop and 1 after a crash, exactly like a local child's exit
    status; ``request_stop()`` is the SIGTERM of this runtime. Async methods: both run on the actor's loop.
    """

    def __init__(self, spec: Spec, actor: str, replica: int, run_dir: str, bus_url: str) -> None:
        self.spec = spec
        self.actor = actor
        self.replica = replica
        self.run_dir = Path(run_dir)
        self.bus_url = bus_url
        self._ctx: ActorContext | None = None
        self._stop_requested = False

    async def run(self, restarts: int) -> int:
        from topology._registry import actor_kinds, load_plugins, resolve_factory
        from topology.runtime._child import configure_logging, run_replica
        from topology.runtime._threads import size_torch

        self._redirect_output(restarts)
        configure_logging()
        load_plugins()
        actor_spec = self.spec.actors[self.actor]
        factory = resolve_factory(actor_kinds()[actor_spec.kind])
        threads = size_torch(actor_spec.resources.num_cpus)
        log = structlog.get_logger("flywheel.ray").bind(actor=self.actor, replica=self.replica)
        log.info("replica up in a Ray actor", pid=os.getpid(), torch_threads=threads, restarts=restarts)
        self._ctx = None
        return await run_replica(
            self.spec,
            factory,
            self.actor,
            self.replica,
            run_dir=self.run_dir,
            bus_url=self.bus_url,
            restarts=restarts,
            handle_signals=False,
            on_context=self._keep,
            freeze_heap=True,
        )

    def _keep(self, ctx: ActorContext) -> None:
        self._ctx = ctx
        if self._stop_requested:
            ctx.stopping.set()

    async def request_stop(self) -> None:
        self._stop_requested = True
        if self._ctx is not None:
            self._ctx.stopping.set()

    async def pid(self) -> int:
        return os.getpid()

    def _redirect_output(self, restarts: int) -> None:
        log = replica_log(self.run_dir, self.actor, self.replica)
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError:  # a node without the run dir: Ray's own worker logs keep the output
            return
        os.write(fd, life_banner(self.actor, self.replica, restarts, f"Ray actor, pid {os.getpid()}").encode())
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


def ray_init_options(address: str | None, ray_init: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """``ray.init``'s options: a local instance started here gets ``LOCAL_RAY_SYSTEM_CONFIG`` under the caller's own
    ``_system_config``; joining a cluster (an address, or ``RAY_ADDRESS``) passes none (Ray refuses one there)."""
    options: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
    if address is None:
        options.update(include_dashboard=False)
    options.update(ray_init)
    if address is None and not env.get("RAY_ADDRESS"):
        options["_system_config"] = {**LOCAL_RAY_SYSTEM_CONFIG, **dict(ray_init.get("_system_config") or {})}
    return options


class RayRuntime(RuntimeBase):
    """Runs each replica as a Ray actor, supervised by the driver. See the module docstring.

    Constructed like :class:`LocalRuntime`; ``address`` overrides ``runtime.address``; ``ray_init`` is passed
    to ``ray.init`` when this runtime starts Ray itself (e.g. ``{"num_cpus": 2}`` in tests and benchmarks).
    """

    def __init__(
        self,
        spec: Spec,
        *,
        address: str | None = None,
        ray_init: Mapping[str, Any] | None = None,
        **options: Unpack[RuntimeOptions],
    ) -> None:
        super().__init__(spec, **options)
        self.address = address if address is not None else spec.runtime.address
        self.ray_init = dict(ray_init or {})
        self.handles: dict[tuple[str, int], Any] = {}
        self._groups: list[Any] = []
        self._placement: dict[tuple[str, int], tuple[Any, int]] = {}  # key → (placement group, bundle index)
        self._remote_cls: Any = None
        self._active: set[tuple[str, int]] = set()

    # ------------------------------------------------------------------ run
    async def run(self, *, duration_s: float | None = None) -> RunResult:
        ray = _ray()
        started_ray = not ray.is_initialized()
        if started_ray:
            await anyio.to_thread.run_sync(self._init_ray, ray)
        try:
            async with open_session(self.spec, run_root=self.run_root, resume=self.resume) as session:
                self.session = session
                _log.info(
                    "topology up (ray)",
                    topology=self.spec.name,
                    run_dir=str(session.run_dir),
                    bus=session.bus_url,
                    ray=ray.get_runtime_context().gcs_address,
                )
                try:
                    async with anyio.create_task_group() as tg:
                        self.start_watchers(tg, session, duration_s)
                        problem = self._check_cluster(ray) or await self._place(ray)
                        if problem:
                            self.fail(problem)
                        else:
                            for key in self.replica_keys():
                                self._active.add(key)
                                tg.start_soon(self._supervise, session, key)
                        self.started.set()
                        await self.wait_stop()
                        await self._shutdown(ray)
                        tg.cancel_scope.cancel()
                finally:
                    self._kill_all(ray)
                return self.result(session)
        finally:
            if started_ray:
                await anyio.to_thread.run_sync(ray.shutdown)

    def _init_ray(self, ray: Any) -> None:
        options = ray_init_options(self.address, self.ray_init, os.environ)
        try:
            ray.init(address=self.address, **options)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = self.address or "a new local instance"
            raise RayUnavailable(f"cannot start or join Ray at {where}: {exc}") from None

    def _check_cluster(self, ray: Any) -> str:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if self.spec.bus.embedded and len(nodes) > 1:
            return (
                f"the Ray cluster has {len(nodes)} nodes but bus.embedded listens on this machine's loopback "
                "only; set bus.url: nats://<host>:4222 to a NATS server every node can reach"
            )
        for name, actor in self.spec.actors.items():
            want = bundle_for(actor.resources, in_group=False)
            if not any(all(n["Resources"].get(r, 0.0) >= a for r, a in want.items()) for n in nodes):
                have = "; ".join(_fmt_resources(n["Resources"]) for n in nodes) or "no live node"
                return (
                    f"actor '{name}' asks for {_fmt_resources(want)} per replica, which no node of the Ray "
                    f"cluster has (nodes: {have})"
                )
        if self.spec.runtime.placement is None:  # no reservation up front: a replica with no room would wait for ever
            wants = [
                bundle_for(actor.resources, in_group=False)
                for actor in self.spec.actors.values()
                for _ in range(actor.replicas)
            ]
            total, cluster = _sum(wants), ray.cluster_resources()
            short = {r: a for r, a in total.items() if a > cluster.get(r, 0.0) + 1e-9}
            if short:
                return (
                    f"the actors ask for {_fmt_resources(short)} in all (each replica's resources × replicas), the "
                    f"Ray cluster has {_fmt_resources({r: cluster.get(r, 0.0) for r in short})}: the replicas "
                    "beyond that would wait for room for ever; lower resources.num_cpus or replicas, add nodes, or "
                    "(a cluster that scales up) set runtime.placement so that Ray reserves them all first, within "
                    "runtime.placement_timeout_s"
                )
        return ""

    async def _place(self, ray: Any) -> str:
        """Create and wait for the placement groups; '' when every group is reserved, else why not."""
        from ray.util.placement_group import placement_group

        runtime = self.spec.runtime
        grouped = {name for group in runtime.colocate for name in group}
        plans: list[tuple[str, str, list[str]]] = [
            ("STRICT_PACK", f"colocate {list(g)}", list(g)) for g in runtime.colocate
        ]
        if runtime.placement is not None:
            rest = [name for name in self.spec.actors if name not in grouped]
            if rest:
                plans.append((runtime.placement.upper(), f"placement: {runtime.placement}", rest))
        for strategy, what, names in plans:
            keys = [(name, i) for name in names for i in range(self.spec.actors[name].replicas)]
            bundles = [bundle_for(self.spec.actors[name].resources, in_group=True) for name, _ in keys]
            group = placement_group(bundles, strategy=strategy, name=f"{self.spec.name}-{len(self._groups)}")
            self._groups.append(group)
            with anyio.move_on_after(runtime.placement_timeout_s) as waiting:
                await group.ready()
            if waiting.cancelled_caught:
                total = _fmt_resources(_sum(bundles))
                return (
                    f"{what}: Ray could not reserve {len(bundles)} bundles ({total} in all, strategy "
                    f"{strategy}) within {runtime.placement_timeout_s:g}s; the cluster has "
                    f"{_fmt_resources(ray.cluster_resources())}"
                )
            for index, key in enumerate(keys):
                self._placement[key] = (group, index)
        return ""

    # ------------------------------------------------------------------ replicas
    def _create(self, ray: Any, key: tuple[str, int]) -> Any:
        actor, replica = key
        if self._remote_cls is None:
            self._remote_cls = ray.remote(ReplicaHost)
        resources = self.spec.actors[actor].resources
        placed = self._placement.get(key)
        bundle = bundle_for(resources, in_group=placed is not None)
        options: dict[str, Any] = {
            "num_cpus": bundle.pop("CPU"),
            "num_gpus": bundle.pop("GPU", 0.0),
            "max_restarts": self.spec.runtime.restart.max_restarts,
            "max_task_retries": 0,  # a dead replica's run() fails, so the driver sees (and records) the crash
            "runtime_env": {"env_vars": forwarded_env(resources.num_cpus)},
            "name": f"{self.spec.name}.{actor}.{replica}.{time.monotonic_ns()}",
        }
        if "memory" in bundle:
            options["memory"] = bundle.pop("memory")
        if bundle:
            options["resources"] = bundle
        if placed is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            group, index = placed
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=index
            )
        assert self.session is not None
        handle = self._remote_cls.options(**options).remote(
            self.spec, actor, replica, str(self.session.run_dir), self.session.bus_url
        )
        self.handles[key] = handle
        return handle

    async def _supervise(self, session: Session, key: tuple[str, int]) -> None:
        ray = _ray()
        from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

        actor, replica = key
        handle = self._create(ray, key)
        restarts, process_deaths = 0, 0
        awaiting_restart = False  # a crash was counted: Ray may still be bringing the actor back
        unavailable_since: float | None = None
        try:
            while not self.stopping:
                started = time.time()
                try:
                    code = await handle.run.remote(restarts)
                    how = "crashed (see its log)"
                except ActorUnavailableError as exc:
                    # Right after a counted death, calls fail fast while Ray restarts the process: that is the same
                    # crash, not a new one — retry until the actor is back (a crash only if that takes too long).
                    now = time.monotonic()
                    if awaiting_restart and time.time() - started < _UNAVAILABLE_FAST_S:
                        unavailable_since = now if unavailable_since is None else unavailable_since
                        if now - unavailable_since < _UNAVAILABLE_GRACE_S:
                            await anyio.sleep(_UNAVAILABLE_RETRY_S)
                            continue
                    code, how = None, f"its Ray actor died or stayed unavailable ({_first_line(exc)})"
                except RayActorError as exc:
                    code, how = None, f"its Ray actor died ({_first_line(exc)})"
                except RayTaskError as exc:  # run() itself failed before the lifecycle could report it
                    code, how = 1, f"raised {_first_line(exc)}"
                unavailable_since = None
                if self.stopping:
                    return
                if code == 0:
                    _log.info("replica finished", actor=actor, replica=replica)
                    self.replica_finished(key)
                    return
                if code is not None:  # the actor raised: give it a fresh process, as the local runtime does
                    ray.kill(handle, no_restart=False)
                process_deaths += 1
                awaiting_restart = True
                last = await self._last_status(session, key)
                if code is not None and last is not None and last.error:
                    how = f"crashed: {last.error}"
                pid = last.pid if last is not None else 0
                log = replica_log(session.run_dir, actor, replica)
                if not await self.after_crash(
                    session, key, pid=pid, restarts=restarts, started_at=started, how=how, log=log
                ):
                    return
                restarts += 1
                if process_deaths > self.spec.runtime.restart.max_restarts:  # Ray gave up on this actor for good
                    ray.kill(handle, no_restart=True)
                    handle = self._create(ray, key)
                    process_deaths = 0
        finally:
            self._active.discard(key)

    async def _last_status(self, session: Session, key: tuple[str, int]) -> ReplicaStatus | None:
        try:
            found = await read_status(session.bus, self.spec.name, [key])
        except Exception:
            return None
        return found[0] if found else None

    # ------------------------------------------------------------------ stop
    async def _shutdown(self, ray: Any) -> None:
        for handle in self.handles.values():
            try:
                handle.request_stop.remote()
            except Exception as exc:  # an actor Ray already gave up on
                _log.debug("stop request not sent", error=str(exc))
        with anyio.move_on_after(self.drain_timeout_s):
            while self._active and not self._hurry.is_set():  # noqa: ASYNC110 — two conditions to watch
                await anyio.sleep(0.05)
        if self._active:
            late = [f"{a}[{r}]" for a, r in sorted(self._active)]
            self.killed_at_stop(late)

    def _kill_all(self, ray: Any) -> None:
        from ray.util.placement_group import remove_placement_group

        for handle in self.handles.values():
            try:
                ray.kill(handle, no_restart=True)
            except Exception as exc:
                _log.debug("kill failed", error=str(exc))
        for group in self._groups:
            try:
                remove_placement_group(group)
            except Exception as exc:
                _log.debug("placement group not removed", error=str(exc))
        self.handles.clear()
        self._groups.clear()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _sum(bundles: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            total[name] = total.get(name, 0.0) + amount
    return total


def _fmt_resources(resources: Mapping[str, float]) -> str:
    shown = []
    for name, amount in sorted(resources.items()):
        if name.startswith("node:") or name == "object_store_memory" or name.startswith("bundle_group"):
            continue
        if name == "memory":
            shown.append(f"memory={amount / 2**30:.1f}GiB")
        else:
            shown.append(f"{name}={amount:g}")
    return "{" + ", ".join(shown) + "}"
