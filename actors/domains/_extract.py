"""`builtin:extract` — pull named fields out of a short record into compact JSON.

Prompt: `name=Ada;age=36;city=Rome?age,city`; reference `{"age":36,"city":"Rome"}`.
The record has `fields` distinct fields (in random order) from a fixed pool (name, age, city, pet); the
question asks for 1..`ask` of them (in random order). Ages are JSON integers, everything else strings.
Verifier fields (for the `json-fields` verifier): `{"fields": {"age": 36, "city": "Rome"}}` — the expected
value of every requested key. Key: the prompt text. Bounds: prompts ≤ 40 characters, answers ≤ 40.

`parse(prompt)` rebuilds the task of any such prompt, so served traffic that asked one can be scored.

Non-goals: nested JSON, free-form prose, missing-field questions.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, ClassVar

from actors.domains._builtin import Draw, check_range

__all__ = ["ExtractGenerator", "ExtractOptions"]

_VALUES: dict[str, tuple[Any, ...]] = {
    "name": ("Ada", "Bob", "Cy", "Dan", "Eve", "Fay", "Gus", "Ivy", "Jo", "Kim", "Lea", "Max", "Ned", "Ola"),
    "age": tuple(range(18, 90)),
    "city": ("Rome", "Oslo", "Lima", "Pune", "Kyiv", "Baku", "Riga", "Doha", "Nice", "Bern", "Bonn", "Cork"),
    "pet": ("cat", "dog", "owl", "fox", "eel", "yak", "ant", "bee"),
}
_POOL = tuple(_VALUES)


@dataclass(frozen=True)
class ExtractOptions:
    fields: int = 3  # fields in the record (2–3)
    ask: int = 2  # at most this many fields are asked for (1–fields)


class ExtractGenerator:
    name: ClassVar[str] = "extract"

    def __init__(self, options: ExtractOptions) -> None:
        source = "builtin:extract"
        check_range(source, "fields", options.fields, 2, 3)
        check_range(source, "ask", options.ask, 1, options.fields)
        self.options = options

    def describe(self) -> str:
        return f"fields={self.options.fields},ask={self.options.ask}"

    def draw(self, rng: random.Random) -> Draw:
        names = rng.sample(_POOL, self.options.fields)
        record = {name: rng.choice(_VALUES[name]) for name in names}
        asked = rng.sample(names, rng.randint(1, self.options.ask))
        wanted = {name: record[name] for name in asked}
        prompt = ";".join(f"{k}={v}" for k, v in record.items()) + "?" + ",".join(asked)
        return Draw(
            key=f"extract|{prompt}",
            prompt=prompt,
            reference=json.dumps(wanted, separators=(",", ":")),
            verifier_fields={"fields": wanted},
        )

    def parse(self, prompt: str) -> Draw | None:
        """The task whose prompt is ``prompt`` (``name=Ada;age=36?age``), or None when it is not one."""
        record_text, sep, asked_text = prompt.partition("?")
        if not sep or not record_text or not asked_text:
            return None
        record: dict[str, Any] = {}
        for part in record_text.split(";"):
            name, eq, value = part.partition("=")
            if not eq or name not in _VALUES or name in record or not value:
                return None
            if name == "age":
                if not value.isdigit():
                    return None
                record[name] = int(value)
            else:
                record[name] = value
        asked = asked_text.split(",")
        if len(set(asked)) != len(asked) or any(name not in record for name in asked):
            return None
        wanted = {name: record[name] for name in asked}
        return Draw(
            key=f"extract|{prompt}",
            prompt=prompt,
            reference=json.dumps(wanted, separators=(",", ":")),
            verifier_fields={"fields": wanted},
        )
