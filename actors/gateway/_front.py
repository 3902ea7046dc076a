"""The gateway's ASGI front: what every request goes through before and after its route's handler.

Contract, in order:

* every response carries ``x-request-id`` (``fw-<uuid4 hex>``, also in ``scope["flywheel.request_id"]``);
* the ``Host`` header must name a trusted host (:class:`TrustedHosts`), else 400 ``untrusted_host``: a page that
  rebinds its own DNS name to the gateway's address reaches it under that name and is refused;
* a request carrying an ``Origin`` header (browsers send one with every cross-origin request, form posts
  included) must come from the gateway's own origin, else 403 ``cross_origin``; API clients send none. The
  gateway answers no CORS preflight, so no other site's page can read a response either;
* routing by exact path (404 ``not_found`` / 405 ``method_not_allowed``, OpenAI-shaped);
* a handler's :class:`~actors.gateway._errors.ApiError` becomes its response; any other exception is logged with
  the request id and answered with a bare OpenAI-shaped 500 (``internal_error``) that names nothing internal;
* the route's latency and status are counted in :class:`~actors.gateway._metrics.Metrics`, error codes too.

Non-goals: HTTP/2, websockets (uvicorn is run with ``ws="none"``), CORS, a header-read timeout (a client that
sends its headers slowly holds a connection but no concurrency slot; put a proxy in front for that).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

import structlog
from starlette.requests import Request

from actors.gateway._errors import ApiError, internal_error
from actors.gateway._metrics import Metrics

__all__ = ["LOOPBACK_HOSTS", "OUTCOME", "Front", "Route", "TrustedHosts"]

Handler = Callable[[Request], Awaitable[Any]]  # returns an ASGI app (a Starlette Response or a stream)
Route = tuple[str, frozenset[str], Handler]  # (metrics name, methods, handler)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
# a response whose head went out as 200 and that came to something else (a stream the client left: 499; one that
# ended in an error event: its status) puts that status here in the ASGI scope: the request is counted as it
OUTCOME = "flywheel.outcome"


class TrustedHosts:
    """Host header patterns: exact names, ``*.example.com`` (subdomains only), or ``*`` (any host)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        patterns = [p.lower() for p in patterns]
        self.any = "*" in patterns
        self.exact = frozenset(p for p in patterns if not p.startswith("*"))
        self.suffixes = tuple(p[1:] for p in patterns if p.startswith("*."))

    @classmethod
    def default_for(cls, listen_host: str) -> TrustedHosts:
        """The loopback names (and the listening address) on a loopback address, else any host."""
        if listen_host in LOOPBACK_HOSTS or listen_host.startswith("127."):
            return cls({*LOOPBACK_HOSTS, listen_host})
        return cls(["*"])

    def allows(self, host_header: str) -> bool:
        if self.any:
            return True
        host = hostname(host_header)
        return host in self.exact or (bool(self.suffixes) and host.endswith(self.suffixes))


def hostname(host_header: str) -> str:
    """``Host`` header → lower-case host without port or IPv6 brackets."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() and ":" not in name else host


class Front:
    """The ASGI app uvicorn serves: guards, routing, request ids, the catch-all 500, metrics."""

    def __init__(
        self,
        routes: Mapping[str, Route],
        *,
        prefix_routes: Mapping[str, Route],
        metrics: Metrics,
        trusted: TrustedHosts,
        log: Any = None,
    ) -> None:
        self.routes = routes
        self.prefix_routes = prefix_routes  # "/v1/models/" → the route of /v1/models/{id}
        self.metrics = metrics
        self.trusted = trusted
        self.log = log if log is not None else structlog.get_logger("flywheel.gateway")

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return  # lifespan is off and websockets are not served: nothing else reaches an HTTP-only app
        started = time.perf_counter()
        request_id = "fw-" + uuid.uuid4().hex
        scope["flywheel.request_id"] = request_id
        id_header = (b"x-request-id", request_id.encode())
        status = 500
        response_started = False

        async def send_with_id(message: MutableMapping[str, Any]) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                status = int(message["status"])
                response_started = True
                message["headers"] = [*message.get("headers", ()), id_header]
            await send(message)

        path: str = scope["path"]
        route = self.routes.get(path)
        if route is None:
            for prefix, candidate in self.prefix_routes.items():
                if path.startswith(prefix):
                    route = candidate
                    break
        name = route[0] if route is not None else "other"
        try:
            try:
                self._check_origin(scope)
                if route is None:
                    raise ApiError(404, f"no route {path}", type="invalid_request_error", code="not_found")
                if scope["method"] not in route[1]:
                    raise ApiError(
                        405,
                        f"{scope['method']} is not allowed on {path}; use {' or '.join(sorted(route[1]))}",
                        code="method_not_allowed",
                        headers={"Allow": ", ".join(sorted(route[1]))},
                    )
                app = await route[2](Request(scope, receive))
            except ApiError as exc:
                self.metrics.error(exc.code or str(exc.status))
                app = exc.response()
            await app(scope, receive, send_with_id)
        except Exception as exc:
            self.metrics.error("internal_error")
            self.metrics.internal_error()
            self.log.error(
                "gateway.internal_error",
                request_id=request_id,
                route=name,
                error=f"{type(exc).__name__}: {exc}",
                exc_info=True,
            )
            if not response_started:
                await internal_error(request_id).response()(scope, receive, send_with_id)
        finally:
            self.metrics.observe(name, scope.get(OUTCOME, status), time.perf_counter() - started)

    def _check_origin(self, scope: MutableMapping[str, Any]) -> None:
        host = origin = None
        for key, value in scope["headers"]:
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"origin":
                origin = value.decode("latin-1")
        if host is None or not self.trusted.allows(host):
            raise ApiError(
                400,
                "the Host header does not name this gateway (see the gateway's trusted_hosts)",
                code="untrusted_host",
            )
        if origin is not None:
            _, sep, netloc = origin.partition("://")
            if not sep or netloc.lower() != host.lower():
                raise ApiError(
                    403,
                    "cross-origin requests are refused: a web page of another site may not call this API",
                    type="permission_error",
                    code="cross_origin",
                )
