"""The HTTP plumbing shared by the SGLang and vLLM engine clients, and their common base class `HTTPEngine`.

Contract: every failed call raises :class:`EngineHTTPError`, whose message names the engine, the server URL, the
method and path, the HTTP status (or the transport failure) and the server's own message — one line a user can act
on; a 2xx body that is not JSON is one too ("malformed JSON body"). Calls are bounded in time (``timeout_s`` per
attempt, for the whole answer: a server that sends its body a byte at a time times out too) and retried with
exponential backoff on connection failures always (nothing reached the server), and on 5xx / read timeouts only for
calls marked idempotent. A generation the server refuses as made (400, 413, 422: a prompt too long for its context)
raises `RequestError`, as the torch engine does. A weight update pauses the server and resumes it after; a resume
that fails is owed and tried again at the next generation or update. Non-goals: no streaming (SSE) responses, no
authentication beyond an optional bearer token, no connection pooling policy beyond httpx's defaults.
"""

from __future__ import annotations

import abc
import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self, TypedDict

import anyio
import httpx

from actors.engines._types import (
    Completion,
    FinishReason,
    GenerationRequest,
    RequestError,
    SamplingParams,
    UnsupportedServerError,
    WeightSource,
)

if TYPE_CHECKING:
    from actors.engines._group import Broadcaster, DistributedWeights

__all__ = [
    "Chunk",
    "EngineHTTPError",
    "EngineUnsupportedError",
    "HTTPCaller",
    "HTTPEngine",
    "HTTPOptions",
    "reported_version",
    "sampling_fields",
]

# statuses of a generation request the server refuses as made (a prompt too long for its context, a bad field):
# trying it again fails the same way (408 and 429 are about the server's state, 401/403/404 about the setup)
_REFUSED = frozenset({400, 413, 422})


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


class EngineUnsupportedError(EngineHTTPError, UnsupportedServerError):
    """A call failed because the server lacks what it needs (a route, an argument); the message says what to run."""


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
        # set when a call could not connect: the server may have restarted since (and lost the weights it was given)
        self.lost_contact = False
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
        # httpx's timeout bounds each read: a server that sends its body a byte at a time would never time out
        whole_s = self.timeout_s if timeout_s is None else timeout_s
        last_failure = ""
        started = time.monotonic()
        made = 0
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(min(self.backoff_s * 2 ** (attempt - 1), 5.0))
            made += 1
            try:
                with anyio.fail_after(whole_s):
                    response = await self._client.request(
                        method, self.url + path, json=json, params=params, timeout=timeout
                    )
            except TimeoutError:
                last_failure = f"timed out (no whole answer within {whole_s:g} s)"
                if idempotent:
                    continue
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                last_failure = f"cannot connect ({type(exc).__name__}: {exc or 'refused'})"
                self.lost_contact = True
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
            try:
                body = response.json() if response.content else None
            except ValueError:  # a truncated body, a proxy's HTML page
                raise EngineHTTPError(
                    self.engine,
                    self.url,
                    method,
                    path,
                    response.status_code,
                    f"malformed JSON body: {response.text[:200]!r}",
                ) from None
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
            f"{last_failure} after {made} attempt(s) in {elapsed:.1f}s",
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


