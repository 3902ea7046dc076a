"""Clients that misbehave: slow bodies hold no concurrency slot and get 408; only JSON bodies, trusted hosts and
same-origin requests are served; only the spec's domains are accepted; a client that goes away cancels its
generation; a traffic record the bus refuses is logged and counted; an internal failure is a bare OpenAI-shaped
500. Everything refused is never recorded."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
import structlog

from actors.gateway._client import GenerationError, ServeCall
from tests.actors.gateway.conftest import Running
from tests.actors.gateway.test_limits_and_feedback import CHAT, error_of, post

pytestmark = pytest.mark.timeout(60)
LONG = {"model": "flywheel", "prompt": "count: ", "max_tokens": 64, "temperature": 1.0}


def connect(running: Running) -> socket.socket:
    host, port = running.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def head(running: Running, path: str, length: int, extra: str = "") -> bytes:
    host = running.url.removeprefix("http://")
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode()


def read_all(sock: socket.socket) -> bytes:
    """Everything until the gateway closes. A reset ends it too: a trickling client may send one more byte after
    the gateway answered and closed, and the closed socket answers that byte with RST, so the recv after the
    answer (and its FIN) raises instead of returning b"". What was read before stays the answer."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def slow_steps(gateway: Running) -> Iterator[None]:
    """Each decode step of the generator's engine takes 50 ms more, so a generation lasts long enough to leave."""
    engine = gateway.generator.engine
    assert engine is not None

    async def slow(_: int) -> None:
        await asyncio.sleep(0.05)

    engine.step_hook = slow  # type: ignore[attr-defined]
    try:
        yield
    finally:
        engine.step_hook = None  # type: ignore[attr-defined]


def test_slow_bodies_hold_no_slot_and_get_408(gateway: Running) -> None:
    app = gateway.gateway.gateway
    assert app is not None
    body = orjson.dumps(CHAT)
    before = gateway.stored("traffic")
    stalled = [connect(gateway) for _ in range(5)]  # with max_concurrency 6, ten slow clients would fill it
    trickling = [connect(gateway) for _ in range(5)]
    for sock in (*stalled, *trickling):
        sock.sendall(head(gateway, "/v1/chat/completions", len(body)) + body[:10])
    stop = threading.Event()

    def trickle() -> None:  # one byte every 0.2 s: each chunk is prompt, the whole body is far too slow
        for offset in range(10, len(body)):
            if stop.wait(0.2):
                return
            for sock in trickling:
                try:
                    sock.send(body[offset : offset + 1])
                except OSError:
                    pass

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        assert app.metrics.in_flight == 0  # ten clients mid-body, no slot taken
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            served = list(pool.map(lambda _: post(gateway, "/v1/chat/completions", json=CHAT), range(6)))
        assert [r.status_code for r in served] == [200] * 6
        for sock in (*stalled, *trickling):
            answer = read_all(sock)  # the gateway closes the connection after its 408
            assert answer.startswith(b"HTTP/1.1 408") and b'"code":"body_timeout"' in answer, answer[:300]
    finally:
        stop.set()
        thread.join()
        for sock in (*stalled, *trickling):
            sock.close()
    assert gateway.stored("traffic") == before + 6


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded", "text/json"])
def test_only_json_bodies_are_accepted(gateway: Running, content_type: str | None) -> None:
    before = gateway.stored("traffic")
    headers = {"Content-Type": content_type} if content_type else {}
    response = httpx.post(gateway.url + "/v1/chat/completions", content=orjson.dumps(CHAT), headers=headers)
    assert response.status_code == 415 and error_of(response)["code"] == "unsupported_media_type"
    assert gateway.stored("traffic") == before
    with_charset = {"Content-Type": "application/json; charset=utf-8"}
    assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=with_charset).status_code == 200


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({"Host": "evil.example"}, 400, "untrusted_host"),
        ({"Host": "evil.example:80"}, 400, "untrusted_host"),
        ({"Origin": "http://evil.example"}, 403, "cross_origin"),
        ({"Origin": "null"}, 403, "cross_origin"),
    ],
)
def test_untrusted_hosts_and_cross_site_pages_are_refused(
    gateway: Running, headers: dict[str, str], status: int, code: str
) -> None:
    before = gateway.stored("traffic")
    response = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == status and error_of(response)["code"] == code
    assert httpx.get(gateway.url + "/metrics", headers=headers).status_code == status  # nothing to read either
    assert gateway.stored("traffic") == before


