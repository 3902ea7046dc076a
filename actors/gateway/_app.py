"""The gateway's HTTP surface: an OpenAI-compatible API backed by the generators, feedback, metrics, health.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (``stream: true`` → server-sent events ending
in ``data: [DONE]``), ``GET /v1/models``, ``POST /v1/feedback``, ``GET /metrics``, ``GET /healthz``. What every
request goes through first (request ids, trusted hosts, cross-origin refusal, the catch-all 500) is
:mod:`actors.gateway._front`.

Contract:

* Every response carries ``x-request-id``; for completions it is also the body's ``id`` and the id that
  ``/v1/feedback`` takes and that the ``traffic`` record is stored under.
* A served request is published to ``traffic`` (:class:`~actors.protocol._messages.TrafficMsg`, envelope id =
  request id) and stored by JetStream *before* its response completes: before the JSON body is sent, before the
  final SSE chunk. A request rejected with a 4xx/5xx is never published. A record the bus does not take is
  logged (with the request id) and counted (``traffic_errors`` in the heartbeat); the client is still answered.
* Request bodies: ``Content-Type: application/json`` only (415 otherwise — with no CORS preflight answered, a
  browser cannot send that type cross-site); at most ``max_body_bytes`` (413); all of it within
  ``body_timeout_s`` (408, and the connection is closed). A concurrency slot (``max_concurrency``,
  ``max_streams``: 429 with ``Retry-After`` when full) is taken only once the body was read and validated, so
  slow or broken clients never hold one.
* ``x-flywheel-domain`` names the request's domain (recorded with it, for per-domain baselines); only the
  spec's domains are accepted (400 ``unknown_domain``); without it, ``default_domain``.
* A client that disconnects before its answer cancels its generation (the serve protocol's cancel); nothing
  is recorded for it. So does a request that times out (504) or fails otherwise.
* Errors are OpenAI-shaped ``{"error": {"message", "type", "param", "code"}}`` (:mod:`actors.gateway._errors`):
  malformed JSON or invalid fields 400, a chat content part other than text (an image, audio, a file) 400, a
  ``max_tokens`` above the gateway's cap 400, missing or wrong key 401,
  unknown model or route 404, body too slow 408, body too large 413, wrong content type 415, gateway or generators at
  capacity 429 with ``Retry-After``, a generator failure 502/500, no generator serving 503, no whole answer within
  ``request_timeout_s`` of the request (streamed or not) 504 (503 ``bus_unavailable`` when the bus dropped
  meanwhile). Server-side failures name nothing internal (the detail is logged with the request id). A failure after
  an SSE stream started is sent as a final ``data: {"error": …}`` event (the official client raises it) and nothing
  is recorded.
* API keys (``Authorization: Bearer <key>``) guard ``/v1/feedback`` always, inference routes when
  ``require_key_for_inference``, ``/metrics`` when ``require_key_for_metrics``.
* Feedback: ``{request_id, score ∈ [0, 1] | label, comment?}``; labels map through
  :data:`~actors.protocol.FEEDBACK_LABELS` (good/thumbs_up/… → 1, neutral → 0.5, bad/thumbs_down/… → 0); a score
  must be a JSON number, and one sent with a label must be the label's.
  Any request id is accepted, known or not, at any time: the joiner pairs it with its traffic record later (feedback
  whose request never comes within its window is counted as unmatched). The answer is 200 ``{"status": "accepted",
  "id", "request_id", "score"}``; a rating of a request that was rated already (through a gateway or ``flywheel
  review``) answers ``"status": "duplicate"`` and a ``message`` (it is stored, and only the first trains:
  :mod:`actors.protocol._ratings`); the same rating sent again (a retry) answers as the first did.

Non-goals: per-key quotas, TLS (put a proxy in front), CORS.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pydantic
import structlog
from starlette.requests import Request
from starlette.responses import Response

from actors.gateway._client import (
    CallCancelled,
    GenerationError,
    GeneratorsBusy,
    NoGenerators,
    ServeCall,
    ServeClient,
)
from actors.gateway._config import GatewayConfig
from actors.gateway._errors import JSON, ApiError, busy, unavailable, unknown_model
from actors.gateway._front import OUTCOME, Front, TrustedHosts
from actors.gateway._metrics import Metrics
from actors.gateway._prompt import (
    UNSUPPORTED_PARAMETER,
    UNSUPPORTED_VALUE,
    ChatRequest,
    ChatTemplateError,
    CompletionRequest,
    PromptBuilder,
)
from actors.protocol import FEEDBACK_LABELS, CompletionRecord, FeedbackMsg, FirstRatings, TrafficMsg, rating_digest

__all__ = ["ApiKeys", "Gateway"]

_GONE = Response(status_code=499)  # nginx's "client closed request": counted, never sent (nobody listens)


class ApiKeys:
    """Bearer keys; compared in constant time. ``key_id`` is a short hash, safe to record."""

    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = [k.encode() for k in keys if k]

    def __len__(self) -> int:
        return len(self._keys)

    def check(self, request: Request) -> str:
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(
                401,
                "missing API key: send 'Authorization: Bearer <key>'",
                code="missing_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        given = key.strip().encode()
        if not any(hmac.compare_digest(given, known) for known in self._keys):
            raise ApiError(  # 401, as OpenAI answers it: the SDK raises AuthenticationError (403 is PermissionDenied)
                401,
                "invalid API key",
                code="invalid_api_key",
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        return hashlib.sha256(given).hexdigest()[:12]


class _FeedbackRequest(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")
    request_id: str = pydantic.Field(min_length=1, max_length=200)
    score: pydantic.StrictFloat | pydantic.StrictInt | None = None  # true is no score (pydantic would make it 1.0)
    label: str | None = pydantic.Field(default=None, max_length=64)
    comment: str = pydantic.Field(default="", max_length=8000)


@dataclass
class _Served:
    """What a completion request needs from arrival to its traffic record."""

    request_id: str
    route: str
    ts: float
    started: float
    request: ChatRequest | CompletionRequest
    prompt: str
    prompt_ids: list[int]
    max_tokens: int
    domain: str | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    outcome: int = 0  # a stream's status as counted, when not the 200 its head said: 499 (client gone), an error's


class _DisconnectWatch:
    """Waits for the client's ``http.disconnect`` (read from ASGI ``receive`` once the body is consumed) and
    then cancels the call; :meth:`stop` ends the watch."""

    def __init__(self, receive: Callable[[], Awaitable[Mapping[str, Any]]], call: ServeCall) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(receive, call))

    @staticmethod
    async def _watch(receive: Callable[[], Awaitable[Mapping[str, Any]]], call: ServeCall) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        call.cancel()

    def stop(self) -> None:
        self._task.cancel()


class Gateway:
    """Request handling; :meth:`app` builds the ASGI app. One instance per gateway replica."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        client: ServeClient,
        builder: PromptBuilder,
        keys: ApiKeys,
        publish: Callable[[str, str, dict[str, Any], str], Awaitable[Any]],
        health: Callable[[], Awaitable[dict[str, Any]]],
        ratings: FirstRatings | None = None,
        domains: Collection[str] = (),
        who: str = "gateway",
        log: Any = None,
        gated: bool = False,
    ) -> None:
        self.config = config
        self.client = client
        self.builder = builder
        self.keys = keys
        self.publish = publish  # (channel, type, payload, id) → returns once stored
        self.health = health
        self.ratings = ratings  # None: no joiner, every rating is only recorded
        self.domains = frozenset(domains)
        self.who = who
        self.gated = gated  # a promotion gate decides what serves: "no generator" may mean "nothing promoted yet"
        self.log = log if log is not None else structlog.get_logger("flywheel.gateway")
        self.metrics = Metrics()
        self.created = int(time.time())
        hosts = config.trusted_hosts
        self.trusted = TrustedHosts(hosts) if hosts is not None else TrustedHosts.default_for(config.host)

    # ------------------------------------------------------------------ app
    def app(self) -> Front:
        get, post = frozenset({"GET"}), frozenset({"POST"})
        routes = {
            "/v1/chat/completions": ("chat", post, self.chat),
            "/v1/completions": ("completions", post, self.completions),
            "/v1/models": ("models", get, self.models),
            "/v1/feedback": ("feedback", post, self.feedback),
            "/metrics": ("metrics", get, self.metrics_route),
            "/healthz": ("healthz", get, self.healthz),
        }
        prefix_routes = {"/v1/models/": ("models", get, self.model)}
        return Front(routes, prefix_routes=prefix_routes, metrics=self.metrics, trusted=self.trusted, log=self.log)

    async def models(self, request: Request) -> Response:
        card = {"id": self.config.model_name, "object": "model", "created": self.created, "owned_by": "flywheel"}
        return Response(orjson.dumps({"object": "list", "data": [card]}), media_type=JSON)

    async def model(self, request: Request) -> Response:
        model_id = request.url.path[len("/v1/models/") :]
        if model_id != self.config.model_name:
            raise unknown_model(model_id, self.config.model_name)
        card = {"id": model_id, "object": "model", "created": self.created, "owned_by": "flywheel"}
        return Response(orjson.dumps(card), media_type=JSON)

    async def metrics_route(self, request: Request) -> Response:
        if self.config.require_key_for_metrics:
            self.keys.check(request)
        body, content_type = self.metrics.render(request.headers.get("accept", ""))
        return Response(body, headers={"Content-Type": content_type})

    async def healthz(self, request: Request) -> Response:
        report = await self.health()
        return Response(orjson.dumps(report), status_code=200 if report.get("ok") else 503, media_type=JSON)

    async def feedback(self, request: Request) -> Response:
        key_id = self.keys.check(request)
        raw = await self._read_json(request)
        try:
            body = _FeedbackRequest.model_validate(raw)
        except pydantic.ValidationError as exc:
            raise _first_error(exc) from None
        score, label = body.score, body.label
        if label is not None:
            label = label.strip().lower()
            if label not in FEEDBACK_LABELS:
                raise _invalid("label", f"unknown label {body.label!r}; expected one of {', '.join(FEEDBACK_LABELS)}")
        if score is None:
            if label is None:
                raise _invalid("score", "feedback needs a score (0..1) or a label (good, bad, thumbs_up, …)")
            score = FEEDBACK_LABELS[label]
        elif label is not None and FEEDBACK_LABELS[label] != score:  # which one did the user mean?
            raise _invalid(
                "label", f"score {score} and label {body.label!r} (= {FEEDBACK_LABELS[label]}) disagree: send one"
            )
        if not 0.0 <= score <= 1.0:
            raise _invalid("score", f"score must be between 0 and 1, got {score}")
        msg = FeedbackMsg(
            request_id=body.request_id, score=score, label=label, comment=body.comment, ts=time.time(), key_id=key_id
        )
        digest = rating_digest(body.request_id, score, label, body.comment)
        first = True
        try:
            if self.ratings is not None:
                first = await self.ratings.claim(body.request_id, digest)
            try:
                await self.publish("feedback", "feedback", msg.model_dump(mode="json"), f"fb-{digest}")
            except Exception:
                if first and self.ratings is not None:
                    with contextlib.suppress(Exception):  # the bus is away: the claim's TTL ends it
                        await self.ratings.release(body.request_id, digest)
                raise
        except Exception as exc:
            self.log.warning(
                "gateway.feedback_not_stored", request_id=body.request_id, error=f"{type(exc).__name__}: {exc}"
            )
            raise unavailable(
                "feedback could not be stored right now; retry later", "unavailable", self.config.retry_after_s
            ) from None
        self.metrics.feedback_accepted(duplicate=not first)
        doc: dict[str, Any] = {
            "status": "accepted",
            "id": f"fb-{digest}",
            "request_id": body.request_id,
            "score": score,
        }
        if not first:
            doc["status"] = "duplicate"
            doc["message"] = (
                f"request {body.request_id!r} was rated already; only its first rating counts (this one is recorded, "
                "not trained on)"
            )
        return Response(orjson.dumps(doc), media_type=JSON)

    # ------------------------------------------------------------------ completions
    async def chat(self, request: Request) -> Any:
        return await self._complete(request, "chat")

    async def completions(self, request: Request) -> Any:
        return await self._complete(request, "completions")

    async def _complete(self, request: Request, route: str) -> Any:
        started, ts = time.perf_counter(), time.time()
        if self.config.require_key_for_inference:
            self.keys.check(request)
        served, stream = self._prepare(request, await self._read_json(request), route, started, ts)
        try:
            params = served.request.sampling(served.max_tokens).to_wire()
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        metrics = self.metrics
        if metrics.in_flight >= self.config.max_concurrency:
            raise busy("the gateway is at its max_concurrency", self.config.retry_after_s)
        if stream and metrics.streams_open >= self.config.max_streams:
            raise busy("too many concurrent streams (max_streams)", self.config.retry_after_s)
        metrics.in_flight += 1
        metrics.streams_open += stream
        call = self.client.open(
            served.request_id, served.prompt_ids, params, stream=stream, timeout_s=self.config.request_timeout_s
        )
        watch = _DisconnectWatch(request.receive, call)
        handed_over = False
        try:
            await self._start(call, served)
            if stream:
                handed_over = True
                return _Stream(self, call, watch, served)
            final: dict[str, Any] = {}
            try:
                async for message in call.messages(self.config.request_timeout_s):
                    final = message
            except GenerationError as exc:
                raise self._generation_error(exc, served) from None
            except TimeoutError:
                raise self._timeout(call) from None
            await self._record(served, final, stream=False)
            return Response(orjson.dumps(self._body(served, final)), media_type=JSON)
        except CallCancelled:
            metrics.disconnect()
            return _GONE
        finally:
            if not handed_over:
                self._release(call, watch, stream)

    def _release(self, call: ServeCall, watch: _DisconnectWatch, stream: bool) -> None:
        watch.stop()
        call.close()
        self.metrics.in_flight -= 1
        self.metrics.streams_open -= stream

    def _prepare(self, request: Request, raw: Any, route: str, started: float, ts: float) -> tuple[_Served, bool]:
        try:
            body: ChatRequest | CompletionRequest = (
                ChatRequest.model_validate(raw) if route == "chat" else CompletionRequest.model_validate(raw)
            )
        except pydantic.ValidationError as exc:
            raise _first_error(exc) from None
        if body.model != self.config.model_name:
            raise unknown_model(body.model, self.config.model_name)
        wanted = body.wanted_tokens(self.config.default_max_tokens)
        if wanted > self.config.max_tokens:
            raise ApiError(
                400,
                f"max_tokens {wanted} is above this gateway's limit of {self.config.max_tokens}",
                code="max_tokens_exceeded",
                param="max_completion_tokens" if body.max_completion_tokens else "max_tokens",
            )
        domain = request.headers.get("x-flywheel-domain")
        if domain and domain not in self.domains:
            known = ", ".join(sorted(self.domains)) or "none; send no x-flywheel-domain header"
            raise ApiError(
                400,
                f"x-flywheel-domain {domain[:100]!r} is not a domain of this service; expected one of: {known}",
                code="unknown_domain",
            )
        messages: list[dict[str, Any]] = []
        if isinstance(body, ChatRequest):
            try:
                prompt = self.builder.chat_text(body.messages)
            except ChatTemplateError as exc:
                raise _invalid("messages", f"messages: the model's chat template refuses them: {exc}") from None
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        else:
            prompt = body.text()
        served = _Served(
            request_id=request.scope["flywheel.request_id"],
            route=route,
            ts=ts,
            started=started,
            request=body,
            prompt=prompt,
            prompt_ids=self.builder.encode(prompt),
            max_tokens=wanted,
            domain=domain or self.config.default_domain,
            messages=messages,
        )
        return served, body.stream

    async def _start(self, call: ServeCall, served: _Served) -> None:
        try:
            await call.start()
        except GeneratorsBusy as exc:
            raise busy(
                "every generator is at capacity", max(self.config.retry_after_s, round(exc.retry_after_s))
            ) from None
        except NoGenerators:
            why = (
                " (this service's generators serve only a version its gate promoted: none yet, or the gate is "
                "paused — `flywheel status` shows which)"
                if self.gated
                else ""
            )
            raise unavailable(
                f"no generator is serving right now{why}; retry later", "no_generators", self.config.retry_after_s
            ) from None
        except GenerationError as exc:
            raise self._generation_error(exc, served) from None
        except TimeoutError:
            raise self._timeout(call) from None

    def _timeout(self, call: ServeCall) -> ApiError:
        """No answer within ``request_timeout_s``: a 504 — or, when the bus connection dropped meanwhile (a
        nats-server restart), a 503 that says so: the generator may have answered into the outage."""
        if call.bus_was_away():
            return unavailable(
                "the message bus was reconnecting while this request waited for its answer; retry",
                "bus_unavailable",
                self.config.retry_after_s,
            )
        return ApiError(504, "no whole answer came within request_timeout_s", type="server_error", code="timeout")

    async def _read_json(self, request: Request) -> Any:
        """The body as JSON: content type checked, size capped, all of it within ``body_timeout_s``."""
        headers = request.headers
        media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != JSON:
            raise ApiError(
                415,
                f"expected Content-Type: application/json, got {media_type[:100] or 'none'}",
                code="unsupported_media_type",
            )
        limit = self.config.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise ApiError(400, "invalid Content-Length header")
            if int(declared) > limit:
                raise ApiError(
                    413, f"request body of {declared} bytes is over the limit of {limit}", code="body_too_large"
                )
        body = bytearray()
        receive = request.receive
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        self.metrics.disconnect()
                        raise ApiError(499, "the client went away", code="client_disconnected")
                    body += message.get("body", b"")
                    if len(body) > limit:
                        raise ApiError(413, f"request body is over the limit of {limit} bytes", code="body_too_large")
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise ApiError(
                408,
                f"the request body did not arrive within {self.config.body_timeout_s:g} s",
                code="body_timeout",
                headers={"Connection": "close"},
            ) from None
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None

    async def _record(self, served: _Served, final: Mapping[str, Any], *, stream: bool) -> None:
        """Publish the traffic record and wait until it is stored; a bus failure is logged and counted, and the
        user is still answered."""
        body = served.request
        msg = TrafficMsg(
            request_id=served.request_id,
            ts=served.ts,
            model=body.model,
            route=served.route,  # type: ignore[arg-type]
            domain=served.domain,
            prompt=served.prompt,
            messages=served.messages,
            prompt_ids=served.prompt_ids,
            completion=CompletionRecord(
                text=final["text"],
                token_ids=final["token_ids"],
                logprobs=final["logprobs"],
                versions=final["versions"],
                finish_reason=final["finish_reason"],
            ),
            temperature=body.temperature,
            top_p=body.top_p,
            max_tokens=served.max_tokens,
            stream=stream,
            generator=str(final.get("generator", "")),
            latency_s=time.perf_counter() - served.started,
        )
        tokens = len(final["token_ids"])
        try:
            await self.publish("traffic", "traffic", msg.model_dump(mode="json"), served.request_id)
        except Exception as exc:
            self.metrics.publish_failed(tokens)
            self.log.warning(
                "gateway.traffic_not_recorded", request_id=served.request_id, error=f"{type(exc).__name__}: {exc}"
            )
            return
        self.metrics.published(tokens)

    def _generation_error(self, exc: GenerationError, served: _Served) -> ApiError:
        request_id = served.request_id
        if 400 <= exc.status < 500:  # the generator refused the prompt itself (empty, longer than the context)
            param = "messages" if served.route == "chat" else "prompt"  # the rest was checked here, before it went
            return ApiError(exc.status, str(exc), code="generation_failed", param=param)
        self.log.warning("gateway.generation_failed", request_id=request_id, status=exc.status, error=str(exc))
        status = exc.status if exc.status in (500, 502, 503) else 502
        return ApiError(
            status,
            f"the generator could not complete this request (request id {request_id})",
            type="server_error",
            code="generation_failed",
        )

    def _body(self, served: _Served, final: Mapping[str, Any]) -> dict[str, Any]:
        reason = _finish_reason(final["finish_reason"])
        usage = _usage(served, final)
        text = shown_text(final["text"], served.request.stops(), more=False)
        if served.route == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": reason,
            }
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            kind = "text_completion"
        return {
            "id": served.request_id,
            "object": kind,
            "created": int(served.ts),
            "model": served.request.model,
            "choices": [choice],
            "usage": usage,
        }

    # ------------------------------------------------------------------ streaming
    def _chunk(self, served: _Served, text: str | None, reason: str | None, *, role: bool = False) -> bytes:
        if served.route == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            kind = "text_completion"
        doc = {
            "id": served.request_id,
            "object": kind,
            "created": int(served.ts),
            "model": served.request.model,
            "choices": [choice],
        }
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    async def _sse(self, call: ServeCall, served: _Served) -> AsyncGenerator[bytes, None]:
        decode = self.builder.tokenizer.decode
        stops = served.request.stops()
        ids: list[int] = []
        sent = ""
        try:
            if served.route == "chat":
                yield self._chunk(served, None, None, role=True)
            async for message in call.messages(self.config.request_timeout_s):
                if message.get("type") == "delta":
                    ids.extend(message.get("token_ids", ()))
                    text = decode(ids)
                    if text.endswith("\ufffd"):
                        continue  # an incomplete multi-byte character: wait for the next token
                    text = shown_text(text, stops, more=True)
                    if not text.startswith(sent):
                        continue
                    if len(text) > len(sent):
                        yield self._chunk(served, text[len(sent) :], None)
                        sent = text
                elif message.get("type") == "final":
                    await self._record(served, message, stream=True)
                    text = shown_text(message["text"], stops, more=False)
                    rest = text[len(sent) :] if text.startswith(sent) else ""
                    if rest:
                        yield self._chunk(served, rest, None)
                    yield self._chunk(served, None, _finish_reason(message["finish_reason"]))
                    if (served.request.stream_options or {}).get("include_usage"):
                        usage: dict[str, Any] = {
                            "id": served.request_id,
                            "object": "chat.completion.chunk" if served.route == "chat" else "text_completion",
                            "created": int(served.ts),
                            "model": served.request.model,
                            "choices": [],
                            "usage": _usage(served, message),
                        }
                        yield b"data: " + orjson.dumps(usage) + b"\n\n"
                    yield b"data: [DONE]\n\n"
        except CallCancelled:
            served.outcome = _GONE.status_code
            self.metrics.disconnect()
        except (GenerationError, TimeoutError) as exc:
            error = self._generation_error(exc, served) if isinstance(exc, GenerationError) else self._timeout(call)
            served.outcome = error.status
            self.metrics.error(error.code or str(error.status))
            yield b"data: " + error.body() + b"\n\n"


