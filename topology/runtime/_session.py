"""What every runtime sets up before the first actor starts, and tears down after the last one stopped.

Contract: :func:`open_session` creates the run dir, starts the embedded ``nats-server`` (data under
``<run_dir>/nats``) when ``bus.embedded`` or uses ``bus.url``, connects the supervisor's own bus client,
ensures every channel of the spec exists, and writes ``run.json``. On exit it records ``stopped_at`` and the
reason in ``run.json``, closes the client and stops the server. :func:`connect_bus` is how a supervisor, a
child process or ``flywheel status`` connects, with credentials from ``bus.creds_file`` / ``bus.token_env``.

Non-goals: no channel deletion at the end (durable channels outlive a run by design).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from topology.runtime._rundir import RunInfo, create_run_dir, write_run_info

if TYPE_CHECKING:
    from topology._spec import Spec
    from topology.bus import Bus


@dataclass
class Session:
    spec: Spec
    run_dir: Path
    bus_url: str
    bus: Bus
    info: RunInfo
    nats_pid: int | None


async def connect_bus(spec: Spec, url: str, *, client_name: str) -> Bus:
    """A bus client for ``spec``'s topology at ``url``; credentials never come from the spec text."""
    from topology.bus import Bus

    token = os.environ.get(spec.bus.token_env) if spec.bus.token_env else None
    return await Bus.connect(
        url,
        name=client_name,
        topology=spec.name,
        settings=spec.bus,
        creds_file=spec.bus.creds_file or None,
        token=token or None,
    )


@asynccontextmanager
async def open_session(
    spec: Spec, *, run_root: Path | None = None, single_process: bool = False
) -> AsyncIterator[Session]:
    from topology.bus import EmbeddedNats

    run_dir = create_run_dir(run_root if run_root is not None else spec.runtime.run_dir, spec.name)
    async with AsyncExitStack() as stack:
        nats_pid: int | None = None
        if spec.bus.embedded:
            server = await stack.enter_async_context(EmbeddedNats(run_dir / "nats"))
            url, nats_pid = server.url, server.pid
        else:
            assert spec.bus.url is not None, "a validated spec has bus.url when bus.embedded is false"
            url = spec.bus.url
        bus = await connect_bus(spec, url, client_name=f"{spec.name}-supervisor")
        stack.push_async_callback(bus.close)
        for channel in spec.channels.values():
            await bus.ensure_channel(
                channel.name, durable=channel.durable, max_age_s=channel.max_age_s, max_msgs=channel.max_msgs
            )
        info = RunInfo(
            topology=spec.name,
            bus_url=url,
            pid=os.getpid(),
            spec_path=str(spec.source_path),
            started_at=time.time(),
            heartbeat_s=spec.runtime.heartbeat_s,
            replicas={name: actor.replicas for name, actor in spec.actors.items()},
            kinds={name: actor.kind for name, actor in spec.actors.items()},
            single_process=single_process,
            nats_pid=nats_pid,
            creds_file=spec.bus.creds_file or None,
            token_env=spec.bus.token_env or None,
            spec=dict(spec.data) if spec.data is not None else None,
        )
        write_run_info(run_dir, info)
        session = Session(spec=spec, run_dir=run_dir, bus_url=url, bus=bus, info=info, nats_pid=nats_pid)
        try:
            yield session
        finally:
            info.stopped_at = time.time()
            if info.exit is None:
                info.exit = "interrupted"
            write_run_info(run_dir, info)