def test_trusted_names_and_the_own_origin_are_served(gateway: Running) -> None:
    port = gateway.url.rsplit(":", 1)[1]
    for headers in ({"Host": f"localhost:{port}"}, {"Origin": gateway.url}):
        assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=headers).status_code == 200


def test_only_the_specs_domains_are_accepted(gateway: Running) -> None:
    before = gateway.stored("traffic")
    unknown = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers={"x-flywheel-domain": "poetry"})
    assert unknown.status_code == 400 and error_of(unknown)["code"] == "unknown_domain"
    assert "arithmetic" in str(error_of(unknown)["message"])
    assert gateway.stored("traffic") == before
    known = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers={"x-flywheel-domain": "arithmetic"})
    assert known.status_code == 200
    records = {p.request_id: p for _, p in gateway.read("traffic", gateway.stored("traffic"))}
    assert records[known.json()["id"]].domain == "arithmetic"


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_cancels_its_generation(gateway: Running, slow_steps: None, stream: bool) -> None:
    app, generator, engine = gateway.gateway.gateway, gateway.generator, gateway.generator.engine
    assert app is not None and engine is not None
    stats: Callable[[], dict[str, Any]] = engine.stats  # type: ignore[attr-defined]
    aborted, cancelled = stats()["requests_aborted"], generator.ctx.counters.get("serve_cancelled")
    gone, before = app.metrics.client_disconnects, gateway.stored("traffic")
    requests, served = app.metrics.requests, app.metrics.served
    left = {"route": "completions", "status": "499"}  # nginx's "client closed request"
    left_before = app.metrics.registry.get_sample_value("flywheel_gateway_requests_total", left) or 0
    body = orjson.dumps({**LONG, "stream": stream})
    sock = connect(gateway)
    sock.sendall(head(gateway, "/v1/completions", len(body)) + body)
    if stream:
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # headers and the first tokens: it is streaming
    else:
        wait_until(lambda: generator.ctx.counters.get("serve_in_flight") == 1, "the generator to take it")
        time.sleep(0.3)  # a few of its 64 steps
    sock.close()
    wait_until(lambda: stats()["requests_aborted"] == aborted + 1, "the engine to abort the request")
    assert generator.ctx.counters.get("serve_cancelled") == cancelled + 1
    assert app.metrics.client_disconnects == gone + 1
    wait_until(lambda: app.metrics.in_flight == 0 and app.client.pending == 0, "the gateway to let go")
    assert gateway.stored("traffic") == before
    # counted as left, not served: a stream's head said 200 (the live view's requests/s counted it as answered)
    wait_until(lambda: app.metrics.requests == requests + 1, "the request to be counted")
    assert app.metrics.served == served
    assert app.metrics.registry.get_sample_value("flywheel_gateway_requests_total", left) == left_before + 1


def test_a_traffic_record_the_bus_refuses_is_logged_and_counted(gateway: Running) -> None:
    actor, app = gateway.gateway, gateway.gateway.gateway
    assert app is not None
    js = gateway.bus.nc.jetstream()
    stream = gateway.bus.stream("traffic")

    async def max_msg_size(limit: int) -> None:
        config = (await js.stream_info(stream)).config
        config.max_msg_size = limit
        await js.update_stream(config)

    errors = app.metrics.traffic_errors
    gateway.run(max_msg_size(64))  # JetStream now refuses every traffic record
    try:
        with structlog.testing.capture_logs() as logs:
            response = post(gateway, "/v1/chat/completions", json=CHAT)
    finally:
        gateway.run(max_msg_size(-1))
    assert response.status_code == 200  # the user is still answered
    assert app.metrics.traffic_errors == errors + 1
    failed = [e for e in logs if e["event"] == "gateway.traffic_not_recorded"]
    assert [e["request_id"] for e in failed] == [response.json()["id"]]
    wait_until(lambda: actor.ctx.counters.get("traffic_errors") == errors + 1, "the heartbeat's counter", 5)


