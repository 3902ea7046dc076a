"""The gateway's side of the serve protocol (see :mod:`actors.generator._serve`): one NATS subscription for
every reply, requests spread over the serving generator replicas by the NATS queue group.

Contract: :meth:`ServeClient.call` sends one request and returns a :class:`ServeCall` whose first message
has already arrived and is not ``busy`` (a busy replica is retried up to ``attempts`` times, then
:class:`GeneratorsBusy`); :meth:`ServeCall.messages` yields the rest until the ``final`` message. Failures
are typed: :class:`NoGenerators` (nobody subscribed: NATS answered "no responders"), :class:`GenerationError`
(with the HTTP status the generator suggests), ``TimeoutError`` (no message within the timeout).

Non-goals: retries after a request was accepted (generation is not idempotent under sampling), cancellation.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from actors.protocol import SERVE_PROTOCOL_VERSION, serve_subject

__all__ = ["GenerationError", "GeneratorsBusy", "NoGenerators", "ServeCall", "ServeClient"]

_NO_RESPONDERS = "503"


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


class ServeCall:
    """One request in flight; iterate :meth:`messages` (deltas, then the final message)."""

    def __init__(self, client: ServeClient, token: str, queue: asyncio.Queue[dict[str, Any]], first: dict[str, Any]):
        self._client = client
        self._token = token
        self._queue = queue
        self.first = first

    async def messages(self, timeout_s: float) -> AsyncIterator[dict[str, Any]]:
        message = self.first
        while True:
            kind = message.get("type")
            if kind == "error":
                raise GenerationError(int(message.get("status", 500)), str(message.get("message", "")))
            yield message
            if kind == "final":
                return
            message = await asyncio.wait_for(self._queue.get(), timeout_s)

    def close(self) -> None:
        self._client._pending.pop(self._token, None)


class ServeClient:
    def __init__(self, nc: Any, topology: str, *, attempts: int = 2) -> None:
        self._nc = nc
        self._subject = serve_subject(topology)
        self._prefix = nc.new_inbox()
        self._ids = itertools.count()
        self._pending: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._sub: Any = None
        self.attempts = max(1, attempts)

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(f"{self._prefix}.*", cb=self._on_reply)

    async def close(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the connection is closing anyway
                pass
            self._sub = None

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

    async def call(
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
        retry_after = 1.0
        for _ in range(self.attempts):
            token = str(next(self._ids))
            queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
            self._pending[token] = queue
            try:
                await self._nc.publish(self._subject, data, reply=f"{self._prefix}.{token}")
                first = await asyncio.wait_for(queue.get(), timeout_s)
            except BaseException:
                self._pending.pop(token, None)
                raise
            kind = first.get("type")
            if kind in ("busy", "no_responders"):
                self._pending.pop(token, None)
                if kind == "no_responders":
                    raise NoGenerators("no generator is serving (none with serve: true is running yet)")
                retry_after = float(first.get("retry_after_s", 1.0))
                continue
            return ServeCall(self, token, queue, first)
        raise GeneratorsBusy(retry_after)
