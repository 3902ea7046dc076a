"""`jsonl:<path>` — users' own tasks, one JSON object per line.

Row schema (unknown keys are errors, so typos never pass silently):
    {"prompt": str (non-empty, required),
     "id": str (optional; the task key, unique within the file; defaults to the prompt text),
     "reference": str (optional; a correct completion, used by the supervised warm start),
     "verifier_fields": object (optional, default {}; e.g. {"answer": "42"} for the math verifier),
     "answer": str | number (optional shorthand for the common `{"prompt", "answer"}` files: it is the
               reference when none is given, and `verifier_fields.answer`; giving both an "answer" and a
               different `verifier_fields.answer` is an error)}
Blank lines and lines starting with `#` are skipped. A bad file raises one `SourceError`: its first bad row's
`file:line` and what was expected, then how many more rows are bad and their lines (so one validate lists them all,
not one per run); duplicate keys are errors.

Held-out split: an integer `heldout` n holds out the n rows with the smallest `heldout_bucket(key)`
(deterministic, independent of row order and seed); `jsonl:<path>` holds out every row of that file and
removes rows with the same key or prompt from training. Training samples uniformly among the rest.

`find(prompt)` returns the row with exactly that prompt (training or held-out): how served traffic that asked a
file's prompt gets the row's verifier fields back (replay, the gate, the joiner).

Non-goals: streaming files that do not fit in memory; per-row weights.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from actors.domains._task import SourceError, Task, heldout_bucket, task_id

__all__ = ["JsonlSource", "read_jsonl_tasks", "read_numbered_tasks"]

_ALLOWED = ("id", "prompt", "reference", "verifier_fields", "answer")
_LISTED_BAD_LINES = 6  # a file's first bad row is explained; the lines of the next ones (up to this many) are listed


def read_jsonl_tasks(path: Path, domain: str, *, key: str = "source") -> list[Task]:
    """Parse and validate every row of `path` into Tasks of `domain` (`key`: the spec key naming the file)."""
    return [task for _, task in read_numbered_tasks(path, domain, key=key)]


def read_numbered_tasks(path: Path, domain: str, *, key: str = "source") -> list[tuple[int, Task]]:
    """`read_jsonl_tasks`, each task with its line number in the file (for messages that point at its row)."""
    try:
        return _read_jsonl_tasks(path, domain)
    except SourceError as err:
        raise SourceError(str(err), key=key) from None


def _read_jsonl_tasks(path: Path, domain: str) -> list[tuple[int, Task]]:
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        raise SourceError(f"{path}: file not found (jsonl task source)") from None
    except OSError as err:
        raise SourceError(f"{path}: cannot read: {err.strerror}") from None
    tasks: list[tuple[int, Task]] = []
    seen: dict[str, int] = {}
    first: SourceError | None = None  # the first bad row's error; the lines of the others are listed after it
    bad: list[int] = []
    for number, raw in enumerate(lines, start=1):
        where = f"{path}:{number}"
        text = raw.strip()
        if not text or text.startswith(b"#"):
            continue
        try:
            try:
                row = orjson.loads(text)
            except orjson.JSONDecodeError as err:
                raise SourceError(f"{where}: expected one JSON object per line: {err}") from None
            task = _row_task(row, where, domain)
            if task.key in seen:
                raise SourceError(f"{where}: duplicate task key {task.key!r} (first on line {seen[task.key]})")
        except SourceError as err:
            first = first or err
            bad.append(number)
            continue
        seen[task.key] = number
        tasks.append((number, task))
    if first is not None:
        if len(bad) > 1:
            more = ", ".join(map(str, bad[1:_LISTED_BAD_LINES])) + (", …" if len(bad) > _LISTED_BAD_LINES else "")
            rows = "row: line" if len(bad) == 2 else "rows: lines"
            raise SourceError(f"{first} ({len(bad) - 1} more bad {rows} {more})")
        raise first
    return tasks


def _row_task(row: Any, where: str, domain: str) -> Task:
    if not isinstance(row, dict):
        raise SourceError(f'{where}: expected a JSON object with a "prompt", got {type(row).__name__}')
    unknown = sorted(set(row) - set(_ALLOWED))
    if unknown:
        raise SourceError(
            f"{where}: unknown key {unknown[0]!r}; expected only {', '.join(_ALLOWED)} "
            '(verifier inputs go under "verifier_fields", e.g. {"verifier_fields": {"answer": "42"}})'
        )
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise SourceError(f'{where}: "prompt": expected a non-empty string, got {prompt!r}')
    key = row.get("id", prompt)
    if not isinstance(key, str) or not key:
        raise SourceError(f'{where}: "id": expected a non-empty string, got {key!r}')
    reference = row.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise SourceError(f'{where}: "reference": expected a string, got {reference!r}')
    fields = row.get("verifier_fields", {})
    if not isinstance(fields, dict):
        raise SourceError(f'{where}: "verifier_fields": expected a JSON object, got {fields!r}')
    if "answer" in row:
        answer = row["answer"]
        if isinstance(answer, bool) or not isinstance(answer, str | int | float) or answer == "":
            raise SourceError(f'{where}: "answer": expected a non-empty string or a number, got {answer!r}')
        answer = str(answer)
        if "answer" in fields and str(fields["answer"]) != answer:
            raise SourceError(
                f'{where}: "answer" {answer!r} disagrees with verifier_fields.answer '
                f"{fields['answer']!r}; give one of them"
            )
        fields = {**fields, "answer": answer}
        reference = answer if reference is None else reference
    return Task(
        id=task_id(domain, key), domain=domain, prompt=prompt, reference=reference, verifier_fields=fields, key=key
    )


class JsonlSource:
    """A `DomainSource` over a JSONL file, with an integer or file held-out split."""

    def __init__(self, domain: str, path: Path, *, heldout: int | Path, options: Mapping[str, Any]) -> None:
        self.domain = domain
        self.source = f"jsonl:{path}"
        if options:
            raise SourceError(
                f"{self.source}: jsonl sources take no options, got {', '.join(sorted(options))}", key="source_options"
            )
        tasks = read_jsonl_tasks(path, domain)
        if isinstance(heldout, Path):
            held = read_jsonl_tasks(heldout, domain, key="heldout")
            keys = {t.key for t in held} | {t.prompt for t in held}
            train = [t for t in tasks if t.key not in keys and t.prompt not in keys]
        else:
            if heldout < 0:
                raise SourceError(
                    f"{self.source}: held-out size: expected an integer >= 0, got {heldout}", key="heldout"
                )
            if heldout >= len(tasks):
                raise SourceError(
                    f"{self.source}: held-out size {heldout} leaves no training tasks ({len(tasks)} rows); "
                    "lower the domain's `heldout`",
                    key="heldout",
                )
            ranked = sorted(tasks, key=lambda t: heldout_bucket(t.key))
            held = ranked[:heldout]
            held_keys = {t.key for t in held}
            train = [t for t in tasks if t.key not in held_keys]
        if not train:
            raise SourceError(f"{self.source}: no training tasks left after removing the held-out ones")
        self._train = train
        self._heldout = held
        self._heldout_keys = frozenset(t.key for t in held) | frozenset(t.prompt for t in held)
        self._by_prompt = {t.prompt: t for t in [*tasks, *held]}

    def is_heldout(self, task: Task) -> bool:
        return task.key in self._heldout_keys or task.prompt in self._heldout_keys

    def sample(self, rng: random.Random) -> Task:
        return rng.choice(self._train)

    def heldout(self) -> list[Task]:
        return list(self._heldout)

    def find(self, prompt: str) -> Task | None:
        """The row (training or held-out) whose prompt is exactly ``prompt``."""
        return self._by_prompt.get(prompt)

    def __len__(self) -> int:
        return len(self._train)
