"""uvicorn's HTTP/1.1 protocol (httptools), sending a response's head together with its body.

uvicorn writes the head of a response when the app sends ``http.response.start`` and the body when it sends
``http.response.body``: two sends, two TCP segments, and a client that wakes up twice to read one small
JSON answer. The protocol :func:`http_protocol` returns hands uvicorn a transport that holds a response head
back until the next write (the body, sent in the same event-loop iteration by every response here) or until
the end of the current iteration, and sends both at once. Every other write (SSE chunks) goes out as it is
written. Each connection also gets ``TCP_NODELAY`` whoever created the listening socket (asyncio sets it only
on sockets whose proto says TCP): with Nagle on, a write that follows an unacknowledged one waits for the
client's delayed ACK, up to 40 ms on Linux. A connection that ends (closed or reset by the client) is freed at
once: its keep-alive timer is cancelled and its transport leaves no reference cycle behind.

Non-goals: buffering beyond the head (Nagle-like delays), other protocols than httptools' (without httptools
installed, uvicorn's default protocol is used unchanged).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

__all__ = ["http_protocol"]


class _HeadWithBody:
    """Delegates to the socket transport, except that a response head waits for the write that follows it."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(b"".join((held, data)))
        elif data.startswith(b"HTTP/1."):  # uvicorn writes a whole head at once, status line first
            self._held = data
            self._loop.call_soon(self._release)
        else:
            self._transport.write(data)

    def _release(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self._release()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def http_protocol() -> Any:
    """The protocol class to give ``uvicorn.Config(http=...)``: httptools with coalesced heads, or "auto"."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # no httptools: uvicorn picks h11
        return "auto"

    class CoalescingProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            super().connection_made(_HeadWithBody(transport))  # type: ignore[arg-type]

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            # Free the connection now rather than later. uvicorn cancels its keep-alive timer only when the
            # client closed cleanly: after a reset the timer (a bound method) kept the protocol, its transport
            # and its last request for timeout_keep_alive seconds. And CPython before 3.12 (gh-100348) leaves a
            # closed socket transport in a cycle with its own read callback, for the garbage collector to find.
            timer, self.timeout_keep_alive_task = self.timeout_keep_alive_task, None
            if timer is not None:
                timer.cancel()
            inner: Any = self.transport._transport if isinstance(self.transport, _HeadWithBody) else self.transport
            if getattr(inner, "_read_ready_cb", None) is not None:
                inner._read_ready_cb = None

    return CoalescingProtocol