def test_an_internal_failure_is_a_bare_openai_500(gateway: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    app = gateway.gateway.gateway
    assert app is not None

    def boom(text: str) -> list[int]:
        raise RuntimeError("secret detail at /srv/flywheel/internal.py")

    monkeypatch.setattr(app.builder, "encode", boom)
    before = gateway.stored("traffic")
    with structlog.testing.capture_logs() as logs:
        response = post(gateway, "/v1/chat/completions", json=CHAT)
    assert response.status_code == 500
    error = error_of(response)
    assert error["code"] == "internal_error" and error["type"] == "server_error"
    assert "secret" not in response.text and "/srv" not in response.text
    assert response.headers["x-request-id"] in str(error["message"])
    logged = [e for e in logs if e["event"] == "gateway.internal_error"]
    assert logged and "secret detail" in logged[0]["error"]
    assert gateway.stored("traffic") == before


def test_a_generator_failure_names_nothing_internal(gateway: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = gateway.generator.engine
    assert engine is not None

    async def broken(requests: Any, **_: Any) -> Any:
        raise RuntimeError("CUDA error at /opt/secret/kernel.cu:42")

    monkeypatch.setattr(engine, "generate", broken)
    response = post(gateway, "/v1/completions", json={"model": "flywheel", "prompt": "x", "max_tokens": 2})
    assert response.status_code == 500 and error_of(response)["code"] == "generation_failed"
    assert "secret" not in response.text and "CUDA" not in response.text


@pytest.mark.parametrize("status", [501, 504])
def test_a_generator_status_the_gateway_does_not_answer_with_is_a_502(
    gateway: Running, monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    """A generator's failure is a 502 (or the 500/502/503 it said): passed through, a generator's 504 would read as
    the gateway's own ``request_timeout_s`` running out, a 501 as a route the gateway lacks, and clients would act on
    the wrong cause."""

    async def fails(self: ServeCall) -> dict[str, Any]:
        raise GenerationError(status, "the model server answered " + str(status))

    monkeypatch.setattr(ServeCall, "start", fails)
    response = post(gateway, "/v1/completions", json={"model": "flywheel", "prompt": "x", "max_tokens": 2})
    assert response.status_code == 502, response.text
    error = error_of(response)
    assert error["code"] == "generation_failed" and error["type"] == "server_error"


def test_no_answer_while_the_bus_was_away_is_a_503_to_retry(
    gateway: Running, monkeypatch: pytest.MonkeyPatch, slow_steps: None
) -> None:
    """A request that got no answer while the bus connection dropped (a nats-server restart) is a 503
    ``bus_unavailable`` with ``Retry-After``: its answer may have been sent into the outage, and a 504 ``timeout``
    would blame the generators and give the client no hint that a retry will do."""
    app = gateway.gateway.gateway
    assert app is not None
    monkeypatch.setattr(app, "config", app.config.model_copy(update={"request_timeout_s": 0.5}))
    monkeypatch.setattr(ServeCall, "bus_was_away", lambda self: True)  # the connection dropped while it waited
    before = gateway.stored("traffic")
    response = post(gateway, "/v1/completions", json=LONG)
    assert response.status_code == 503, response.text
    assert error_of(response)["code"] == "bus_unavailable" and response.headers["retry-after"]
    assert gateway.stored("traffic") == before
    wait_until(lambda: app.metrics.in_flight == 0 and app.client.pending == 0, "the gateway to let go")


def test_a_stream_whose_generation_fails_ends_with_an_error_event(gateway: Running) -> None:
    """A generation that fails after its first tokens were streamed can no longer change the 200 already sent: the
    stream's last event is an OpenAI-shaped error (the official client raises it), not a stream cut off mid-way or
    ended as if complete, and the partial answer is not recorded as served traffic."""
    engine = gateway.generator.engine
    assert engine is not None
    steps: list[int] = []

    async def breaks_on_the_fourth_step(_: int) -> None:
        steps.append(1)
        if len(steps) == 4:
            raise RuntimeError("device lost")

    before = gateway.stored("traffic")
    engine.step_hook = breaks_on_the_fourth_step  # type: ignore[attr-defined]
    try:
        response = post(gateway, "/v1/completions", json={**LONG, "stream": True})
    finally:
        engine.step_hook = None  # type: ignore[attr-defined]
    assert response.status_code == 200
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert len(events) >= 2, response.text  # tokens streamed before the failure
    last = orjson.loads(events[-1])
    assert set(last) == {"error"} and last["error"]["code"] == "generation_failed", events[-1]
    assert all("error" not in orjson.loads(event) for event in events[:-1]) and "[DONE]" not in events
    assert gateway.stored("traffic") == before
