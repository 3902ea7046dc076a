"""What every runtime sets up before the first actor starts, and tears down after the last one stopped.

Contract: :func:`open_session` creates the run dir — or, with ``resume``, takes an existing one back — and locks it
for this process (one supervisor per run dir). With ``bus.embedded`` it starts ``nats-server`` on the run's
JetStream store (``<run_dir>/nats``), requiring the run's token (``<run_dir>/nats/token``, mode 0600; the same
token and, when it is free, the same port on resume), with the spec's durability settings (``sync_interval_s``,
``max_file_store_mb``, ``max_memory_store_mb``); otherwise it uses ``bus.url``. It connects the supervisor's own
bus client, ensures every channel of the spec exists (with the spec's retention), and writes ``run.json``. A resume
first checks the spec against the one the run last started with (`_evolve`), and what the spec's sections
recorded then against what they see now: a change the run cannot follow is refused before anything starts, the
others are logged once (a change a section warns of, as a warning). On exit
it records ``stopped_at`` and the reason in ``run.json``, closes the client and stops the server.

:meth:`Session.keep_bus_up` is the embedded server's supervisor: when the process dies it is restarted on the same
port with the same store (after the restart policy's backoff, and counted against its budget like a replica's
crash); clients reconnect to the URL they know. :func:`connect_bus` is how a supervisor or a replica connects
(credentials from the environment the runtime hands down — :data:`BUS_TOKEN_ENV` — or the run dir, and the spec's
``creds_file`` / ``token_env``, never from the spec text); :func:`connect_run` is how a command outside the run
(``flywheel status``, ``promote``, …) reaches a live run's bus.

Non-goals: no channel deletion at the end (durable channels outlive a run by design; while it runs, what every
consumer group acknowledged is dropped from them: ``_trim``); no TLS on the embedded bus
(it listens on loopback only).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import structlog

from topology.runtime._evolve import check_records, check_resumable, describe_changes, section_records
from topology.runtime._rundir import (
    TOKEN_FILE,
    RunInfo,
    bus_token,
    create_run_dir,
    lock_run_dir,
    point_latest,
    read_run_info,
    resume_run_dir,
    run_token,
    write_run_info,
)

if TYPE_CHECKING:
    from topology._spec import Spec
    from topology.bus import Bus, EmbeddedNats
    from topology.runtime._restart import RestartPolicy

BUS_TOKEN_ENV = "FLYWHEEL_BUS_TOKEN"  # how the runtime hands the embedded bus's token to the replicas it starts
_BUS_POLL_S = 0.1  # how often the supervisor looks whether nats-server still runs
_BUS_KEY = ("nats-server", 0)  # the embedded server's key in the restart policy

_log = structlog.get_logger("flywheel.runtime")


@dataclass
class Session:
    spec: Spec
    run_dir: Path
    bus_url: str
    bus: Bus
    info: RunInfo
    nats_pid: int | None
    server: EmbeddedNats | None = None
    token: str | None = None  # the embedded bus's token (handed to replicas through BUS_TOKEN_ENV)
    # how the embedded server died, each time this process brought it back (run.json's bus_restarts counts every life)
    bus_deaths: list[str] = field(default_factory=list)

    def replica_env(self) -> dict[str, str]:
        """What a replica process needs in its environment to reach the bus."""
        return {BUS_TOKEN_ENV: self.token} if self.token is not None else {}

    async def keep_bus_up(self, policy: RestartPolicy, fail: Callable[[str], None]) -> None:
        """Restart the embedded nats-server whenever it dies (see the module docstring); returns when there is none,
        or after ``fail`` was called because it kept dying or could not come back."""
        server = self.server
        if server is None:
            return
        while True:
            while server.running:  # noqa: ASYNC110 — a Popen's exit is not awaitable; poll it
                await anyio.sleep(_BUS_POLL_S)
            code = server.returncode
            how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit status {code}"
            delay = policy.on_crash(_BUS_KEY)
            if delay is None:
                fail(
                    f"the embedded nats-server died {policy.max_restarts + 1} times within {policy.window_s:g}s "
                    f"(last: {how}); stopping the topology. See {server.log_file}"
                )
                return
            _log.warning("nats-server died; restarting it on the same port", how=how, port=server.port, in_s=delay)
            await anyio.sleep(delay)
            from topology.bus import BusError

            try:
                await server.arestart()
            except BusError as exc:
                _log.error("nats-server did not come back", error=str(exc))
                continue  # counted as another crash above
            self.nats_pid = self.info.nats_pid = server.pid
            self.info.bus_restarts += 1
            self.bus_deaths.append(how)
            write_run_info(self.run_dir, self.info)
            _log.info("nats-server restarted", pid=server.pid, url=server.url, restarts=self.info.bus_restarts)


async def connect_bus(spec: Spec, url: str, *, client_name: str, run_dir: Path | None = None) -> Bus:
    """A bus client for ``spec``'s topology at ``url``; credentials never come from the spec text. The embedded
    bus's token comes from :data:`BUS_TOKEN_ENV`, else from ``run_dir``'s token file."""
    from topology.bus import Bus

    if spec.bus.embedded:
        token = os.environ.get(BUS_TOKEN_ENV) or None
        if token is None and run_dir is not None and (run_dir / TOKEN_FILE).is_file():
            token = (run_dir / TOKEN_FILE).read_text().strip() or None
    else:
        token = os.environ.get(spec.bus.token_env) if spec.bus.token_env else None
    return await Bus.connect(
        url,
        name=client_name,
        topology=spec.name,
        settings=spec.bus,
        creds_file=spec.bus.creds_file or None,
        token=token or None,
    )


async def connect_run(run_dir: Path, *, name: str, info: RunInfo | None = None) -> Bus:
    """A bus client for the run in ``run_dir`` (from its ``run.json``: URL, creds file, token), for commands that
    work on a live run from outside it. ``BusError`` when its bus cannot be reached."""
    from topology.bus import Bus

    info = info if info is not None else read_run_info(run_dir)
    return await Bus.connect(
        info.bus_url, topology=info.topology, name=name, creds_file=info.creds_file, token=bus_token(info)
    )


def _previous_port(run_dir: Path) -> int | None:
    try:
        url = read_run_info(run_dir).bus_url
        return int(url.rpartition(":")[2])
    except (OSError, ValueError):
        return None


@asynccontextmanager
async def open_session(
    spec: Spec, *, run_root: Path | None = None, single_process: bool = False, resume: Path | None = None
) -> AsyncIterator[Session]:
    from topology.bus import BusError, EmbeddedNats

    if resume is not None:
        run_dir = resume_run_dir(resume)
        previous = read_run_info(run_dir)
        changes = check_resumable(
            run_dir,
            previous.topology,
            previous.spec,
            spec_path=spec.source_path,
            name=spec.name,
            after=spec.data,
        )
        if changes:  # said once, here: what an actor makes of a change it says itself
            _log.info("the spec changed since the run last started", changes=describe_changes(changes))
        for warning in check_records(run_dir, previous.records, spec):
            _log.warning(warning)
    else:
        run_dir = create_run_dir(run_root if run_root is not None else spec.runtime.run_dir, spec.name)
        previous = None
    lock = lock_run_dir(run_dir)
    if previous is not None:
        point_latest(run_dir)
    try:
        async with AsyncExitStack() as stack:
            nats_pid: int | None = None
            server: EmbeddedNats | None = None
            token: str | None = None
            if spec.bus.embedded:
                token = run_token(run_dir)
                bus = spec.bus
                mib = 1024 * 1024

                def embedded(port: int | None) -> EmbeddedNats:
                    return EmbeddedNats(
                        run_dir / "nats",
                        port=port,
                        token=token,
                        sync_interval=bus.sync_interval,
                        max_file_store=bus.max_file_store_mb * mib if bus.max_file_store_mb else None,
                        max_memory_store=bus.max_memory_store_mb * mib if bus.max_memory_store_mb else None,
                    )

                port = _previous_port(run_dir) if previous is not None else None
                try:
                    server = await embedded(port).astart()
                except BusError:
                    if port is None:
                        raise
                    _log.warning("the run's previous bus port is taken; the bus moves to a free one", port=port)
                    server = await embedded(None).astart()
                stack.push_async_callback(server.astop)
                url, nats_pid = server.url, server.pid
            else:
                assert spec.bus.url is not None, "a validated spec has bus.url when bus.embedded is false"
                url = spec.bus.url
            client = await _connect_supervisor(spec, url, token)
            stack.push_async_callback(client.close)
            for channel in spec.channels.values():
                await client.ensure_channel(
                    channel.name, durable=channel.durable, max_age_s=channel.max_age_s, max_msgs=channel.max_msgs
                )
            now = time.time()
            info = RunInfo(
                topology=spec.name,
                bus_url=url,
                pid=os.getpid(),
                spec_path=str(spec.source_path),
                started_at=now,
                heartbeat_s=spec.runtime.heartbeat_s,
                replicas={name: actor.replicas for name, actor in spec.actors.items()},
                kinds={name: actor.kind for name, actor in spec.actors.items()},
                single_process=single_process,
                nats_pid=nats_pid,
                creds_file=spec.bus.creds_file or None,
                token_env=spec.bus.token_env or None,
                token_file=str(run_dir / TOKEN_FILE) if token is not None else None,
                spec=dict(spec.data) if spec.data is not None else None,
                records=section_records(spec),
                first_started_at=previous.first_started_at or previous.started_at if previous is not None else now,
                resumes=previous.resumes + 1 if previous is not None else 0,
                bus_restarts=previous.bus_restarts if previous is not None else 0,
            )
            write_run_info(run_dir, info)
            session = Session(
                spec=spec,
                run_dir=run_dir,
                bus_url=url,
                bus=client,
                info=info,
                nats_pid=nats_pid,
                server=server,
                token=token,
            )
            try:
                yield session
            finally:
                info.stopped_at = time.time()
                if info.exit is None:
                    info.exit = "interrupted"
                try:
                    write_run_info(run_dir, info)
                except OSError as exc:  # a full disk: the run's own verdict stands, the stop goes unrecorded
                    _log.error("the stop is not recorded", run_json=str(run_dir / "run.json"), error=str(exc))
    finally:
        os.close(lock)


async def _connect_supervisor(spec: Spec, url: str, token: str | None) -> Bus:
    from topology.bus import Bus

    if token is None:
        return await connect_bus(spec, url, client_name=f"{spec.name}-supervisor")
    return await Bus.connect(url, name=f"{spec.name}-supervisor", topology=spec.name, settings=spec.bus, token=token)
