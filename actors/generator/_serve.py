"""The generator's side of the serve protocol (`actors.protocol._serve`): answer gateway requests with the engine.

Counters: ``serve_requests``, ``serve_busy``, ``serve_errors``, ``serve_tokens``, ``serve_cancelled``, gauge
``serve_in_flight``.

Cancels (``cancel_subject``): the task answering that request is cancelled, which aborts it in the engine (the
torch engine drops the row at its next step boundary; the HTTP engines close their request, which SGLang and
vLLM abort); nothing more is sent for it. A cancel for an id this replica is not running is remembered (the
last :data:`REMEMBERED_CANCELS` of them), since it may have overtaken its request.

Non-goals: cancelling a request of another replica (each replica hears every cancel and acts on its own).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio
import orjson

from actors.engines import Completion, Engine, GenerationRequest, SamplingParams
from actors.protocol import SERVE_QUEUE, cancel_subject, ping_subject, serve_subject
from topology.runtime import ActorContext

__all__ = ["REMEMBERED_CANCELS", "default_max_in_flight", "serve"]

REMEMBERED_CANCELS = 4096  # cancels kept for requests not (yet) seen here; the oldest are forgotten first


def default_max_in_flight(max_batch_size: int) -> int:
    """Serve requests one replica accepts at once: enough to keep its batch full several times over."""
    return max(64, 8 * max_batch_size)


async def serve(ctx: ActorContext, engine: Engine, *, max_in_flight: int) -> None:
    """Answer gateway requests with ``engine`` until ``ctx.stopping`` is set; returns once every accepted
    request was answered. Counters: ``serve_requests``, ``serve_busy``, ``serve_errors``, ``serve_tokens``,
    gauge ``serve_in_flight``."""
    server = _Server(ctx, engine, max_in_flight)
    async with anyio.create_task_group() as tg:
        server.spawn = tg.start_soon
        sub = await ctx.bus.nc.subscribe(serve_subject(ctx.topology), queue=SERVE_QUEUE, cb=server.on_msg)
        ping = await ctx.bus.nc.subscribe(ping_subject(ctx.topology), queue=SERVE_QUEUE, cb=server.on_ping)
        cancels = await ctx.bus.nc.subscribe(cancel_subject(ctx.topology), cb=server.on_cancel)
        ctx.log.info("generator.serving", subject=serve_subject(ctx.topology), max_in_flight=max_in_flight)
        try:
            await ctx.stopping.wait()
        finally:
            with anyio.CancelScope(shield=True):
                for subscription in (sub, ping, cancels):
                    try:
                        await subscription.unsubscribe()
                    except Exception:  # the connection is going away anyway
                        pass


class _Server:
    def __init__(self, ctx: ActorContext, engine: Engine, max_in_flight: int) -> None:
        self.ctx = ctx
        self.engine = engine
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.spawn: Callable[..., Any] | None = None
        self.who = ctx.replica_id
        self._stream = getattr(engine, "generate_stream", None)
        self._running: dict[str, anyio.CancelScope] = {}  # request id → the scope its answer runs in
        self._cancelled: OrderedDict[str, None] = OrderedDict()  # cancels that came before their request

    async def on_msg(self, msg: Any) -> None:
        reply = msg.reply
        if not reply or self.spawn is None:
            return
        if self.in_flight >= self.max_in_flight or self._engine_full():
            self.ctx.counters.inc("serve_busy")
            await self._send(reply, {"type": "busy", "retry_after_s": 0.5})
            return
        self.in_flight += 1
        self.ctx.counters.set("serve_in_flight", self.in_flight)
        self.spawn(self._handle, reply, msg.data)

    async def on_ping(self, msg: Any) -> None:
        if msg.reply:
            await self._send(
                msg.reply,
                {
                    "type": "pong",
                    "generator": self.who,
                    "version": self.engine.version,
                    "in_flight": self.in_flight,
                    "max_in_flight": self.max_in_flight,
                },
            )

    async def on_cancel(self, msg: Any) -> None:
        try:
            request_id = orjson.loads(msg.data).get("request_id")
        except (orjson.JSONDecodeError, AttributeError):
            return
        if not isinstance(request_id, str):
            return
        scope = self._running.get(request_id)
        if scope is not None:
            scope.cancel()
            return
        self._cancelled[request_id] = None
        while len(self._cancelled) > REMEMBERED_CANCELS:
            self._cancelled.popitem(last=False)

    def _engine_full(self) -> bool:
        stats = getattr(self.engine, "stats", None)
        limit = getattr(self.engine, "max_queue", None)
        if not callable(stats) or not isinstance(limit, int):
            return False
        return int(stats().get("queue_depth", 0)) >= limit

    async def _handle(self, reply: str, data: bytes) -> None:
        try:
            try:
                request, stream = _parse(data)
            except ValueError as exc:
                await self._send(reply, {"type": "error", "status": 400, "message": str(exc)})
                return
            request_id = request.request_id
            if request_id in self._cancelled:  # its cancel came first
                del self._cancelled[request_id]
                self.ctx.counters.inc("serve_cancelled")
                return
            with anyio.CancelScope() as scope:
                self._running[request_id] = scope
                try:
                    await self._answer(reply, request, stream, scope)
                finally:
                    if self._running.get(request_id) is scope:
                        del self._running[request_id]
            if scope.cancelled_caught:
                self.ctx.counters.inc("serve_cancelled")
        finally:
            self.in_flight -= 1
            self.ctx.counters.set("serve_in_flight", self.in_flight)

    async def _answer(self, reply: str, request: GenerationRequest, stream: bool, scope: anyio.CancelScope) -> None:
        try:
            completion = await self._generate(reply, request, stream)
            self.ctx.counters.inc("serve_requests")
            self.ctx.counters.inc("serve_tokens", len(completion.token_ids))
            await self._send(
                reply,
                {
                    "type": "final",
                    "token_ids": list(completion.token_ids),
                    "logprobs": list(completion.logprobs),
                    "versions": list(completion.versions),
                    "text": completion.text,
                    "finish_reason": completion.finish_reason,
                    "generator": self.who,
                },
            )
        except ValueError as exc:  # the engine rejected the request (token ids, context length)
            await self._send(reply, {"type": "error", "status": 400, "message": str(exc)})
        except Exception as exc:
            self.ctx.counters.inc("serve_errors")
            self.ctx.log.warning("generator.serve_failed", error=f"{type(exc).__name__}: {exc}")
            await self._send(reply, {"type": "error", "status": 500, "message": f"generation failed: {exc}"})
        except BaseException:
            if not scope.cancel_called:  # cancelled from outside: the generator is stopping
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    await self._send(reply, {"type": "error", "status": 503, "message": "generator stopping"})
            raise

    async def _generate(self, reply: str, request: GenerationRequest, stream: bool) -> Completion:
        if not stream or self._stream is None:
            return (await self.engine.generate([request]))[0]
        items: AsyncIterator[Any] = self._stream(request)
        async with contextlib.aclosing(items):  # type: ignore[type-var]
            async for item in items:
                if isinstance(item, Completion):
                    return item
                await self._send(reply, {"type": "delta", "token_ids": list(item.token_ids)})
        raise RuntimeError("the engine's stream ended without a completion")

    async def _send(self, reply: str, payload: Mapping[str, Any]) -> None:
        try:
            await self.ctx.bus.nc.publish(reply, orjson.dumps(payload))
        except Exception as exc:  # a lost reply is the gateway's timeout to handle, not a crash here
            self.ctx.log.warning("generator.serve_reply_failed", error=f"{type(exc).__name__}: {exc}")


def _parse(data: bytes) -> tuple[GenerationRequest, bool]:
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ValueError("serve request is not JSON") from None
    if not isinstance(raw, dict):
        raise ValueError("serve request must be a JSON object")
    request_id, prompt_ids, params = raw.get("request_id"), raw.get("prompt_ids"), raw.get("params") or {}
    if not isinstance(request_id, str) or not request_id:
        raise ValueError("serve request needs a request_id")
    if not isinstance(prompt_ids, list) or not all(isinstance(t, int) for t in prompt_ids):
        raise ValueError("serve request needs prompt_ids: a list of ints")
    if not isinstance(params, dict):
        raise ValueError("serve request params must be an object")
    return GenerationRequest(request_id, tuple(prompt_ids), SamplingParams.from_wire(params)), bool(raw.get("stream"))
