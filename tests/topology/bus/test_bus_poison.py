"""Poison messages (fuzzed) land in the dead-letter channel with a reason; the consumer keeps going."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import orjson
import pydantic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topology import BusSpec
from topology.bus import DEADLETTER, Bus, EmbeddedNats


class Prompt(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    text: str
    n: int


GOOD = {"id": "x", "type": "prompt", "v": 1, "ts": 1.0, "source": "fuzz", "payload": {"text": "a", "n": 1}}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
arbitrary_bytes = st.binary(max_size=300).filter(lambda b: not b.strip().startswith(b"{"))
not_an_object = json_values.filter(lambda v: not isinstance(v, dict)).map(orjson.dumps)
missing_field = st.sampled_from(sorted(GOOD)).map(lambda k: orjson.dumps({f: v for f, v in GOOD.items() if f != k}))
wrong_type = (
    st.tuples(
        st.sampled_from(["id", "type", "v", "ts", "source", "payload"]),
        st.sampled_from([None, [], "", "s", 1.5, {"a": 1}]),
    )
    .filter(
        lambda kv: (
            not (kv[0] in ("type", "source") and kv[1] in ("", "s"))
            and not (kv[0] == "id" and kv[1] == "s")
            and not (kv[0] == "ts" and kv[1] == 1.5)
            and not (kv[0] == "payload" and isinstance(kv[1], dict))
        )
    )
    .map(lambda kv: orjson.dumps({**GOOD, kv[0]: kv[1]}))
)


def _fails_model(payload: dict[str, Any]) -> bool:
    try:
        Prompt.model_validate(payload)
    except pydantic.ValidationError:
        return True
    return False


bad_payload = (
    st.dictionaries(st.sampled_from(["text", "n", "extra"]), json_values, max_size=3)
    .filter(_fails_model)
    .map(lambda p: orjson.dumps({**GOOD, "payload": p}))
)
unknown_version = st.integers(-(10**6), 10**6).filter(lambda v: v != 1).map(lambda v: orjson.dumps({**GOOD, "v": v}))
poison = st.one_of(arbitrary_bytes, not_an_object, missing_field, wrong_type, bad_payload, unknown_version)


async def _run(url: str, poisons: list[bytes]) -> None:
    topology = f"t-{uuid.uuid4().hex[:10]}"
    async with await Bus.connect(url, topology=topology, name="fuzz", settings=BusSpec(ack_wait_s=5)) as bus:
        js = bus.nc.jetstream()
        await bus.ensure_channel("prompts")
        for data in poisons:
            await js.publish(bus.subject("prompts"), data)
        good_id = await bus.publish("prompts", "prompt", {"text": "ok", "n": 2})
        async with bus.consume("prompts", "gen", model=Prompt) as consumer:
            delivery = await asyncio.wait_for(consumer.__anext__(), 10)
            await delivery.ack()
        assert delivery.id == good_id and delivery.payload == Prompt(text="ok", n=2)
        assert bus.stats.dead_lettered == len(poisons)
        letters = []
        async with bus.consume(DEADLETTER, "inspect") as dlq:
            for _ in poisons:
                letter = await asyncio.wait_for(dlq.__anext__(), 10)
                await letter.ack()
                letters.append(letter.payload)
        assert [letter["raw"] for letter in letters] == [
            data.decode("utf-8", errors="backslashreplace")[:4096] for data in poisons
        ]
        for letter in letters:
            assert letter["channel"] == "prompts" and letter["group"] == "gen"
            assert letter["reason"].startswith(("undecodable envelope", "payload failed Prompt validation"))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(poisons=st.lists(poison, min_size=1, max_size=4))
def test_poison_goes_to_dead_letter_and_consumer_survives(embedded_nats: EmbeddedNats, poisons: list[bytes]) -> None:
    asyncio.run(_run(embedded_nats.url, poisons))
