"""Shared machinery of the builtin generators: option parsing, held-out rejection, the held-out list.

Contract:
- A builtin is a `TaskGenerator`: `draw(rng)` returns one task's content (key, prompt, reference, verifier
  fields), deterministically from `rng`. It knows nothing about held-out tasks.
- `BuiltinSource` wraps a generator into a `DomainSource`: `sample(rng)` redraws until the key is outside
  the held-out bucket (`heldout_bucket(key) < heldout_fraction`), so training never sees a held-out task;
  `heldout()` is a fixed list of `heldout` (a count) distinct held-out tasks drawn from an RNG seeded by the
  generator's name and options only (not by any run seed), so every run evaluates on the same tasks and the
  list for n is a prefix of the list for any larger n.
- With a held-out *file* instead of a count, `heldout()` is that file's tasks and training also rejects
  tasks whose key or prompt appears in it.
- Options come from a mapping (strings are coerced, so `builtin:arithmetic?digits=3` works); unknown names,
  wrong types and out-of-range values raise `SourceError` naming the option and what was expected.

Non-goals: enumerating a task space exhaustively; if the held-out bucket of a small task space cannot yield
`heldout` distinct tasks (it stops after a long run of draws brings nothing new), construction fails with a message
saying how many it found.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from actors.domains._task import SourceError, Task, heldout_bucket, task_id

__all__ = ["BuiltinSource", "Draw", "TaskGenerator", "parse_options"]

DEFAULT_HELDOUT_FRACTION = 0.1
_MAX_REDRAWS = 10_000


@dataclasses.dataclass(frozen=True)
class Draw:
    key: str
    prompt: str
    reference: str
    verifier_fields: Mapping[str, Any]


class TaskGenerator(Protocol):
    name: ClassVar[str]  # "arithmetic" → source string "builtin:arithmetic"

    def draw(self, rng: random.Random) -> Draw: ...

    def describe(self) -> str:
        """Options as a canonical string (seeds the held-out RNG)."""
        ...


OptionsT = TypeVar("OptionsT")


def parse_options(source: str, cls: type[OptionsT], options: Mapping[str, Any]) -> OptionsT:
    """Build the frozen options dataclass `cls` from `options`, coercing strings to the field's type."""
    assert dataclasses.is_dataclass(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for name, raw in options.items():
        if name not in known:
            allowed = ", ".join(sorted(known)) or "none"
            raise SourceError(f"{source}: unknown option {name!r}; expected one of: {allowed}", option=name)
        kind = type(known[name].default)
        values[name] = _coerce(source, name, raw, kind)
    return cls(**values)


def _coerce(source: str, name: str, raw: Any, kind: type) -> Any:
    expected = {int: "an integer", float: "a number", str: "a string"}.get(kind, kind.__name__)
    if kind is int and isinstance(raw, str):
        try:
            return int(raw)
        except ValueError:
            pass
    elif kind is float and isinstance(raw, str):
        try:
            return float(raw)
        except ValueError:
            pass
    elif kind is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    elif isinstance(raw, kind) and not isinstance(raw, bool):
        return raw
    raise SourceError(f"{source}: option {name!r}: expected {expected}, got {raw!r}", option=name)


def check_range(source: str, name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise SourceError(f"{source}: option {name!r}: expected a value in [{low}, {high}], got {value!r}", option=name)


class BuiltinSource:
    """A `DomainSource` over a builtin generator with a hash-partitioned held-out split."""

    def __init__(
        self,
        domain: str,
        generator: TaskGenerator,
        *,
        heldout: int | Sequence[Task],
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    ) -> None:
        source = f"builtin:{generator.name}"
        if not 0.0 < heldout_fraction < 1.0:
            raise SourceError(
                f"{source}: option 'heldout_fraction': expected a value in (0, 1), got {heldout_fraction!r}",
                option="heldout_fraction",
            )
        self.domain = domain
        self.source = source
        self.generator = generator
        self.heldout_fraction = heldout_fraction
        if isinstance(heldout, int):
            if heldout < 0:
                raise SourceError(f"{source}: held-out size: expected an integer >= 0, got {heldout}", key="heldout")
            self._heldout = self._build_heldout(heldout)
            self._excluded: frozenset[str] = frozenset()
        else:
            # A user-supplied held-out file: also keep its tasks (by key or prompt) out of training.
            self._heldout = tuple(heldout)
            self._excluded = frozenset(t.key for t in heldout) | frozenset(t.prompt for t in heldout)

    def is_heldout(self, task: Task) -> bool:
        return self._held(task.key, task.prompt)

    def _held(self, key: str, prompt: str) -> bool:
        return heldout_bucket(key) < self.heldout_fraction or key in self._excluded or prompt in self._excluded

    def sample(self, rng: random.Random) -> Task:
        for _ in range(_MAX_REDRAWS):
            draw = self.generator.draw(rng)
            if not self._held(draw.key, draw.prompt):
                return self._task(draw)
        raise SourceError(f"{self.source}: no training task found in {_MAX_REDRAWS} draws; lower heldout_fraction")

    def heldout(self) -> list[Task]:
        return list(self._heldout)

    def find(self, prompt: str) -> Task | None:
        """The task whose prompt is ``prompt``, rebuilt from the text by the generator's ``parse`` (None when the
        generator has none or the text is not one of its prompts)."""
        parse = getattr(self.generator, "parse", None)
        draw = parse(prompt) if parse is not None else None
        return self._task(draw) if draw is not None else None

    def _task(self, draw: Draw) -> Task:
        return Task(
            id=task_id(self.domain, draw.key),
            domain=self.domain,
            prompt=draw.prompt,
            reference=draw.reference,
            verifier_fields=draw.verifier_fields,
            key=draw.key,
        )

    def _build_heldout(self, n: int) -> tuple[Task, ...]:
        rng = random.Random(f"flywheel/heldout/{self.generator.name}/{self.generator.describe()}")
        found: dict[str, Task] = {}
        # Give up once a long run of draws brings no new held-out key: the space is (nearly) exhausted.
        patience = max(5_000, int(200 / self.heldout_fraction))
        since_new = 0
        while len(found) < n and since_new < patience:
            draw = self.generator.draw(rng)
            since_new += 1
            if draw.key not in found and heldout_bucket(draw.key) < self.heldout_fraction:
                found[draw.key] = self._task(draw)
                since_new = 0
        if len(found) < n:
            raise SourceError(
                f"{self.source}: asked for {n} held-out tasks but only {len(found)} distinct ones exist at "
                f"these options ({self.generator.describe()}, heldout_fraction={self.heldout_fraction}); "
                "lower the domain's `heldout` or widen the options",
                key="heldout",
            )
        return tuple(found.values())
