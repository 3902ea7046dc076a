"""Entry point of one replica process: ``python -m topology.runtime._child --spec … --actor … --replica …``.

Contract: loads the spec, imports the actor kind's factory, sizes torch's thread pool from the actor's
``resources.num_cpus`` (only if the kind's module imported torch — this module never does), connects to
the bus, and runs the replica's lifecycle with heartbeats. SIGTERM/SIGINT set ``ctx.stopping`` (the actor
drains); a second one is logged and ignored — the supervisor SIGKILLs after its grace period. Exit status:
0 after a clean stop, 1 after a crash, 2 when the replica could not even be set up (bad spec, unknown actor). The
process exits at most ``EXIT_GRACE_S`` after the lifecycle ended, even if threads the actor left behind still run
(the supervisor restarts a crashed replica only once its process is gone).
Logs go to stderr (the supervisor appends them to ``<run_dir>/logs/<actor>-<replica>.log``).

Non-goals: this is not a user-facing command; ``flywheel up`` builds its arguments.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import structlog

from topology._registry import PluginError, load_plugins
from topology.runtime._actor import ActorContext
from topology.runtime._gc import HeapFreezer
from topology.runtime._lifecycle import Replica
from topology.runtime._session import connect_bus
from topology.runtime._threads import size_torch

EXIT_GRACE_S = 10.0  # after the lifecycle ended, how long the process may wait for leftover threads before it exits


def configure_logging() -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback),
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m topology.runtime._child")
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--actor", required=True)
    parser.add_argument("--replica", required=True, type=int)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--bus-url", required=True)
    parser.add_argument("--restarts", type=int, default=0)
    parser.add_argument("--supervisor-pid", type=int, default=None)
    return parser.parse_args(argv)


async def run_replica(
    spec: Any,
    factory: type[Any],
    actor: str,
    replica: int,
    *,
    run_dir: Path,
    bus_url: str,
    restarts: int = 0,
    handle_signals: bool = True,
    on_context: Callable[[ActorContext], None] | None = None,
    freeze_heap: bool = False,
) -> int:
    """Connect to the bus and run one replica's lifecycle with heartbeats; 0 after a clean stop, 1 after a crash.

    Shared by this process entry and the Ray runtime's actor (``topology.runtime._ray``), so a replica behaves
    the same under every runtime. ``handle_signals`` turns SIGTERM/SIGINT into ``ctx.stopping`` (main thread
    only); ``on_context`` receives the context as soon as it exists (the Ray actor keeps it to request a stop).
    ``freeze_heap`` (for a process that runs this one replica) keeps the garbage collector's full collections short
    (:mod:`topology.runtime._gc`).
    """
    actor_spec = spec.actors[actor]
    bus = await connect_bus(spec, bus_url, client_name=f"{spec.name}-{actor}-{replica}", run_dir=run_dir)
    freezer = HeapFreezer() if freeze_heap else None
    try:
        ctx = ActorContext(
            topology=spec.name,
            actor=actor,
            replica=replica,
            kind=actor_spec.kind,
            spec=spec,
            bus=bus,
            run_dir=run_dir,
            restarts=restarts,
        )
        if on_context is not None:
            on_context(ctx)
        runner = Replica(ctx, factory, actor_spec.config, heartbeat_s=spec.runtime.heartbeat_s)
        async with anyio.create_task_group() as tg:

            async def on_signals() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        ctx.log.info("signal received", signal=signal.Signals(signum).name)
                        ctx.stopping.set()

            if handle_signals:
                tg.start_soon(on_signals)
            if freezer is not None:
                freezer.install()

                def report(counters: dict[str, int]) -> None:
                    for name, value in counters.items():
                        ctx.counters.set(name, value)

                tg.start_soon(freezer.watch, report)
            ok = await runner.run()
            tg.cancel_scope.cancel()
    finally:
        if freezer is not None:
            freezer.uninstall()  # a Ray actor runs a restarted replica in the same process: one hook at a time
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await bus.close()
    return 0 if ok else 1


async def _amain(args: argparse.Namespace, spec: Any, factory: type[Any]) -> int:
    return await run_replica(
        spec,
        factory,
        args.actor,
        args.replica,
        run_dir=args.run_dir,
        bus_url=args.bus_url,
        restarts=args.restarts,
        freeze_heap=True,
    )


def _exit_before_start(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    # Stopped before the actor even started (still importing): nothing to drain, so a clean exit.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_before_start)
    args = _parse(argv)
    configure_logging()
    log = structlog.get_logger("flywheel.child").bind(actor=args.actor, replica=args.replica)
    if args.supervisor_pid is not None and os.getppid() != args.supervisor_pid:
        log.error("supervisor is gone before this replica started; exiting")
        return 2
    from topology import load_spec
    from topology._errors import SpecError
    from topology._registry import actor_kinds, resolve_factory

    try:
        load_plugins()
        spec = load_spec(args.spec, thorough=False)  # checked in full by `flywheel up` before it started us
    except PluginError as exc:
        log.error(str(exc))
        return 2
    except SpecError as exc:
        log.error("spec no longer valid", spec=str(args.spec), errors=str(exc))
        return 2
    if args.actor not in spec.actors:
        log.error("no such actor in spec", spec=str(args.spec))
        return 2
    actor_spec = spec.actors[args.actor]
    factory = resolve_factory(actor_kinds()[actor_spec.kind])
    threads = size_torch(actor_spec.resources.num_cpus)
    log.info("replica process up", pid=os.getpid(), torch_threads=threads, restarts=args.restarts)
    code = anyio.run(_amain, args, spec, factory, backend="asyncio")
    _exit_within(code, EXIT_GRACE_S, log)
    return code


def _exit_within(code: int, grace_s: float, log: Any) -> None:
    """Exit with ``code`` within ``grace_s`` even if threads the actor left behind still run: the interpreter joins
    every non-daemon thread before it exits, and a worker thread the lifecycle abandoned (an ``anyio.to_thread`` call
    cancelled mid-way, waiting on a slow verifier, say) held a crashed replica's process for many minutes — and the
    supervisor restarts a replica only once its process is gone. A daemon thread is not joined, so it can cut that
    wait short; ``os._exit`` skips ``atexit`` handlers, which is why it comes only after the grace."""

    def force() -> None:
        time.sleep(grace_s)
        log.warning("threads still running after the replica ended; exiting without them", grace_s=grace_s, code=code)
        sys.stderr.flush()
        os._exit(code)

    threading.Thread(target=force, name="flywheel-exit", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