class _Stream:
    """The ASGI response of a streaming completion: SSE chunks as the generator sends tokens; always releases
    the request's slot and closes its call, however the stream ends."""

    def __init__(self, gateway: Gateway, call: ServeCall, watch: _DisconnectWatch, served: _Served) -> None:
        self.gateway, self.call, self.watch, self.served = gateway, call, watch, served

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"cache-control", b"no-cache"),
                    ],
                }
            )
            async with contextlib.aclosing(self.gateway._sse(self.call, self.served)) as chunks:
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if self.served.outcome:  # counted as what it came to (the front reads it), not as its head's 200
                scope[OUTCOME] = self.served.outcome
            self.gateway._release(self.call, self.watch, True)


def _invalid(param: str, message: str) -> ApiError:
    """A 400 for a field our own checks refuse (after its model accepted it), named as pydantic's would be."""
    return ApiError(400, message, code="invalid_value", param=param)


def _first_error(exc: pydantic.ValidationError) -> ApiError:
    """A 400 for the request's first invalid field: the message names it, and so does ``param``."""
    error = exc.errors()[0]
    message = str(error["msg"]).removeprefix("Value error, ")  # our validators' messages, as raised
    # a union field's errors sit under the member they tried (score.float, prompt.str): the client's field is the name
    where = ".".join(str(part) for part in error["loc"] if not _is_union_member(part))
    unsupported = error["type"] in (UNSUPPORTED_PARAMETER, UNSUPPORTED_VALUE)
    if where or not (unsupported or error["type"] == "value_error"):  # a whole-request validator's message
        message = f"{where or 'body'}: {message}"  # names its field itself
    message += f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    param = where or (str((error.get("ctx") or {}).get("field", "")) or None)
    return ApiError(400, message, code=error["type"] if unsupported else "invalid_value", param=param)


_UNION_MEMBERS = frozenset({"str", "int", "float", "bool", "bytes", "none", "list", "dict", "tuple", "set"})


def _is_union_member(part: str | int) -> bool:
    """Whether a part of a pydantic error's location names a union's member schema (``float``, ``list[str]``,
    ``function-after[…]``) rather than a field or an index — no field of an OpenAI request is named so."""
    return isinstance(part, str) and (part in _UNION_MEMBERS or "[" in part)


def shown_text(text: str, stops: tuple[str, ...], *, more: bool) -> str:
    """What the client is sent of ``text``: up to the first stop sequence, without it (the OpenAI API's rule; the
    engine keeps it, and so does the traffic record, whose tokens generated it). ``more``: more text may follow (a
    stream), so a tail that could begin a stop sequence is held back until it is known not to."""
    found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    if found:
        return text[: min(found)]
    if more:
        held = max((k for stop in stops for k in range(1, len(stop)) if text.endswith(stop[:k])), default=0)
        return text[: len(text) - held]
    return text


def _finish_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"  # "abort" (engine closing) is not an OpenAI reason


def _usage(served: _Served, final: Mapping[str, Any]) -> dict[str, int]:
    prompt, completion = len(served.prompt_ids), len(final["token_ids"])
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
