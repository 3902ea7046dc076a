"""The gateway's side of the serve protocol (see :mod:`actors.generator._serve`): one NATS subscription for
every reply, requests spread over the serving generator replicas by the NATS queue group.

Contract: :meth:`ServeClient.open` makes a :class:`ServeCall` (nothing sent yet); :meth:`ServeCall.start` sends
the request and returns its first message, one that is not ``busy`` (a busy replica is retried up to
``attempts`` times, then :class:`GeneratorsBusy`); :meth:`ServeCall.messages` yields that first message and the
rest until the ``final`` one. :meth:`ServeClient.call` is ``open`` + ``start``. Failures are typed:
:class:`NoGenerators` (nobody subscribed: NATS answered "no responders"), :class:`GenerationError` (with the HTTP
status the generator suggests), ``TimeoutError`` (no first message within the timeout, or no whole answer within
it of the call's opening), :class:`CallCancelled`
(:meth:`ServeCall.cancel` was called, e.g. because the HTTP client went away).

Every call ends with :meth:`ServeCall.close`. A call closed before its ``final`` (or error) message — cancelled,
timed out, abandoned — sends a cancel to the generators (``cancel_subject``), so the engine stops generating
for nobody. Cancels go out from a background task, so ``close`` and ``cancel`` never block.

Non-goals: retries after a request was accepted (generation is not idempotent under sampling).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from actors.protocol import SERVE_PROTOCOL_VERSION, cancel_subject, serve_subject

__all__ = ["CallCancelled", "GenerationError", "GeneratorsBusy", "NoGenerators", "ServeCall", "ServeClient"]

_NO_RESPONDERS = "503"
_CANCELLED: dict[str, Any] = {"type": "cancelled"}  # put into a call's queue by ServeCall.cancel
_TERMINAL = frozenset(("final", "error", "busy", "no_responders"))  # after these the generator holds nothing


class NoGenerators(RuntimeError):
    """No generator with ``serve: true`` is subscribed (none running, or all still starting)."""


class GeneratorsBusy(RuntimeError):
    def __init__(self, retry_after_s: float) -> None:
        super().__init__("every generator replica is at capacity")
        self.retry_after_s = retry_after_s


class GenerationError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class CallCancelled(Exception):
    """The call was cancelled (:meth:`ServeCall.cancel`) while waiting for the generator."""


class ServeCall:
    """One request; :meth:`start` it, iterate :meth:`messages` (deltas, then the final message), :meth:`close` it."""

    def __init__(self, client: ServeClient, request_id: str, data: bytes, *, attempts: int, timeout_s: float) -> None:
        self._client = client
        self.request_id = request_id
        self._data = data
        self._attempts = attempts
        self._timeout_s = timeout_s
        self._token = ""
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._live = False  # a generator may be working on it: closing now must cancel it
        self._cancelled = False
        self.first: dict[str, Any] = {}
        self._reconnects = client.reconnects()
        self._opened = time.monotonic()

    def bus_was_away(self) -> bool:
        """Whether the bus connection dropped at any time since this call was opened (a nats-server restart, say):
        a reply that never came may have been lost with it, rather than never sent."""
        return self._client.reconnects() != self._reconnects or not self._client.connected()

    async def start(self) -> dict[str, Any]:
        """Send the request; the first message that is not ``busy`` (an ``error`` message raises)."""
        retry_after = 1.0
        for _ in range(self._attempts):
            if self._cancelled:
                raise CallCancelled(self.request_id)
            self._token = self._client._register(self._queue)
            self._live = True
            await self._client._send(self._data, self._token)
            first = await self._next(self._timeout_s)
            kind = first.get("type")
            if kind == "no_responders":
                raise NoGenerators("no generator is serving (none with serve: true is running yet)")
            if kind == "busy":
                self._client._forget(self._token)
                retry_after = float(first.get("retry_after_s", 1.0))
                continue
            if kind == "error":
                raise GenerationError(int(first.get("status", 500)), str(first.get("message", "")))
            self.first = first
            return first
        raise GeneratorsBusy(retry_after)

    async def messages(self, timeout_s: float) -> AsyncIterator[dict[str, Any]]:
        """The first message (from :meth:`start`) and the rest, up to and including ``final``, which must come within
        ``timeout_s`` of the call's opening (``TimeoutError`` otherwise): a stream's deltas do not extend it."""
        message = self.first
        while True:
            kind = message.get("type")
            if kind == "error":
                raise GenerationError(int(message.get("status", 500)), str(message.get("message", "")))
            yield message
            if kind == "final":
                return
            message = await self._next(max(0.0, self._opened + timeout_s - time.monotonic()))

    async def _next(self, timeout_s: float) -> dict[str, Any]:
        async with asyncio.timeout(timeout_s):
            message = await self._queue.get()
        if message is _CANCELLED:
            raise CallCancelled(self.request_id)
        if message.get("type") in _TERMINAL:
            self._live = False
        return message

    def cancel(self) -> None:
        """Stop waiting: the pending (or next) wait raises :class:`CallCancelled`; the generator is told."""
        if not self._cancelled:
            self._cancelled = True
            self._queue.put_nowait(_CANCELLED)
            self._cancel_generation()

    def close(self) -> None:
        """Release the call; cancels the generation if it may still be running."""
        self._cancel_generation()
        self._client._forget(self._token)

    def _cancel_generation(self) -> None:
        if self._live:
            self._live = False
            self._client._send_cancel(self.request_id)


class ServeClient:
    def __init__(self, nc: Any, topology: str, *, attempts: int = 2) -> None:
        self._nc = nc
        self._subject = serve_subject(topology)
        self._cancel_subject = cancel_subject(topology)
        self._prefix = nc.new_inbox()
        self._ids = itertools.count()
        self._pending: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._cancels: set[asyncio.Task[None]] = set()
        self._sub: Any = None
        self.attempts = max(1, attempts)
        self.cancels_sent = 0

    @property
    def pending(self) -> int:
        """Calls waiting for replies now (0 when every call was closed)."""
        return len(self._pending)

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(f"{self._prefix}.*", cb=self._on_reply)

    async def close(self) -> None:
        if self._cancels:  # let the last cancels reach the bus
            await asyncio.wait(self._cancels, timeout=1.0)
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the connection is closing anyway
                pass
            self._sub = None

    def reconnects(self) -> int:
        """How many times the bus connection was re-established so far."""
        return int(self._nc.stats.get("reconnects", 0))

    def connected(self) -> bool:
        return bool(self._nc.is_connected)

    def open(
        self, request_id: str, prompt_ids: list[int], params: Mapping[str, Any], *, stream: bool, timeout_s: float
    ) -> ServeCall:
        data = orjson.dumps(
            {
                "v": SERVE_PROTOCOL_VERSION,
                "request_id": request_id,
                "prompt_ids": prompt_ids,
                "params": params,
                "stream": stream,
            }
        )
        return ServeCall(self, request_id, data, attempts=self.attempts, timeout_s=timeout_s)

    async def call(
        self, request_id: str, prompt_ids: list[int], params: Mapping[str, Any], *, stream: bool, timeout_s: float
    ) -> ServeCall:
        """``open`` + ``start``; the call is closed when ``start`` raises."""
        call = self.open(request_id, prompt_ids, params, stream=stream, timeout_s=timeout_s)
        try:
            await call.start()
        except BaseException:
            call.close()
            raise
        return call

    # -- used by ServeCall ------------------------------------------------------------------------------
    def _register(self, queue: asyncio.Queue[dict[str, Any]]) -> str:
        token = str(next(self._ids))
        self._pending[token] = queue
        return token

    def _forget(self, token: str) -> None:
        self._pending.pop(token, None)

    async def _send(self, data: bytes, token: str) -> None:
        await self._nc.publish(self._subject, data, reply=f"{self._prefix}.{token}")

    def _send_cancel(self, request_id: str) -> None:
        data = orjson.dumps({"v": SERVE_PROTOCOL_VERSION, "request_id": request_id})
        task = asyncio.get_running_loop().create_task(self._publish_cancel(data))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _publish_cancel(self, data: bytes) -> None:
        try:
            await self._nc.publish(self._cancel_subject, data)
            self.cancels_sent += 1
        except Exception:  # the bus is down: the generator finishes the request for nobody
            pass

    async def _on_reply(self, msg: Any) -> None:
        queue = self._pending.get(msg.subject[len(self._prefix) + 1 :])
        if queue is None:
            return  # a reply for a call that was given up
        headers = msg.headers or {}
        if headers.get("Status") == _NO_RESPONDERS and not msg.data:
            queue.put_nowait({"type": "no_responders"})
            return
        try:
            payload = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            payload = {"type": "error", "status": 502, "message": "undecodable reply from a generator"}
        queue.put_nowait(
            payload if isinstance(payload, dict) else {"type": "error", "status": 502, "message": "bad reply"}
        )
