"""The HTTP plumbing shared by the SGLang and vLLM engine clients.

Contract: every failed call raises :class:`EngineHTTPError`, whose message names the engine, the server
URL, the method and path, the HTTP status (or the transport failure) and the server's own message — one
line a user can act on. Calls are bounded in time (``timeout_s`` per attempt) and retried with
exponential backoff on connection failures always (nothing reached the server), and on 5xx / read
timeouts only for calls marked idempotent. Non-goals: no streaming (SSE) responses, no authentication
beyond an optional bearer token, no connection pooling policy beyond httpx's defaults.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import httpx

__all__ = ["EngineHTTPError", "HTTPCaller"]


class EngineHTTPError(RuntimeError):
    """A call to an inference server failed; names the server, the call, the status and the reason."""

    def __init__(self, engine: str, url: str, method: str, path: str, status: int | None, message: str) -> None:
        self.engine = engine
        self.url = url
        self.method = method
        self.path = path
        self.status = status
        self.message = message
        where = f"HTTP {status}" if status is not None else "no response"
        super().__init__(f"{engine} server {url}: {method} {path} failed ({where}): {message}")


def _server_message(response: httpx.Response) -> str:
    """The most useful one-line reason a server gave, across SGLang / vLLM / FastAPI error shapes."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, Mapping):
        for key in ("message", "error", "detail"):
            value = body.get(key)
            if isinstance(value, Mapping) and "message" in value:  # OpenAI-style {"error": {"message"}}
                return str(value["message"])[:500]
            if value:
                return str(value)[:500]
    return str(body)[:500]


class HTTPCaller:
    """JSON calls to one server with per-attempt timeouts and bounded retries."""

    def __init__(
        self,
        engine: str,
        url: str,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        retries: int,
        backoff_s: float,
        api_key: str | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("timeouts must be > 0 seconds")
        self.engine = engine
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            headers=headers,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            trust_env=False,  # a proxy from the environment must never sit between us and a local server
        )

    async def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        idempotent: bool = True,
        timeout_s: float | None = None,
        retries: int | None = None,
    ) -> Any:
        """Send one JSON request; return the decoded body (``None`` when empty).

        Raises :class:`EngineHTTPError` for HTTP >= 400, for a JSON body ``{"success": false}``, and when
        every attempt failed to get a response.
        """
        attempts = 1 + (self.retries if retries is None else retries)
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else httpx.Timeout(timeout_s, connect=timeout_s)
        last_failure = ""
        started = time.monotonic()
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(min(self.backoff_s * 2 ** (attempt - 1), 5.0))
            try:
                response = await self._client.request(
                    method, self.url + path, json=json, params=params, timeout=timeout
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                last_failure = f"cannot connect ({type(exc).__name__}: {exc or 'refused'})"
                continue  # nothing reached the server: always safe to retry
            except httpx.TimeoutException as exc:
                last_failure = f"timed out ({type(exc).__name__})"
                if idempotent:
                    continue
                break
            except httpx.TransportError as exc:
                last_failure = f"transport error ({type(exc).__name__}: {exc})"
                if idempotent:
                    continue
                break
            if response.status_code >= 500 and idempotent and attempt + 1 < attempts:
                last_failure = f"HTTP {response.status_code}: {_server_message(response)}"
                continue
            if response.status_code >= 400:
                raise EngineHTTPError(
                    self.engine, self.url, method, path, response.status_code, _server_message(response)
                )
            body = response.json() if response.content else None
            if isinstance(body, Mapping) and body.get("success") is False:
                raise EngineHTTPError(
                    self.engine, self.url, method, path, response.status_code, str(body.get("message", body))
                )
            return body
        elapsed = time.monotonic() - started
        raise EngineHTTPError(
            self.engine,
            self.url,
            method,
            path,
            None,
            f"{last_failure} after {attempts} attempt(s) in {elapsed:.1f}s",
        )

    async def wait_healthy(self, paths: tuple[str, ...], timeout_s: float, poll_s: float = 0.2) -> str:
        """Poll the first path the server knows until it answers 2xx; return that path.

        A 404 moves on to the next path (older servers lack ``/health_generate``); anything else is retried
        until ``timeout_s`` runs out, then raises :class:`EngineHTTPError` with the last reason.
        """
        deadline = time.monotonic() + timeout_s
        index = 0
        last = "no attempt"
        while True:
            path = paths[index]
            try:
                response = await self._client.get(
                    self.url + path, timeout=httpx.Timeout(max(0.1, min(5.0, deadline - time.monotonic())))
                )
                if response.status_code < 300:
                    return path
                if response.status_code == 404 and index + 1 < len(paths):
                    index += 1
                    continue
                last = f"HTTP {response.status_code}: {_server_message(response)}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc or 'no response'}"
            if time.monotonic() + poll_s > deadline:
                raise EngineHTTPError(
                    self.engine,
                    self.url,
                    "GET",
                    path,
                    None,
                    f"not healthy within {timeout_s:g}s (last: {last})",
                )
            await asyncio.sleep(poll_s)

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
