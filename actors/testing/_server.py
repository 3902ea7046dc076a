"""Run a FastAPI app with uvicorn on a free loopback port, inside the caller's event loop.

Contract: ``async with AppServer(app) as server`` returns once the socket accepts connections;
``server.url`` is ``http://127.0.0.1:<port>``. Leaving the block stops the server (in-flight requests get
``shutdown_grace_s``, then are cancelled) and closes the socket. The server runs in the *same* event
loop as the caller, so it can share objects bound to that loop (the torch engine's scheduler).
``stop()``/``start()`` can be called again to simulate a server going down and coming back on the same
port. ``api_key``: the app behind a server's ``--api-key`` (:func:`require_key`). Non-goals: TLS, signal handling
(left to the caller's process), multiple workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

__all__ = ["AppServer", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, for a TCPStore or a server that binds it itself.

    Chosen at random below the kernel's ephemeral range where there is room: every socket bound to port 0 (each
    `AppServer`, nats-server, a client's own end) gets its port from that range, so a port found there by binding 0
    could go to one of them before its user bound it — a stress run's TCPStore port went to a fake SGLang server, which
    answered the store's handshake in HTTP."""
    low = _ephemeral_low()
    rng = random.SystemRandom()  # not the seeded module state: two test workers would draw the same ports
    for _ in range(100 if low - _LOWEST >= 1000 else 0):
        port = rng.randrange(_LOWEST, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_LOWEST = 10000  # free_port's ports are at least this (below: well-known services' ports)


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to a socket bound to port 0 (Linux's ip_local_port_range; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:  # the test process keeps its own handlers
        yield


def require_key(app: Any, api_key: str, guarded: Callable[[str], bool]) -> Any:
    """``app`` behind a server's ``--api-key``: a request to a ``guarded`` path without ``Authorization: Bearer
    <api_key>`` is answered ``401 {"error": "Unauthorized"}``, as SGLang and vLLM answer it."""
    expected = f"Bearer {api_key}".encode()

    async def guard(scope: Any, receive: Any, send: Any) -> None:
        asked = scope["type"] == "http" and scope["method"] != "OPTIONS" and guarded(scope["path"])
        if asked and dict(scope["headers"]).get(b"authorization") != expected:
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await app(scope, receive, send)

    return guard


class AppServer:
    def __init__(
        self,
        app: FastAPI,
        *,
        port: int | None = None,
        shutdown_grace_s: float = 1.0,
        api_key: str | None = None,
        guarded: Callable[[str], bool] = lambda path: True,
    ) -> None:
        self.app: Any = app if api_key is None else require_key(app, api_key, guarded)
        self.port = port or 0
        self.shutdown_grace_s = shutdown_grace_s
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("server not started")
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("server already running")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=max(1, round(self.shutdown_grace_s)),
        )
        server = _QuietServer(config)
        self._server = server

        async def serve() -> None:
            try:
                await server.serve(sockets=[sock])
            finally:
                sock.close()

        self._task = asyncio.create_task(serve(), name=f"fake-server:{self.port}")
        while not server.started:
            if self._task.done():
                self._task.result()  # re-raise the startup failure
                raise RuntimeError(f"server on port {self.port} exited during startup")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            async with asyncio.timeout(self.shutdown_grace_s + 5):
                await asyncio.shield(self._task)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        finally:
            self._server = None
            self._task = None

    async def __aenter__(self) -> Any:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
