"""The HTTP engines against a fake server that misbehaves (a fault layer in front of FakeSGLangServer / FakeVLLMServer):
a body that is not JSON, a body sent a byte at a time, a prompt the server refuses, a resume that fails."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from actors.engines import EngineHTTPError, RequestError, SGLangEngine, TorchEngine, VLLMEngine
from actors.testing import FakeSGLangServer, FakeVLLMServer
from tests.actors.engines._rig import make_engine, perturbed, request, write_dir

pytestmark = pytest.mark.timeout(60)

Fault = Callable[[], Response]


class Faults:
    """Answers the next ``n`` requests to a path with a fault instead of the fake's own answer."""

    def __init__(self) -> None:
        self.planned: dict[str, list[Fault]] = {}
        self.seen: dict[str, int] = {}

    def plan(self, path: str, fault: Fault, times: int = 1) -> None:
        self.planned.setdefault(path, []).extend([fault] * times)

    async def __call__(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.url.path
        self.seen[path] = self.seen.get(path, 0) + 1
        planned = self.planned.get(path)
        if planned:
            return planned.pop(0)()
        return await call_next(request)


def run(kind: str, scenario: Callable[[Any, Faults], Awaitable[None]], **client_options: Any) -> None:
    async def main() -> None:
        engine: TorchEngine = make_engine()
        server = (FakeSGLangServer if kind == "sglang" else FakeVLLMServer)(engine)
        faults = Faults()
        server.app.middleware("http")(faults)
        try:
            async with server:
                client = (SGLangEngine if kind == "sglang" else VLLMEngine)(server.url, **client_options)
                await client.start(health_timeout_s=10)
                try:
                    await scenario(client, faults)
                finally:
                    await client.close()
        finally:
            await engine.close()

    asyncio.run(main())


GENERATE = {"sglang": "/generate", "vllm": "/v1/completions"}
RESUME = {"sglang": "/continue_generation", "vllm": "/resume"}


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_a_body_that_is_not_json_is_an_engine_error_naming_the_server(kind: str) -> None:
    """It raised a bare JSONDecodeError: no server, no call named, and a start that met a proxy's HTML page crashed."""

    async def scenario(client: Any, faults: Faults) -> None:
        faults.plan(GENERATE[kind], lambda: Response(b'{"text": "12", "meta_info": {', media_type="application/json"))
        with pytest.raises(EngineHTTPError, match="malformed JSON body") as info:
            await client.generate([request()])
        assert client.url in str(info.value) and GENERATE[kind] in str(info.value)

    run(kind, scenario)


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_a_body_sent_a_byte_at_a_time_times_out(kind: str) -> None:
    """httpx's timeout bounds each read: a server that sent its headers and then a byte every half second held the
    prompt for ever. ``timeout_s`` now bounds the whole answer."""

    async def drip() -> AsyncIterator[bytes]:
        while True:
            yield b" "
            await asyncio.sleep(0.3)

    async def scenario(client: Any, faults: Faults) -> None:
        faults.plan(GENERATE[kind], lambda: StreamingResponse(drip(), media_type="application/json"))
        started = time.monotonic()
        with pytest.raises(EngineHTTPError, match="timed out"):
            await client.generate([request()])
        assert time.monotonic() - started < 10

    run(kind, scenario, timeout_s=1.0)


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_a_request_the_server_refuses_as_made_is_a_request_error(kind: str) -> None:
    """A 400 (a prompt longer than the server's context) went back to the bus five times and was dead-lettered as an
    error; the torch engine's RequestError makes the generator refuse it at once, counted by domain."""

    async def scenario(client: Any, faults: Faults) -> None:
        faults.plan(GENERATE[kind], lambda: Response(b'{"error": "prompt too long"}', status_code=400))
        with pytest.raises(RequestError, match="HTTP 400"):
            await client.generate([request()])
        faults.plan(GENERATE[kind], lambda: Response(b"busy", status_code=503), times=10)
        with pytest.raises(EngineHTTPError) as info:  # the server's state, not the request: not a RequestError
            await client.generate([request()])
        assert not isinstance(info.value, RequestError)

    run(kind, scenario, retries=0)


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_a_resume_that_fails_is_tried_again_at_the_next_generation(kind: str, tmp_path: Any) -> None:
    """A weight update pauses the server and resumes it; a resume that failed (every retry of it) was taken for a
    pause of the caller's own: every later update skipped the pause and the resume, and the server stayed paused —
    every generation timed out. The resume is owed now, and the next generation sends it first."""

    async def scenario(client: Any, faults: Faults) -> None:
        weights = write_dir(tmp_path / "v1", {k: v.clone() for k, v in make_engine().policy.state_dict().items()})
        faults.plan(RESUME[kind], lambda: Response(b"busy", status_code=503), times=4)  # the call and its 3 retries
        with pytest.raises(EngineHTTPError, match=RESUME[kind]):
            await client.update_weights(1, weights)
        assert faults.seen[RESUME[kind]] == 4
        [completion] = await client.generate([request()])  # resumes first, then generates
        assert faults.seen[RESUME[kind]] == 5 and len(completion.token_ids) == 12
        await client.update_weights(2, weights)  # and the next update brackets itself again
        assert faults.seen[RESUME[kind]] == 6 and client.version == 2

    run(kind, scenario, timeout_s=5.0, backoff_s=0.05)


def test_an_sglang_answer_whose_tokens_do_not_add_up_is_malformed() -> None:
    """The tokens are read from the logprob pairs: an answer with fewer pairs than ``output_ids`` (or none, beside a
    text) was taken with the tokens it had, so the verifier scored text the learner never trained on."""

    async def scenario(client: Any, faults: Faults) -> None:
        pairs = [[-0.5, 28, None], [-0.5, 27, None]]
        for body, why in [
            ({"output_ids": [28, 27, 87], "meta_info": {"output_token_logprobs": pairs}}, "3 output_ids but 2"),
            ({"meta_info": {"output_token_logprobs": pairs, "completion_tokens": 3}}, "completion_tokens 3 but 2"),
            ({"output_ids": [], "meta_info": {"output_token_logprobs": []}}, "a text without tokens"),
        ]:
            content = orjson.dumps(
                {"text": "65q", **body} | {"meta_info": {**body["meta_info"], "finish_reason": None}}
            )
            faults.plan("/generate", lambda content=content: Response(content, media_type="application/json"))
            with pytest.raises(EngineHTTPError, match=why):
                await client.generate([request()])

    run("sglang", scenario)


def test_vllm_labels_nothing_while_a_reload_that_got_no_answer_leaves_its_weights_unknown(tmp_path: Any) -> None:
    """The server loaded the new weights but its answer came after the client's time limit: the client kept the old
    version and labelled the new weights' tokens with it. Until an update succeeds, a generation now raises (no
    response: the generator waits with its prompts); then tokens carry the new version."""

    async def main() -> None:
        engine: TorchEngine = make_engine()
        server = FakeVLLMServer(engine)
        late = {"n": 1}

        async def answer_late(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            response = await call_next(request)  # the server does the work
            if request.url.path == "/collective_rpc" and late["n"]:
                late["n"] -= 1
                await asyncio.sleep(2.0)  # and its answer comes after the client gave up
            return response

        server.app.middleware("http")(answer_late)
        weights = write_dir(tmp_path / "v1", perturbed(engine))
        try:
            async with server:
                client = VLLMEngine(server.url, update_timeout_s=0.5, backoff_s=0.05)
                await client.start(health_timeout_s=10)
                try:
                    with pytest.raises(EngineHTTPError, match="collective_rpc"):
                        await client.update_weights(1, weights)
                    await asyncio.sleep(2.0)  # the server has loaded them by now
                    with pytest.raises(EngineHTTPError, match="weights it serves are unknown") as info:
                        await client.generate([request()])
                    assert info.value.status is None
                    await client.update_weights(1, weights)  # the subscriber's next try
                    [completion] = await client.generate([request()])
                    assert set(completion.versions) == {1}
                finally:
                    await client.close()
        finally:
            await engine.close()

    asyncio.run(main())
