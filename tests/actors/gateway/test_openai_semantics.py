"""What the OpenAI API says a request means, as the gateway serves it: the answer ends before its stop sequence (the
traffic record keeps what the tokens made), null is a field's default, types are strict, a value of any depth is
refused with a short message, the parameters this gateway cannot honour are refused by name, a chat template that
refuses the messages is the client's 400, and request_timeout_s bounds a whole answer, streamed or not."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.gateway import GatewayConfig
from actors.gateway._prompt import ChatMessage, ChatTemplateError, PromptBuilder
from actors.policy import load_tokenizer, write_tiny_hf_model
from actors.protocol import TrafficMsg
from tests.actors.gateway.conftest import Running
from tests.actors.gateway.test_hostile_clients import slow_steps, wait_until
from tests.actors.gateway.test_limits_and_feedback import CHAT, error_of, post
from tests.actors.gateway.test_openai_client import client, traffic_for

pytestmark = pytest.mark.timeout(60)
__all__ = ["slow_steps"]  # the fixture, used here by name

GREEDY = {"model": "flywheel", "prompt": "2+2=", "max_tokens": 12, "temperature": 0}


def _greedy(gateway: Running, **extra: object) -> str:
    response = post(gateway, "/v1/completions", json={**GREEDY, **extra})
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["text"])


@pytest.mark.parametrize("stream", [False, True])
def test_the_answer_ends_before_its_stop_sequence_and_the_record_keeps_it(gateway: Running, stream: bool) -> None:
    """The engine stops on a stop sequence and keeps it (its tokens made it); the OpenAI API returns the text without
    it, so the gateway cut it — in a stream too, where the sequence may arrive split over two deltas (the tiny model's
    tokens are characters, so a 2-character stop always is)."""
    whole = _greedy(gateway)
    assert len(whole) >= 6, whole
    stop = whole[3:5]
    expected = whole[: whole.find(stop)]
    answer = client(gateway).completions.create(**{**GREEDY, "stop": [stop, "never-matched"]}, stream=stream)  # type: ignore[call-overload]
    if stream:
        chunks = list(answer)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        request_id = chunks[0].id
    else:
        text, reason, request_id = answer.choices[0].text, answer.choices[0].finish_reason, answer.id
    assert (text, reason) == (expected, "stop"), (whole, stop)
    record: TrafficMsg = traffic_for(gateway, request_id)
    assert record.completion.text == expected + stop and record.completion.finish_reason == "stop"


def test_null_sampling_fields_are_their_defaults(gateway: Running) -> None:
    """The official SDK sends null for a None, and the API types these "or null": a 400 refused the SDK's own call."""
    completion = client(gateway).chat.completions.create(
        model="flywheel",
        messages=[{"role": "user", "content": "2+2?"}],
        max_tokens=4,
        temperature=None,
        top_p=None,
        n=None,
        stream=None,
    )
    assert completion.choices[0].message.role == "assistant"


@pytest.mark.parametrize(
    ("field", "value"),
    [("stream", "yes"), ("max_tokens", True), ("temperature", "0.5"), ("n", "1"), ("seed", 1.5)],
)
def test_types_are_strict(gateway: Running, field: str, value: object) -> None:
    """ "stream": "yes" streamed, "max_tokens": true asked for one token."""
    before = gateway.stored("traffic")
    response = post(gateway, "/v1/chat/completions", json={**CHAT, field: value})
    assert response.status_code == 400, response.text
    assert error_of(response)["param"] == field
    assert gateway.stored("traffic") == before


