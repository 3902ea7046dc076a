"""The gateway actor: uvicorn serving :class:`~actors.gateway._app.Gateway` inside the actor's event loop.

Lifecycle: ``start`` loads the policy's tokenizer (never its weights), the API keys (the env var named by
``api_keys_env`` and/or ``api_keys_file``; never the spec text; with neither and ``generate_api_key``, the key in
``<run_dir>/<actor>/api_key``, made on first start: see :func:`generated_api_key`), binds the socket (``port: 0``
picks a free one) and subscribes to generator replies; ``run`` serves until ``ctx.stopping``, then lets open
requests finish (up to ``request_timeout_s``); ``stop`` releases the socket. ``report()`` adds ``url`` (and
``api_key_file`` for a generated key) to the counters, so heartbeats — and ``flywheel up`` / ``flywheel status`` —
show where the gateway listens and where its key is.

Non-goals: TLS, HTTP/2, several workers per replica (run more replicas behind a load balancer instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
from collections.abc import Generator
from pathlib import Path
from typing import Any

import anyio
import orjson
import uvicorn

from actors.gateway._app import ApiKeys, Gateway
from actors.gateway._client import ServeClient
from actors.gateway._config import GatewayConfig
from actors.gateway._http import http_protocol
from actors.gateway._prompt import PromptBuilder
from actors.policy import load_tokenizer
from actors.protocol import FirstRatings, domains_of, feedback_join, ping_subject, policy_of, serving_replicas
from topology.runtime import Actor, ActorContext

__all__ = ["GatewayActor", "generated_api_key", "read_api_keys"]


def read_api_keys(config: GatewayConfig, spec_dir: Path) -> list[str]:
    """Keys from ``$<api_keys_env>`` (comma-separated) and ``api_keys_file`` (one per line, ``#`` comments)."""
    keys = [k.strip() for k in os.environ.get(config.api_keys_env, "").split(",") if k.strip()]
    if config.api_keys_file:
        path = Path(config.api_keys_file).expanduser()
        path = path if path.is_absolute() else spec_dir / path
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"api_keys_file: cannot read {path}: {exc.strerror or exc}") from None
        keys += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return keys


