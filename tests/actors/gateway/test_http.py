"""A response's head goes out in one send with the body written after it; every other write as it comes; the
protocol inside a real uvicorn keeps HTTP/1.1 whole (keep-alive, 100-continue, streams) with Nagle off; and a
connection that ends, closed or reset by the client, is freed at once, not left to a timer or the garbage
collector."""

from __future__ import annotations

import asyncio
import gc
import re
import socket
import weakref
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from actors.gateway._http import _HeadWithBody, http_protocol

pytestmark = pytest.mark.anyio


class Recording:
    """Stands in for asyncio's socket transport: records each write (each would be one send)."""

    def __init__(self) -> None:
        self.sends: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sends.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


async def test_head_and_body_are_one_send() -> None:
    sink = Recording()
    transport = _HeadWithBody(sink)  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert sink.sends == []
    transport.write(b"{}")
    assert sink.sends == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]


async def test_stream_chunks_are_not_held() -> None:
    sink = Recording()
    transport = _HeadWithBody(sink)  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    transport.write(b"5\r\ndata:\r\n")
    transport.write(b"6\r\ndata:2\r\n")
    assert len(sink.sends) == 2 and sink.sends[1] == b"6\r\ndata:2\r\n"


async def test_a_lone_head_leaves_at_the_end_of_the_loop_iteration_or_on_close() -> None:
    sink = Recording()
    transport = _HeadWithBody(sink)  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    await asyncio.sleep(0)
    assert sink.sends == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    transport.close()
    assert sink.sends[-1] == b"HTTP/1.1 204 No Content\r\n\r\n" and sink.closed
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)  # everything else is the socket's


# --- the protocol inside a real uvicorn, over real sockets -------------------------------------------------


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/plain`` echoes the body; ``/stream`` sends one chunk, then a second once ``release`` is set."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await RELEASE.wait()
        await send({"type": "http.response.body", "body": b"second"})
        return
    headers = [(b"content-type", b"application/octet-stream"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


RELEASE = asyncio.Event()


class Served:
    def __init__(self, server: uvicorn.Server, port: int) -> None:
        self.server, self.port = server, port

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    # proto 0, as socket.socket() makes it: asyncio leaves Nagle on for connections accepted from such a socket
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
    listener.bind(("127.0.0.1", 0))
    config = uvicorn.Config(_app, lifespan="off", log_level="warning", ws="none", http=http_protocol())
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve([listener]))
    for _ in range(500):  # at most 5 s
        if server.started:
            break
        await asyncio.sleep(0.01)
    assert server.started, "uvicorn did not start within 5 s"
    RELEASE.clear()
    try:
        yield Served(server, listener.getsockname()[1])
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        listener.close()


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def _response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    match = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    assert match, head
    return head, await asyncio.wait_for(reader.readexactly(int(match.group(1))), 5)


async def test_every_connection_is_wrapped_and_has_nagle_off(served: Served) -> None:
    reader, writer = await served.connect()
    writer.write(_post("/plain", b"x"))
    await _response(reader)
    (connection,) = served.server.server_state.connections
    transport: Any = connection.transport  # type: ignore[attr-defined]
    assert isinstance(transport, _HeadWithBody)
    assert transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    writer.close()


async def test_keep_alive_requests_get_whole_responses(served: Served) -> None:
    reader, writer = await served.connect()
    for body in (b"one", b"HTTP/1.1 looks like a head", b"three"):
        writer.write(_post("/plain", body))
        head, answer = await _response(reader)
        assert head.startswith(b"HTTP/1.1 200") and answer == body
    writer.close()


async def test_a_100_continue_is_not_held_back(served: Served) -> None:
    reader, writer = await served.connect()
    writer.write(_post("/plain", b"", "Expect: 100-continue\r\n").replace(b"Content-Length: 0", b"Content-Length: 4"))
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)  # the client waits for it to send its body
    assert interim.startswith(b"HTTP/1.1 100")
    writer.write(b"body")
    assert (await _response(reader))[1] == b"body"
    writer.close()


async def test_stream_chunks_arrive_while_the_stream_is_open(served: Served) -> None:
    reader, writer = await served.connect()
    writer.write(_post("/stream", b""))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert b"transfer-encoding: chunked" in head.lower()
    first = await asyncio.wait_for(reader.readuntil(b"first\r\n"), 5)  # before the app may send the second
    assert first.endswith(b"5\r\nfirst\r\n")
    RELEASE.set()
    assert (await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)).startswith(b"6\r\nsecond\r\n")
    writer.close()


async def test_a_connection_that_ends_is_freed_without_the_garbage_collector(served: Served) -> None:
    state = served.server.server_state
    ended: list[weakref.ref[Any]] = []
    gc.disable()  # only reference counting frees anything until the end: a transport in a cycle would stay
    try:
        for n in range(20):
            reader, writer = await served.connect()
            writer.write(_post("/plain", b"x"))
            await _response(reader)
            (connection,) = state.connections
            ended.append(weakref.ref(connection.transport._transport))  # type: ignore[attr-defined]
            del connection
            if n % 2:  # a reset instead of a close (SO_LINGER 0), as a load balancer may end an idle connection
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            writer.close()
            for _ in range(500):  # at most 5 s
                if not state.connections:
                    break
                await asyncio.sleep(0.01)
            assert not state.connections, "the server did not notice the client leaving within 5 s"
        await asyncio.sleep(0)
        alive = sum(ref() is not None for ref in ended)
    finally:
        gc.enable()
    assert alive == 0, f"{alive} of {len(ended)} ended connections wait for the garbage collector"
