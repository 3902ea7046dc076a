"""The gateway's HTTP surface: an OpenAI-compatible API backed by the generators, feedback, metrics, health.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (``stream: true`` → server-sent events ending
in ``data: [DONE]``), ``GET /v1/models``, ``POST /v1/feedback``, ``GET /metrics``, ``GET /healthz``.

Contract:

* Every response carries ``x-request-id``; for completions it is also the body's ``id`` and the id that
  ``/v1/feedback`` takes and that the ``traffic`` record is stored under.
* A served request is published to ``traffic`` (:class:`~actors.protocol._messages.TrafficMsg`, envelope id = request
  id) *before* its response completes: before the JSON body is returned, before the final SSE chunk. A
  request rejected with a 4xx/5xx is never published.
* Errors are OpenAI-shaped ``{"error": {"message", "type", "code"}}``: malformed JSON or invalid fields 400,
  a ``max_tokens`` above the gateway's cap 400, missing key 401, wrong key 403, unknown model or route 404,
  body over ``max_body_bytes`` 413, gateway or generators at capacity 429 with ``Retry-After``, no generator
  serving 503, a generator silent past ``request_timeout_s`` 504. A failure after an SSE stream started is
  sent as a final ``data: {"error": …}`` event (the official client raises it) and nothing is recorded.
* API keys (``Authorization: Bearer <key>``) guard ``/v1/feedback`` always, inference routes when
  ``require_key_for_inference``, ``/metrics`` when ``require_key_for_metrics``.
* Feedback: ``{request_id, score ∈ [0, 1] | label, comment?}``; labels map through
  :data:`~actors.protocol.FEEDBACK_LABELS` (good/thumbs_up/… → 1, neutral → 0.5, bad/thumbs_down/… → 0).
  Any request id is accepted, known or not, at any time: the joiner pairs it with its traffic record later.

Non-goals: cancelling generation when a client disconnects, per-key quotas, TLS (put a proxy in front).
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from actors.gateway._client import GenerationError, GeneratorsBusy, NoGenerators, ServeCall, ServeClient
from actors.gateway._config import GatewayConfig
from actors.gateway._metrics import Metrics
from actors.gateway._prompt import ChatRequest, CompletionRequest, PromptBuilder
from actors.protocol import FEEDBACK_LABELS, CompletionRecord, FeedbackMsg, TrafficMsg

__all__ = ["ApiError", "ApiKeys", "Gateway"]

_ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/models": "models",
    "/v1/feedback": "feedback",
    "/metrics": "metrics",
    "/healthz": "healthz",
}
_JSON = "application/json"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type, code
        self.headers = dict(headers or {})

    def response(self) -> Response:
        body = {"error": {"message": self.message, "type": self.type, "code": self.code}}
        return Response(orjson.dumps(body), status_code=self.status, media_type=_JSON, headers=self.headers)


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
            raise ApiError(403, "invalid API key", code="invalid_api_key")
        return hashlib.sha256(given).hexdigest()[:12]


class _FeedbackRequest(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")
    request_id: str = pydantic.Field(min_length=1, max_length=200)
    score: float | None = None
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
        who: str = "gateway",
    ) -> None:
        self.config = config
        self.client = client
        self.builder = builder
        self.keys = keys
        self.publish = publish  # (channel, type, payload, id) → stored
        self.health = health
        self.who = who
        self.metrics = Metrics()
        self.created = int(time.time())

    # ------------------------------------------------------------------ app
    def app(self) -> Any:
        api = FastAPI(title="flywheel gateway", docs_url=None, redoc_url=None, openapi_url=None)
        api.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
        api.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
        # Plain Starlette routes (endpoint(request) -> Response): the handlers parse their own bodies, so
        # FastAPI's dependency machinery would only add latency on the hot path.
        api.add_route("/v1/chat/completions", self.chat, methods=["POST"])
        api.add_route("/v1/completions", self.completions, methods=["POST"])
        api.add_route("/v1/models", self.models, methods=["GET"])
        api.add_route("/v1/models/{model_id:path}", self.model, methods=["GET"])
        api.add_route("/v1/feedback", self.feedback, methods=["POST"])
        api.add_route("/metrics", self.metrics_route, methods=["GET"])
        api.add_route("/healthz", self.healthz, methods=["GET"])
        return _RequestIds(api, self.metrics)

    async def models(self, request: Request) -> Response:
        card = {"id": self.config.model_name, "object": "model", "created": self.created, "owned_by": "flywheel"}
        return Response(orjson.dumps({"object": "list", "data": [card]}), media_type=_JSON)

    async def model(self, request: Request) -> Response:
        model_id = str(request.path_params["model_id"])
        if model_id != self.config.model_name:
            raise _unknown_model(model_id, self.config.model_name)
        card = {"id": model_id, "object": "model", "created": self.created, "owned_by": "flywheel"}
        return Response(orjson.dumps(card), media_type=_JSON)

    async def metrics_route(self, request: Request) -> Response:
        if self.config.require_key_for_metrics:
            self.keys.check(request)
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def healthz(self, request: Request) -> Response:
        report = await self.health()
        return Response(orjson.dumps(report), status_code=200 if report.get("ok") else 503, media_type=_JSON)

    async def feedback(self, request: Request) -> Response:
        key_id = self.keys.check(request)
        raw = await self._read_json(request)
        try:
            body = _FeedbackRequest.model_validate(raw)
        except pydantic.ValidationError as exc:
            raise ApiError(400, _first_error(exc)) from None
        score, label = body.score, body.label
        if label is not None:
            label = label.strip().lower()
            if label not in FEEDBACK_LABELS:
                raise ApiError(400, f"unknown label {body.label!r}; expected one of {', '.join(FEEDBACK_LABELS)}")
        if score is None:
            if label is None:
                raise ApiError(400, "feedback needs a score (0..1) or a label (good, bad, thumbs_up, …)")
            score = FEEDBACK_LABELS[label]
        if not 0.0 <= score <= 1.0:
            raise ApiError(400, f"score must be between 0 and 1, got {score}")
        msg = FeedbackMsg(
            request_id=body.request_id, score=score, label=label, comment=body.comment, ts=time.time(), key_id=key_id
        )
        digest = hashlib.sha256(orjson.dumps([body.request_id, score, label, body.comment])).hexdigest()[:32]
        try:
            await self.publish("feedback", "feedback", msg.model_dump(mode="json"), f"fb-{digest}")
        except Exception as exc:
            raise ApiError(503, f"feedback could not be stored: {exc}", type="server_error") from None
        self.metrics.feedback += 1
        doc = {"status": "accepted", "id": f"fb-{digest}", "request_id": body.request_id, "score": score}
        return Response(orjson.dumps(doc), media_type=_JSON)

    # ------------------------------------------------------------------ completions
    async def chat(self, request: Request) -> Response:
        return await self._complete(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, "completions")

    async def _complete(self, request: Request, route: str) -> Response:
        started, ts = time.perf_counter(), time.time()
        if self.config.require_key_for_inference:
            self.keys.check(request)
        if self.metrics.in_flight >= self.config.max_concurrency:
            raise _busy("the gateway is at its max_concurrency", self.config.retry_after_s)
        self.metrics.in_flight += 1
        stream = handed_over = False
        try:
            served, wants_stream = await self._prepare(request, route, started, ts)
            if wants_stream:
                if self.metrics.streams_open >= self.config.max_streams:
                    raise _busy("too many concurrent streams (max_streams)", self.config.retry_after_s)
                self.metrics.streams_open += 1
                stream = True
            try:
                params = served.request.sampling(served.max_tokens).to_wire()
            except ValueError as exc:
                raise ApiError(400, str(exc)) from None
            call = await self._call(served, params, stream)
            if stream:
                handed_over = True
                return StreamingResponse(
                    self._sse(call, served), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
                )
            try:
                final: dict[str, Any] = {}
                async for message in call.messages(self.config.request_timeout_s):
                    final = message
            except GenerationError as exc:
                raise _generation_error(exc) from None
            except TimeoutError:
                raise _timeout() from None
            finally:
                call.close()
            await self._record(served, final, stream=False)
            return Response(orjson.dumps(self._body(served, final)), media_type=_JSON)
        finally:
            if not handed_over:
                self.metrics.in_flight -= 1
                self.metrics.streams_open -= stream

    async def _prepare(self, request: Request, route: str, started: float, ts: float) -> tuple[_Served, bool]:
        raw = await self._read_json(request)
        try:
            body: ChatRequest | CompletionRequest = (
                ChatRequest.model_validate(raw) if route == "chat" else CompletionRequest.model_validate(raw)
            )
        except pydantic.ValidationError as exc:
            raise ApiError(400, _first_error(exc)) from None
        if body.model != self.config.model_name:
            raise _unknown_model(body.model, self.config.model_name)
        wanted = body.wanted_tokens(self.config.default_max_tokens)
        if wanted > self.config.max_tokens:
            raise ApiError(
                400,
                f"max_tokens {wanted} is above this gateway's limit of {self.config.max_tokens}",
                code="max_tokens_exceeded",
            )
        messages: list[dict[str, Any]] = []
        if isinstance(body, ChatRequest):
            prompt = self.builder.chat_text(body.messages)
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        else:
            prompt = body.text()
        domain = request.headers.get("x-flywheel-domain") or self.config.default_domain
        served = _Served(
            request_id=request.scope["flywheel.request_id"],
            route=route,
            ts=ts,
            started=started,
            request=body,
            prompt=prompt,
            prompt_ids=self.builder.encode(prompt),
            max_tokens=wanted,
            domain=domain,
            messages=messages,
        )
        return served, body.stream

    async def _call(self, served: _Served, params: dict[str, Any], stream: bool) -> ServeCall:
        try:
            return await self.client.call(
                served.request_id, served.prompt_ids, params, stream=stream, timeout_s=self.config.request_timeout_s
            )
        except GeneratorsBusy as exc:
            raise _busy(
                "every generator is at capacity", max(self.config.retry_after_s, round(exc.retry_after_s))
            ) from None
        except NoGenerators as exc:
            raise ApiError(
                503,
                str(exc),
                type="server_error",
                code="no_generators",
                headers={"Retry-After": str(self.config.retry_after_s)},
            ) from None
        except GenerationError as exc:
            raise _generation_error(exc) from None
        except TimeoutError:
            raise _timeout() from None

    async def _read_json(self, request: Request) -> Any:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise ApiError(400, "invalid Content-Length header")
            if int(declared) > limit:
                raise ApiError(
                    413, f"request body of {declared} bytes is over the limit of {limit}", code="body_too_large"
                )
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise ApiError(413, f"request body is over the limit of {limit} bytes", code="body_too_large")
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None

    async def _record(self, served: _Served, final: Mapping[str, Any], *, stream: bool) -> None:
        """Publish the traffic record; a bus failure is counted and logged, the user is still answered."""
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
        self.metrics.tokens += len(final["token_ids"])
        try:
            await self.publish("traffic", "traffic", msg.model_dump(mode="json"), served.request_id)
            self.metrics.traffic_published += 1
        except Exception:
            self.metrics.traffic_errors += 1

    def _body(self, served: _Served, final: Mapping[str, Any]) -> dict[str, Any]:
        reason = _finish_reason(final["finish_reason"])
        usage = _usage(served, final)
        if served.route == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": final["text"]},
                "logprobs": None,
                "finish_reason": reason,
            }
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": final["text"], "logprobs": None, "finish_reason": reason}
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

    async def _sse(self, call: ServeCall, served: _Served) -> AsyncIterator[bytes]:
        decode = self.builder.tokenizer.decode
        ids: list[int] = []
        sent = ""
        try:
            if served.route == "chat":
                yield self._chunk(served, None, None, role=True)
            async for message in call.messages(self.config.request_timeout_s):
                if message.get("type") == "delta":
                    ids.extend(message.get("token_ids", ()))
                    text = decode(ids)
                    if text.endswith("\ufffd") or not text.startswith(sent):
                        continue  # an incomplete multi-byte character: wait for the next token
                    if len(text) > len(sent):
                        yield self._chunk(served, text[len(sent) :], None)
                        sent = text
                elif message.get("type") == "final":
                    await self._record(served, message, stream=True)
                    rest = message["text"][len(sent) :] if message["text"].startswith(sent) else ""
                    if rest:
                        yield self._chunk(served, rest, None)
                    yield self._chunk(served, None, _finish_reason(message["finish_reason"]))
                    if (served.request.stream_options or {}).get("include_usage"):
                        usage = {
                            "id": served.request_id,
                            "object": "chat.completion.chunk",
                            "created": int(served.ts),
                            "model": served.request.model,
                            "choices": [],
                            "usage": _usage(served, message),
                        }
                        yield b"data: " + orjson.dumps(usage) + b"\n\n"
                    yield b"data: [DONE]\n\n"
        except (GenerationError, TimeoutError) as exc:
            error = _generation_error(exc) if isinstance(exc, GenerationError) else _timeout()
            yield (
                b"data: "
                + orjson.dumps({"error": {"message": error.message, "type": error.type, "code": error.code}})
                + b"\n\n"
            )
        finally:
            call.close()
            self.metrics.streams_open -= 1
            self.metrics.in_flight -= 1


class _RequestIds:
    """Pure ASGI wrapper: a request id for every request (``x-request-id``) and per-route metrics."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = "fw-" + uuid.uuid4().hex
        scope["flywheel.request_id"] = request_id
        header = (b"x-request-id", request_id.encode())
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.metrics.observe(_ROUTES.get(scope.get("path", ""), "other"), status, time.perf_counter() - started)