def test_a_value_nested_deeper_than_json_encoders_go_is_a_short_400(gateway: Running) -> None:
    """Echoing the value back raised in the encoder (a 500), and a large one came back whole in the message."""
    deep = '{"model":"flywheel","tools":' + "[" * 300 + "]" * 300 + ',"messages":[{"role":"user","content":"x"}]}'
    response = post(gateway, "/v1/chat/completions", content=deep)
    assert response.status_code == 400 and error_of(response)["param"] == "tools", response.text
    large = post(gateway, "/v1/chat/completions", json={**CHAT, "logit_bias": {"x" * 3000: 1}})
    assert large.status_code == 400 and error_of(large)["param"] == "logit_bias"
    assert len(str(error_of(large)["message"])) < 400


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tool_choice", "required"),
        ("function_call", {"name": "f"}),
        ("modalities", ["text", "audio"]),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("prediction", {"type": "content", "content": "x"}),
        ("top_k", 1),
        ("min_tokens", 5),
        ("ignore_eos", True),
        ("repetition_penalty", 2),
    ],
)
def test_parameters_this_gateway_cannot_honour_are_refused_by_name(gateway: Running, field: str, value: object) -> None:
    response = post(gateway, "/v1/chat/completions", json={**CHAT, field: value})
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["param"] == field and error["code"] == "unsupported_parameter"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tool_choice", "none"),
        ("tool_choice", "auto"),
        ("modalities", ["text"]),
        ("top_k", -1),
        ("repetition_penalty", 1),
    ],
)
def test_their_no_op_values_are_served(gateway: Running, field: str, value: object) -> None:
    response = post(gateway, "/v1/chat/completions", json={**CHAT, field: value})
    assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def alternating_only(tmp_path_factory: pytest.TempPathFactory) -> PromptBuilder:
    """A tiny HF model whose chat template refuses roles that do not alternate, as Mistral's and Gemma's do."""
    folder: Path = write_tiny_hf_model(tmp_path_factory.mktemp("hf") / "tiny", arch="llama", seed=1)
    config = folder / "tokenizer_config.json"
    template = (
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}{{ 'assistant: ' }}"
    )
    doc = json.loads(config.read_text())
    doc["chat_template"] = template
    config.write_text(json.dumps(doc))
    return PromptBuilder(load_tokenizer({"model": f"hf:{folder}"}))


def test_a_chat_template_that_refuses_the_messages_says_so_in_its_words(alternating_only: PromptBuilder) -> None:
    ok = [ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="yo")]
    assert alternating_only.chat_text(ok).endswith("assistant: ")
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        alternating_only.chat_text([ChatMessage(role="system", content="be brief"), *ok])


@pytest.fixture
def short_timeout(gateway: Running) -> Iterator[None]:
    app = gateway.gateway.gateway
    assert app is not None
    config = app.config
    app.config = GatewayConfig.model_validate({**config.model_dump(), "request_timeout_s": 1.0})
    try:
        yield
    finally:
        app.config = config


@pytest.mark.usefixtures("slow_steps", "short_timeout")
@pytest.mark.parametrize("stream", [False, True])
def test_request_timeout_bounds_a_whole_answer_streamed_or_not(gateway: Running, stream: bool) -> None:
    """64 steps of 50 ms: past a 1-s request_timeout_s. A stream's deltas each reset the wait, so a streamed answer
    ran as long as it kept coming while the same request unstreamed got a 504."""
    app, generator, engine = gateway.gateway.gateway, gateway.generator, gateway.generator.engine
    assert app is not None and engine is not None
    stats: Callable[[], dict[str, Any]] = engine.stats  # type: ignore[attr-defined]
    aborted, cancelled = stats()["requests_aborted"], generator.ctx.counters.get("serve_cancelled")
    before = gateway.stored("traffic")
    body = {"model": "flywheel", "prompt": "count: ", "max_tokens": 64, "temperature": 1.0, "stream": stream}
    response = post(gateway, "/v1/completions", json=body)
    if stream:
        assert response.status_code == 200
        last = [line for line in response.text.splitlines() if line.startswith("data: ")][-1]
        assert '"code":"timeout"' in last, response.text[-300:]
    else:
        assert response.status_code == 504 and error_of(response)["code"] == "timeout", response.text
    assert gateway.stored("traffic") == before
    wait_until(  # the generation was cancelled (and the next test starts with nothing in flight)
        lambda: (
            stats()["requests_aborted"] == aborted + 1
            and generator.ctx.counters.get("serve_cancelled") == cancelled + 1
        ),
        "the generation to be cancelled",
    )
    wait_until(lambda: app.metrics.in_flight == 0 and app.client.pending == 0, "the gateway to let go")