def generated_api_key(path: Path) -> str:
    """The key in ``path``, made first when the file does not exist: 32 random bytes (URL-safe), mode 0600.

    The file appears whole or not at all (written beside it, then hard-linked into place, which fails when it
    exists), so replicas starting together and a restarted gateway all end up with the one key of the run.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        partial = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(32) + "\n")
                out.flush()
                os.fsync(out.fileno())
            with contextlib.suppress(FileExistsError):  # another replica was first: its key is the run's key
                os.link(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    key = path.read_text().strip()
    if not key:
        raise ValueError(f"{path}: the generated API key file is empty; delete it and restart the gateway")
    return key


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: the runtime owns SIGINT/SIGTERM and sets ``ctx.stopping``."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class GatewayActor(Actor[GatewayConfig]):
    def __init__(self, ctx: ActorContext, config: GatewayConfig) -> None:
        super().__init__(ctx, config)
        self.url: str | None = None
        self.gateway: Gateway | None = None
        self._socket: socket.socket | None = None
        self._client: ServeClient | None = None
        self._health: tuple[float, dict[str, Any]] = (0.0, {})
        self.api_key_file: Path | None = None  # where a generated key is (None: keys were configured)

    async def start(self) -> None:
        spec_dir = self.ctx.spec.source_path.parent
        tokenizer = await asyncio.to_thread(load_tokenizer, policy_of(self.ctx.spec), spec_dir)
        configured = read_api_keys(self.config, spec_dir)
        if not configured and self.config.generate_api_key:
            self.api_key_file = self.ctx.run_dir / self.ctx.actor / "api_key"
            configured = [await asyncio.to_thread(generated_api_key, self.api_key_file)]
            self.ctx.log.info("gateway.generated_api_key", file=str(self.api_key_file))
        keys = ApiKeys(configured)
        if not len(keys):
            self.ctx.log.warning(
                "gateway.no_api_keys",
                hint=f"set ${self.config.api_keys_env} or api_keys_file; /v1/feedback rejects every call until then",
            )
        serving = serving_replicas(self.ctx.spec)
        self._client = ServeClient(self.ctx.bus.nc, self.ctx.topology, attempts=min(3, max(1, serving)))
        await self._client.start()
        ratings: FirstRatings | None = None
        join = feedback_join(self.ctx.spec)
        if join is not None:  # a joiner trains on the first rating of each request: say so of the others
            window_s, max_pending = join
            ratings = FirstRatings(self.ctx.bus, self.ctx.topology, window_s=window_s, max_entries=max_pending)
            await ratings.open()
        self.gateway = Gateway(
            self.config,
            client=self._client,
            builder=PromptBuilder(tokenizer),
            keys=keys,
            publish=self._publish,
            health=self._check_health,
            ratings=ratings,
            domains=domains_of(self.ctx.spec),
            who=self.ctx.replica_id,
            log=self.ctx.log,
            gated=any(actor.kind == "gate" for actor in self.ctx.spec.actors.values()),
        )
        if self.gateway.trusted.any and self.config.trusted_hosts is None:
            self.ctx.log.warning(
                "gateway.any_host",
                hint=f"listening on {self.config.host}: set trusted_hosts to the names clients use, so that a web "
                "page rebinding its DNS name to this address is refused",
            )
        self._socket = _bind(self.config.host, self.config.port)
        port = self._socket.getsockname()[1]
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        self.ctx.log.info("gateway.listening", url=self.url, model=self.config.model_name, serving_generators=serving)

    async def run(self) -> None:
        assert self.gateway is not None and self._socket is not None
        config = uvicorn.Config(
            self.gateway.app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=int(self.config.request_timeout_s) + 1,
            timeout_keep_alive=30,
            backlog=4096,
            ws="none",
            http=http_protocol(),
        )
        server = _Uvicorn(config)

        async def serve_http() -> None:
            await server.serve([self._socket] if self._socket is not None else None)
            if not self.ctx.stopping.is_set():
                raise RuntimeError("the HTTP server stopped by itself")

        async with anyio.create_task_group() as tg:
            tg.start_soon(self._report_loop)
            async with anyio.create_task_group() as http:
                http.start_soon(serve_http)
                await self.ctx.stopping.wait()
                server.should_exit = True  # uvicorn stops accepting, then waits for open requests
            tg.cancel_scope.cancel()
        self.ctx.log.info("gateway.stopped", url=self.url)

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._socket is not None:
            self._socket.close()

    def report(self) -> dict[str, Any]:
        report: dict[str, Any] = dict(self.ctx.counters.snapshot())
        if self.url is not None:
            report["url"] = self.url
        if self.api_key_file is not None:
            report["api_key_file"] = str(self.api_key_file)
        return report

    async def _publish(self, channel: str, type: str, payload: dict[str, Any], id: str) -> None:
        await self.ctx.bus.publish(channel, type, payload, id=id, source=self.ctx.replica_id)

    async def _check_health(self) -> dict[str, Any]:
        """Ping one serving generator (cached for a second)."""
        checked, report = self._health
        loop = asyncio.get_running_loop()
        if loop.time() - checked < 1.0 and report:
            return report
        try:
            reply = await self.ctx.bus.nc.request(ping_subject(self.ctx.topology), b"{}", timeout=2.0)
            pong = orjson.loads(reply.data)
            report = {
                "ok": True,
                "generators": "available",
                "answered_by": pong.get("generator"),
                "version": pong.get("version"),
            }
        except Exception as exc:  # no responders, timeout, bus down: the gateway cannot serve
            report = {"ok": False, "generators": "unavailable", "reason": _unhealthy(exc)}
        self._health = (loop.time(), report)
        return report

    async def _report_loop(self) -> None:
        while True:
            await anyio.sleep(1.0)
            if self.gateway is None:
                continue
            for name, value in self.gateway.metrics.snapshot().items():
                self.ctx.counters.set(name, value)
            if self._client is not None:
                self.ctx.counters.set("serve_pending", self._client.pending)
                self.ctx.counters.set("cancels_sent", self._client.cancels_sent)


def _unhealthy(exc: Exception) -> str:
    """Why no generator answered the health ping, in words (not the bus client's exception names)."""
    import nats.errors

    if isinstance(exc, nats.errors.NoRespondersError):
        return (
            "no generator is serving: none is running, or none has weights worth answering with yet (a service "
            "serves the first version its gate promotes; `flywheel status` says whether the gate is paused)"
        )
    if isinstance(exc, TimeoutError | nats.errors.TimeoutError):
        return "no generator answered the health ping within 2 s (all busy, or the bus is slow)"
    if isinstance(
        exc, nats.errors.ConnectionClosedError | nats.errors.NoServersError | nats.errors.StaleConnectionError
    ):
        return "the gateway is not connected to the message bus (reconnecting)"
    return f"the health ping failed: {type(exc).__name__}"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto says TCP, and
    # uvicorn writes a response's head and body separately, so with Nagle on the body waited for the client's
    # delayed ACK of the head (40 ms on Linux).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"gateway cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock
