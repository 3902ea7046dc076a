"""Rejected requests get OpenAI-shaped 4xx errors and are never recorded; feedback needs a key and is
accepted before and long after its request; saturation answers 429 with Retry-After."""

from __future__ import annotations

import concurrent.futures
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.commands._review import review_samples
from actors.gateway import GatewayConfig, read_api_keys
from tests.actors.gateway.conftest import API_KEY, Running
from tests.actors.recorder._support import traffic

pytestmark = pytest.mark.timeout(60)
CHAT = {"model": "flywheel", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def post(running: Running, path: str, *, key: str | None = None, **kwargs: object) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(running.url + path, headers=headers, timeout=20, **kwargs)  # type: ignore[arg-type]


def error_of(response: httpx.Response) -> dict[str, object]:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert response.headers["x-request-id"].startswith("fw-")
    return dict(error)


@pytest.mark.parametrize(
    ("body", "status", "fragment", "param"),
    [
        (b'{"model": "flywheel", "messages": [', 400, "not valid JSON", None),
        (b'["not", "an", "object"]', 400, "body", None),
        (b'{"model": "flywheel"}', 400, "messages", "messages"),
        (b'{"model": "flywheel", "messages": [{"role": "wizard", "content": "x"}]}', 400, "role", "messages.0.role"),
        (
            b'{"model": "flywheel", "messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}]}',
            400,
            "a text part needs its text as a string",
            "messages.0.content.0.text",
        ),
        (
            b'{"model": "flywheel", "messages": [{"role": "user", "content": "x"}], "temperature": -1}',
            400,
            "temperature",
            "temperature",
        ),
        (b'{"model": "flywheel", "messages": [{"role": "user", "content": "x"}], "n": 3}', 400, "n: only n=1", "n"),
        (
            b'{"model": "flywheel", "messages": [{"role": "user", "content": "x"}], "logprobs": true}',
            400,
            "logprobs: this gateway does not return logprobs; got true",
            "logprobs",
        ),
        (
            b'{"model": "flywheel", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
            400,
            "tools: this gateway does not call tools",
            "tools",
        ),
        (
            b'{"model": "flywheel", "messages": [{"role": "user", "content": "x"}], "frequency_penalty": 0.5}',
            400,
            "frequency_penalty: this gateway does not apply penalties; got 0.5",
            "frequency_penalty",
        ),
        (
            b'{"model": "flywheel", "messages": [{"role": "user", "content": "x"}], '
            b'"response_format": {"type": "json_object"}}',
            400,
            "response_format",
            "response_format",
        ),
        (
            b'{"model": "flywheel", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1000}',
            400,
            "limit of 64",
            "max_tokens",
        ),
        (
            b'{"model": "flywheel", "messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}',
            413,
            "over the limit",
            None,
        ),
    ],
)
def test_bad_requests_are_4xx_and_not_recorded(
    gateway: Running, body: bytes, status: int, fragment: str, param: str | None
) -> None:
    before = gateway.stored("traffic")
    response = post(gateway, "/v1/chat/completions", content=body)
    assert response.status_code == status, response.text
    error = error_of(response)
    assert fragment in str(error["message"]) and "Value error" not in str(error["message"])
    assert error["param"] == param  # the field at fault, as OpenAI's errors name it
    assert gateway.stored("traffic") == before


def test_parameters_it_cannot_honour_pass_when_they_ask_for_nothing(gateway: Running) -> None:
    """Clients send ``logprobs: false``, zero penalties and a text ``response_format`` by habit: those are no requests
    for what the gateway lacks (only a value that asks for it is a 400, above); a completions ``logprobs: 0`` asks for
    the chosen tokens' logprobs."""
    habits = {"logprobs": False, "frequency_penalty": 0, "presence_penalty": 0.0, "response_format": {"type": "text"}}
    messages = [{"role": "user", "content": "2+2?"}]
    chat = post(gateway, "/v1/chat/completions", json={"model": "flywheel", "messages": messages, **habits})
    assert chat.status_code == 200, chat.text
    completion = {"model": "flywheel", "prompt": "2+2=", "max_tokens": 2, "best_of": 1, "echo": False}
    assert post(gateway, "/v1/completions", json=completion).status_code == 200
    asked = post(gateway, "/v1/completions", json={**completion, "logprobs": 0})
    assert asked.status_code == 400 and "logprobs" in str(error_of(asked)["message"])


def test_chunked_oversized_body_is_413(gateway: Running) -> None:
    def chunks():  # no Content-Length: the limit is enforced while reading
        yield b'{"model": "flywheel", "prompt": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    before = gateway.stored("traffic")
    response = post(gateway, "/v1/completions", content=chunks())
    assert response.status_code == 413
    assert gateway.stored("traffic") == before


def test_prompt_longer_than_the_context_is_400(gateway: Running) -> None:
    before = gateway.stored("traffic")
    response = post(gateway, "/v1/completions", json={"model": "flywheel", "prompt": "z" * 3000, "max_tokens": 2})
    assert response.status_code == 400
    error = error_of(response)
    assert "context" in str(error["message"]) and error["param"] == "prompt"  # the field at fault, as OpenAI's
    chat = {**CHAT, "messages": [{"role": "user", "content": "z" * 3000}]}
    response = post(gateway, "/v1/chat/completions", json=chat)
    assert response.status_code == 400 and error_of(response)["param"] == "messages"
    assert gateway.stored("traffic") == before


def test_feedback_needs_a_valid_key(gateway: Running) -> None:
    before = gateway.stored("feedback")
    body = {"request_id": "fw-whatever", "label": "good"}
    missing = post(gateway, "/v1/feedback", json=body)
    assert missing.status_code == 401 and error_of(missing)["code"] == "missing_api_key"
    wrong = post(gateway, "/v1/feedback", json=body, key="not-the-key")
    assert wrong.status_code == 401 and error_of(wrong)["code"] == "invalid_api_key"  # OpenAI's status for it
    assert wrong.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    for bad, param in (
        ({"request_id": "r", "label": "meh"}, "label"),
        ({"request_id": "r", "score": 7}, "score"),
        ({"request_id": "r", "score": -1}, "score"),
        ({"request_id": "r", "score": "1"}, "score"),  # a union field: named as sent, not "score.float"
        ({"request_id": "r"}, "score"),
        ({"request_id": "r", "score": True}, "score"),  # not a score: pydantic alone would store 1.0
        ({"request_id": "r", "score": 1, "label": "bad"}, "label"),  # which one?
        ({"score": 1}, "request_id"),
    ):
        response = post(gateway, "/v1/feedback", json=bad, key=API_KEY)
        assert response.status_code == 400, bad
        error = error_of(response)
        assert (error["param"], error["code"]) == (param, "invalid_value"), bad  # the field at fault, as OpenAI's
    assert gateway.stored("feedback") == before


def test_a_union_fields_error_names_the_field_as_sent(gateway: Running) -> None:
    response = post(gateway, "/v1/completions", json={"model": "flywheel", "prompt": [1, 2, 3]})
    assert response.status_code == 400
    error = error_of(response)
    assert error["param"] == "prompt" and str(error["message"]).startswith("prompt: "), error


def test_feedback_before_and_after_its_request(gateway: Running) -> None:
    early = post(
        gateway,
        "/v1/feedback",
        key=API_KEY,
        json={"request_id": "fw-not-served-yet", "score": 0.25, "comment": "arrived first"},
    )
    assert early.status_code == 200 and early.json()["status"] == "accepted"
    served = post(gateway, "/v1/chat/completions", json=CHAT)
    request_id = served.json()["id"]
    for _ in range(3):  # more traffic in between: the request is old news by the time feedback comes
        post(gateway, "/v1/completions", json={"model": "flywheel", "prompt": "a", "max_tokens": 2})
    late = {"request_id": request_id, "label": "thumbs_down", "comment": "wrong"}
    first = post(gateway, "/v1/feedback", json=late, key=API_KEY)
    retry = post(gateway, "/v1/feedback", json=late, key=API_KEY)  # a client retry: same id, stored once
    assert first.status_code == retry.status_code == 200 and first.json()["id"] == retry.json()["id"]
    messages = {payload.request_id: payload for _, payload in gateway.read("feedback", gateway.stored("feedback"))}
    assert messages["fw-not-served-yet"].score == 0.25 and messages["fw-not-served-yet"].comment == "arrived first"
    assert messages[request_id].score == 0.0 and messages[request_id].label == "thumbs_down"
    assert messages[request_id].key_id and API_KEY not in messages[request_id].key_id
    assert sum(1 for _, p in gateway.read("feedback", gateway.stored("feedback")) if p.request_id == request_id) == 1


def test_a_second_rating_of_a_request_is_answered_as_a_duplicate(gateway: Running) -> None:
    """Only a request's first rating trains (the joiner's "first applied wins"), yet a second one was answered
    ``accepted`` like the first: the client could not tell it would not count. It is stored all the same (a second
    opinion is worth keeping), and answered ``duplicate``; the first rating sent again (a retry) answers as before."""
    request_id = post(gateway, "/v1/chat/completions", json=CHAT).json()["id"]
    first = {"request_id": request_id, "label": "good"}
    answers = [post(gateway, "/v1/feedback", json=body, key=API_KEY) for body in (first, first)]
    assert [(a.status_code, a.json()["status"]) for a in answers] == [(200, "accepted"), (200, "accepted")]
    before = gateway.stored("feedback")
    second = post(gateway, "/v1/feedback", json={"request_id": request_id, "score": 0.0}, key=API_KEY)
    assert second.status_code == 200, second.text
    doc = second.json()
    assert doc["status"] == "duplicate" and doc["request_id"] == request_id and doc["score"] == 0.0
    assert "only its first rating counts" in doc["message"] and doc["id"] != answers[0].json()["id"]
    assert gateway.stored("feedback") == before + 1  # recorded, not trained on
    other = post(gateway, "/v1/feedback", json={"request_id": "fw-another", "score": 0.0}, key=API_KEY)
    assert other.json()["status"] == "accepted"  # per request


def test_a_rating_the_bus_did_not_store_is_no_first_rating(gateway: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rating that could not be stored (503) must not keep its claim on "first rating": the next rating of that
    request, the one that is stored, would be answered ``duplicate`` and never train, though no other rating of the
    request exists."""
    app = gateway.gateway.gateway
    assert app is not None
    publish = app.publish

    async def refused(channel: str, type: str, payload: dict[str, Any], id: str) -> Any:
        raise RuntimeError("the bus is away")

    monkeypatch.setattr(app, "publish", refused)
    request_id = "fw-rated-during-an-outage"
    failed = post(gateway, "/v1/feedback", json={"request_id": request_id, "label": "good"}, key=API_KEY)
    assert failed.status_code == 503 and error_of(failed)["code"] == "unavailable" and failed.headers["retry-after"]
    monkeypatch.setattr(app, "publish", publish)
    stored = post(
        gateway, "/v1/feedback", json={"request_id": request_id, "score": 0.0, "comment": "on 2nd thought"}, key=API_KEY
    )
    assert stored.status_code == 200 and stored.json()["status"] == "accepted", stored.text


def test_a_label_given_in_review_is_a_first_rating(gateway: Running) -> None:
    """A label given through ``flywheel review`` left no mark in the gateways' ledger of first ratings: the user's own
    rating of that request afterwards was answered ``accepted``, as if it would train, though the joiner applies only
    the first. It is answered ``duplicate`` now — even when it says what the reviewer said (it is no retry of the
    reviewer's label) — and a label of a request its user rated first is counted as ``rated``."""
    reviewed, rated_by_user = (post(gateway, "/v1/chat/completions", json=CHAT).json()["id"] for _ in range(2))
    user_first = post(gateway, "/v1/feedback", json={"request_id": rated_by_user, "label": "bad"}, key=API_KEY)
    assert user_first.json()["status"] == "accepted"
    for rid in (reviewed, rated_by_user):
        gateway.run(gateway.bus.publish("review", "review", traffic(rid), id=f"review.{rid}"))

    async def good(sample: Any, delivery: Any) -> str:
        return "good"

    counts = gateway.run(review_samples(gateway.bus, good, limit=2, wait_s=5))
    assert (counts["good"], counts["rated"]) == (2, 1)
    later = post(gateway, "/v1/feedback", json={"request_id": reviewed, "label": "good"}, key=API_KEY)
    assert later.status_code == 200 and later.json()["status"] == "duplicate", later.text


def test_saturation_answers_429_with_retry_after(gateway: Running) -> None:
    engine, app = gateway.generator.engine, gateway.gateway.gateway
    assert engine is not None and app is not None

    def wait_in_flight(count: int) -> None:
        for _ in range(250):
            if app.metrics.in_flight == count:
                return
            time.sleep(0.02)
        raise AssertionError(f"in flight: {app.metrics.in_flight}, expected {count}")

    stream_body = {"model": "flywheel", "prompt": "s", "max_tokens": 2, "stream": True}
    gateway.run(engine.pause())  # every accepted request now waits: the gateway fills up
    before = gateway.stored("traffic")
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            streams = [pool.submit(post, gateway, "/v1/completions", json=stream_body) for _ in range(3)]
            wait_in_flight(3)
            over_streams = post(gateway, "/v1/completions", json=stream_body)
            assert over_streams.status_code == 429 and "max_streams" in str(error_of(over_streams)["message"])
            waiting = [pool.submit(post, gateway, "/v1/chat/completions", json=CHAT) for _ in range(3)]
            wait_in_flight(6)
            over = post(gateway, "/v1/chat/completions", json=CHAT)
            assert over.status_code == 429 and "max_concurrency" in str(error_of(over)["message"])
            assert over.headers["retry-after"] == "1" and error_of(over)["type"] == "rate_limit_error"
            assert gateway.stored("traffic") == before
            gateway.run(engine.resume())
            assert all(f.result().status_code == 200 for f in (*streams, *waiting))
    finally:
        gateway.run(engine.resume())
    assert gateway.stored("traffic") == before + 6  # recorded before each response completed


def test_metrics_and_healthz(gateway: Running) -> None:
    post(gateway, "/v1/chat/completions", json=CHAT)
    health = httpx.get(gateway.url + "/healthz")
    assert health.status_code == 200 and health.json()["generators"] == "available"
    scraped = httpx.get(gateway.url + "/metrics")
    assert scraped.headers["content-type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(scraped.text)
        for sample in family.samples
    }
    assert samples[("flywheel_gateway_requests_total", (("route", "chat"), ("status", "200")))] >= 1
    assert samples[("flywheel_gateway_request_seconds_count", (("route", "chat"),))] >= 1
    assert samples[("flywheel_gateway_traffic_published_total", ())] >= 1
    assert samples[("flywheel_gateway_streams_open", ())] == 0
    for name in ("client_disconnects_total", "internal_errors_total", "traffic_publish_errors_total"):
        assert ("flywheel_gateway_" + name, ()) in samples


def test_api_keys_come_from_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "keys").write_text("# comment\nfile-key\n\n")
    monkeypatch.setenv("MY_KEYS", "env-a, env-b,")
    config = GatewayConfig(api_keys_env="MY_KEYS", api_keys_file="keys")
    assert read_api_keys(config, tmp_path) == ["env-a", "env-b", "file-key"]
    with pytest.raises(ValueError, match="api_keys_file: cannot read"):
        read_api_keys(GatewayConfig(api_keys_file="missing"), tmp_path)
    assert "FLYWHEEL_API_KEYS" not in os.environ or read_api_keys(GatewayConfig(), tmp_path)
