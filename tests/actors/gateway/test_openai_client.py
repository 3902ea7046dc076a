"""The official openai client, unchanged, against the gateway; every served request lands on `traffic`."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

import httpx
import openai
import orjson
import pytest

from actors.policy import CharTokenizer, encode_prompt
from actors.protocol import TrafficMsg
from tests.actors.gateway.conftest import API_KEY, Running

pytestmark = pytest.mark.timeout(60)


def client(running: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=running.url + "/v1", api_key=API_KEY, max_retries=0)


def traffic_for(running: Running, request_id: str) -> TrafficMsg:
    found = {
        payload.request_id: (msg_id, payload) for msg_id, payload in running.read("traffic", running.stored("traffic"))
    }
    msg_id, record = found[request_id]
    assert msg_id == request_id  # stored under the request id: a re-publish dedupes
    return record


def test_models_lists_the_served_model(gateway: Running) -> None:
    assert [m.id for m in client(gateway).models.list()] == ["flywheel"]


def test_chat_completion_is_served_and_recorded(gateway: Running) -> None:
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="flywheel",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
        max_tokens=6,
        temperature=0.7,
    )
    completion = raw.parse()
    assert raw.headers["x-request-id"] == completion.id
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    record = traffic_for(gateway, completion.id)
    assert record.prompt == "system: be brief\nuser: 2+2?\nassistant: "
    assert record.prompt_ids == encode_prompt(CharTokenizer(), record.prompt)
    assert record.completion.text == choice.message.content
    assert len(record.completion.token_ids) == len(record.completion.logprobs) == len(record.completion.versions)
    assert record.completion.token_ids and set(record.completion.versions) == {0}
    assert completion.usage is not None and completion.usage.completion_tokens == len(record.completion.token_ids)
    assert record.route == "chat" and record.temperature == 0.7 and record.max_tokens == 6
    assert record.domain == "arithmetic" and record.generator == "generator/0" and not record.stream


def test_streamed_chat_matches_its_record(gateway: Running) -> None:
    stream = client(gateway).chat.completions.create(
        model="flywheel",
        messages=[{"role": "user", "content": "count: 1 2 3"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    request_id = chunks[0].id
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(reasons) == 1 and chunks[-1].usage is not None
    record = traffic_for(gateway, request_id)
    assert record.stream and record.completion.text == text
    assert chunks[-1].usage.completion_tokens == len(record.completion.token_ids)
    assert len(chunks) >= 3  # role chunk, token chunks, finish chunk: it really streamed


def test_a_stream_ends_only_once_its_record_is_stored(gateway: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request is recorded before it is acknowledged: a client that saw the finish chunk or ``[DONE]`` may rate
    the request at once (or the gateway may die next), and a record stored only after that could be missing for its
    feedback, or lost. While the traffic record's publish waits, neither the finish chunk nor ``[DONE]`` goes out."""
    app = gateway.gateway.gateway
    assert app is not None
    publish = app.publish
    recording, stored = threading.Event(), asyncio.Event()

    async def held(channel: str, type: str, payload: dict[str, Any], id: str) -> Any:
        if channel == "traffic":
            recording.set()
            await stored.wait()
        return await publish(channel, type, payload, id)

    monkeypatch.setattr(app, "publish", held)
    events: queue.Queue[bytes | None] = queue.Queue()
    body = {"model": "flywheel", "messages": [{"role": "user", "content": "count: 1 2 3"}], "stream": True}

    def read() -> None:
        headers = {"Content-Type": "application/json"}
        try:
            with httpx.stream(
                "POST", gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=20
            ) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.put(line.removeprefix("data: ").encode())
        finally:
            events.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert recording.wait(20), "the traffic record was never published"
        early: list[bytes | None] = []
        try:  # what reaches the client while the record is not stored yet: a bounded look, not a synchronisation
            for _ in iter(int, 1):
                early.append(events.get(timeout=1.0))
        except queue.Empty:
            pass
    finally:
        gateway.loop.call_soon_threadsafe(stored.set)
        reader.join(20)
    rest: list[bytes | None] = []
    for _ in iter(int, 1):
        rest.append(events.get(timeout=20))
        if rest[-1] is None:
            break

    def ends(event: bytes | None) -> bool:
        return event in (None, b"[DONE]") or orjson.loads(event)["choices"][0]["finish_reason"] is not None

    assert not any(ends(e) for e in early), early
    assert rest[-2:] == [b"[DONE]", None] and sum(ends(e) for e in rest) == 3  # the finish chunk, [DONE], the end


def test_completions_plain_and_streaming(gateway: Running) -> None:
    api = client(gateway)
    plain = api.completions.create(model="flywheel", prompt="12+7=", max_tokens=5, temperature=0)
    record = traffic_for(gateway, plain.id)
    assert record.route == "completions" and record.prompt == "12+7="
    assert plain.choices[0].text == record.completion.text and record.completion.logprobs == [0.0] * len(
        record.completion.token_ids
    )
    streamed = list(api.completions.create(model="flywheel", prompt="12+7=", max_tokens=5, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == plain.choices[0].text  # greedy: same text either way
    assert traffic_for(gateway, streamed[0].id).completion.token_ids == record.completion.token_ids


def test_a_completions_stream_with_usage_is_all_text_completion_chunks(gateway: Running) -> None:
    """The usage chunk of a /v1/completions stream is a ``text_completion`` like the others (as OpenAI sends it), not
    a chat chunk: a client that dispatches on ``object`` would take it for another API's."""
    chunks = list(
        client(gateway).completions.create(
            model="flywheel", prompt="12+7=", max_tokens=5, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert {c.object for c in chunks} == {"text_completion"}


def test_unknown_model_is_404_and_not_recorded(gateway: Running) -> None:
    before = gateway.stored("traffic")
    with pytest.raises(openai.NotFoundError) as err:
        client(gateway).chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    assert "gpt-9" in str(err.value) and err.value.param == "model"
    with pytest.raises(openai.BadRequestError, match="max_tokens 65 is above") as too_long:
        client(gateway).completions.create(model="flywheel", prompt="x", max_tokens=65)
    assert (too_long.value.param, too_long.value.code) == ("max_tokens", "max_tokens_exceeded")
    assert gateway.stored("traffic") == before


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-abc"}},
    ],
)
def test_a_content_part_other_than_text_is_refused_by_name(gateway: Running, part: dict[str, object]) -> None:
    """The engines read text only: an image (or audio, or a file) beside the text would be left out of the prompt and
    the answer would look like one to it; the client is told which part it cannot send instead."""
    before = gateway.stored("traffic")
    content = [{"type": "text", "text": "what is in this picture?"}, part]
    with pytest.raises(openai.BadRequestError) as refused:
        client(gateway).chat.completions.create(
            model="flywheel",
            messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": content}],  # type: ignore[misc,list-item]
            max_tokens=4,
        )
    error = refused.value
    assert (error.param, error.code) == ("messages.1.content.1.type", "unsupported_value")
    assert error.body is not None and error.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert "only text content parts" in str(error.message) and str(part["type"]) in str(error.message)
    assert gateway.stored("traffic") == before


def test_text_content_parts_are_served_as_their_text(gateway: Running) -> None:
    completion = client(gateway).chat.completions.create(
        model="flywheel",
        messages=[{"role": "user", "content": [{"type": "text", "text": "2+"}, {"type": "text", "text": "2?"}]}],
        max_tokens=4,
    )
    assert traffic_for(gateway, completion.id).prompt == "user: 2+2?\nassistant: "