async def _api_error(request: Request, exc: ApiError) -> Response:
    return exc.response()


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    return ApiError(exc.status_code, str(exc.detail), type=kind, code=str(exc.status_code)).response()


def _busy(message: str, retry_after_s: int) -> ApiError:
    return ApiError(
        429,
        f"{message}; retry after {retry_after_s}s",
        type="rate_limit_error",
        code="busy",
        headers={"Retry-After": str(retry_after_s)},
    )


def _timeout() -> ApiError:
    return ApiError(504, "no generator answered within request_timeout_s", type="server_error", code="timeout")


def _generation_error(exc: GenerationError) -> ApiError:
    status = exc.status if 400 <= exc.status < 600 else 502
    return ApiError(
        status, str(exc), type="invalid_request_error" if status < 500 else "server_error", code="generation_failed"
    )


def _unknown_model(model: str, served: str) -> ApiError:
    return ApiError(404, f"the model {model!r} does not exist; this gateway serves {served!r}", code="model_not_found")


def _first_error(exc: pydantic.ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "body"
    return f"{where}: {error['msg']}" + (f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else "")


def _finish_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"  # "abort" (engine closing) is not an OpenAI reason


def _usage(served: _Served, final: Mapping[str, Any]) -> dict[str, int]:
    prompt, completion = len(served.prompt_ids), len(final["token_ids"])
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
