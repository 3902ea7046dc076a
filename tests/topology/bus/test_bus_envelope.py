from __future__ import annotations

import orjson
import pytest

from topology.bus import Envelope, EnvelopeError, decode, encode


def test_roundtrip_keeps_every_field() -> None:
    env = Envelope.new("prompt", {"text": "2+2", "nested": {"xs": [1, 2.5, None]}}, source="gen/0")
    assert decode(encode(env)) == env


def test_explicit_id_is_kept() -> None:
    assert decode(encode(Envelope.new("t", {}, id="abc"))).id == "abc"


def test_unserialisable_payload_is_an_envelope_error() -> None:
    with pytest.raises(EnvelopeError, match="JSON-serialisable"):
        encode(Envelope.new("t", {"x": object()}))


GOOD = {"id": "a", "type": "t", "v": 1, "ts": 1.0, "source": "s", "payload": {}}


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\x00", "not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (orjson.dumps({k: v for k, v in GOOD.items() if k != "payload"}), "missing field(s): payload"),
        (orjson.dumps({**GOOD, "id": ""}), "'id' must be a non-empty string"),
        (orjson.dumps({**GOOD, "v": "1"}), "'v' must be an integer"),
        (orjson.dumps({**GOOD, "v": True}), "'v' must be an integer"),
        (orjson.dumps({**GOOD, "v": 2}), "envelope version 2 is not 1"),
        (orjson.dumps({**GOOD, "v": 0}), "envelope version 0 is not 1"),
        (orjson.dumps({**GOOD, "ts": "now"}), "'ts' must be a number"),
        (orjson.dumps({**GOOD, "source": 3}), "'source' must be a string"),
        (orjson.dumps({**GOOD, "payload": [1]}), "'payload' must be an object"),
    ],
)
def test_decode_errors_name_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(EnvelopeError) as info:
        decode(data)
    assert reason in info.value.reason