def reported_version(value: Any) -> int | None:
    """A server's ``weight_version`` as ours: an integer as it is; ``"default"`` — the label SGLang and vLLM give
    the weights they started with — is 0 (none of ours); anything else (absent, another trainer's label) is None."""
    if value == "default":
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def sampling_fields(params: SamplingParams, *, seed_key: str) -> dict[str, Any]:
    """The sampling settings SGLang and vLLM spell alike (``top_k`` -1 = off); the seed under ``seed_key``."""
    fields: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "ignore_eos": params.ignore_eos,
    }
    if params.stop:
        fields["stop"] = list(params.stop)
    if params.stop_token_ids:
        fields["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        fields[seed_key] = params.seed
    return fields


class HTTPOptions(TypedDict, total=False):
    """The keyword arguments every HTTP engine takes (their defaults are :class:`HTTPEngine`'s)."""

    timeout_s: float
    connect_timeout_s: float
    retries: int
    backoff_s: float
    max_resubmits: int
    rank_offset: int
    update_timeout_s: float
    api_key: str | None


@dataclass(frozen=True)
class Chunk:
    """What one generation call returned: tokens with their behaviour logprobs, the version that made them."""

    token_ids: list[int]
    logprobs: list[float]
    version: int
    text: str
    finish_reason: FinishReason


class HTTPEngine(abc.ABC):
    """What the SGLang and vLLM clients share: the HTTP caller, the tracked version, generation fanned out one call per
    request, and weight updates — serialized, bracketed by a pause when the engine is running, from a safetensors
    directory or over a torch.distributed group the server joins once (both sides block on the group's store until
    they meet, so the join call and the local connect run concurrently). Subclasses say how each is spelled in their
    server's API."""

    name = "http"
    # the server reads weights from a safetensors directory (or a broadcast it joins), never tensors in this process
    loads_directories = True

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        max_resubmits: int = 16,
        rank_offset: int = 1,
        update_timeout_s: float = 600.0,
        api_key: str | None = None,
    ) -> None:
        if max_resubmits < 0:
            raise ValueError(f"max_resubmits must be >= 0, got {max_resubmits}")
        self._http = HTTPCaller(
            self.name,
            url,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            retries=retries,
            backoff_s=backoff_s,
            api_key=api_key,
        )
        self.url = self._http.url
        self.max_resubmits = max_resubmits
        self.rank_offset = rank_offset
        self.update_timeout_s = update_timeout_s
        self.resubmitted = 0  # requests resubmitted after an abort (a statistic for report())
        self._version = 0
        self._paused = False
        self._resume_owed = False  # this engine paused the server for an update and its resume failed
        self._group_joined: object | None = None  # the broadcaster whose group the server has joined
        self._update_lock = asyncio.Lock()

    @property
    def version(self) -> int:
        return self._version

    @abc.abstractmethod
    async def start(self, *, health_timeout_s: float = 60.0) -> None:
        """Wait until the server can generate and learn what it serves."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return list(await asyncio.gather(*(self._generate_one(r) for r in requests)))

    async def _generate_one(self, request: GenerationRequest) -> Completion:
        """One request, resubmitted with its prompt plus the tokens it already has after each abort (a pause for a
        weight update aborts it), up to ``max_resubmits`` times — so every chunk carries the version that really
        produced it; past that it is returned with ``finish_reason="abort"``."""
        token_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        text = ""
        finish: FinishReason = "abort"
        if self._resume_owed:
            await self._resume_owed_now()
        for attempt in range(self.max_resubmits + 1):
            try:
                chunk = await self._generate_chunk(request, token_ids, attempt)
            except EngineHTTPError as exc:
                if exc.status in _REFUSED:  # the server refuses the request as made (too long for its context)
                    raise RequestError(str(exc)) from None
                raise
            token_ids += chunk.token_ids
            logprobs += [lp if math.isfinite(lp) else -math.inf for lp in chunk.logprobs]
            versions += [chunk.version] * len(chunk.token_ids)
            text += chunk.text
            finish = chunk.finish_reason
            if finish != "abort":
                break
            if len(token_ids) >= request.params.max_new_tokens:
                finish = "length"
                break
            if attempt < self.max_resubmits:
                self.resubmitted += 1
        return Completion(
            request_id=request.request_id,
            prompt_ids=request.prompt_ids,
            token_ids=tuple(token_ids),
            logprobs=tuple(logprobs),
            versions=tuple(versions),
            text=text,
            finish_reason=finish,
        )

    @abc.abstractmethod
    async def _generate_chunk(self, request: GenerationRequest, prefix: list[int], attempt: int) -> Chunk:
        """One call to the server: continue ``request`` after ``prefix`` (the tokens it already has)."""

    @abc.abstractmethod
    async def pause(self) -> None: ...

    @abc.abstractmethod
    async def resume(self) -> None: ...

    async def update_weights(self, version: int, source: WeightSource | DistributedWeights) -> None:
        from actors.engines._group import DistributedWeights  # torch: only once weights move

        async with self._update_lock:
            bracket = not self._paused or self._resume_owed  # (a pause of the caller's own stays the caller's)
            if bracket:
                await self.pause()
            try:
                if isinstance(source, DistributedWeights):
                    broadcaster = source.broadcaster
                    if self._group_joined is not broadcaster:
                        await asyncio.gather(self._join_group(broadcaster), asyncio.to_thread(broadcaster.connect))
                        self._group_joined = broadcaster
                    await self._receive_broadcast(version, source)
                elif isinstance(source, str):
                    await self._load_from_disk(version, source)
                else:
                    raise TypeError(
                        f"{type(self).__name__}.update_weights takes a safetensors directory path or "
                        f"DistributedWeights; got {type(source).__name__} (write in-memory tensors to disk first)"
                    )
                self._version = version
            finally:
                if bracket:
                    await self._resume_bracket()

    async def _resume_bracket(self) -> None:
        """Resume after an update this engine paused the server for. A resume that fails is owed: the next
        generation or update tries it again — taken for a pause of the caller's, it left the server paused for
        good (every later update skipped the bracket, every generation timed out)."""
        try:
            await self.resume()
        except BaseException:
            self._resume_owed = True
            raise
        self._resume_owed = False

    async def _resume_owed_now(self) -> None:
        async with self._update_lock:
            if self._resume_owed:
                await self._resume_bracket()

    @abc.abstractmethod
    async def _load_from_disk(self, version: int, path: str) -> None:
        """Have the server load the safetensors directory ``path`` as ``version``."""

    @abc.abstractmethod
    async def _join_group(self, broadcaster: Broadcaster) -> None:
        """Have the server join the broadcaster's group (returns once it has)."""

    @abc.abstractmethod
    async def _receive_broadcast(self, version: int, source: DistributedWeights) -> None:
        """Have the server receive ``source.tensors`` while the broadcaster sends them, as ``version``."""
