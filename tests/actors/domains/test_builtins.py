"""Builtin generators: determinism, correct references, length bounds, option errors."""

from __future__ import annotations

import json
import random
import re

import pytest

from actors.domains import SourceError, open_source

BUILTINS = ["builtin:arithmetic", "builtin:pyexpr", "builtin:extract"]
HARDEST = [
    "builtin:arithmetic?digits=4&ops=3&operators=+-*",
    "builtin:pyexpr?terms=5",
    "builtin:extract?fields=3&ask=3",
]
# (max prompt chars, max answer chars) per builtin — what a char-level tiny model is sized for.
BOUNDS = {"arithmetic": (20, 17), "pyexpr": (40, 9), "extract": (40, 40)}


def samples(source: str, n: int, seed: int = 0) -> list:  # type: ignore[type-arg]
    src = open_source(source, domain="d", heldout=0)
    rng = random.Random(seed)
    return [src.sample(rng) for _ in range(n)]


@pytest.mark.parametrize("source", BUILTINS)
def test_same_seed_same_tasks_other_seed_other_tasks(source: str) -> None:
    assert samples(source, 50, seed=1) == samples(source, 50, seed=1)
    assert samples(source, 50, seed=1) != samples(source, 50, seed=2)


@pytest.mark.parametrize("source", BUILTINS + HARDEST)
def test_prompt_and_answer_lengths_are_bounded(source: str) -> None:
    kind = source.split(":")[1].split("?")[0]
    max_prompt, max_answer = BOUNDS[kind]
    for task in samples(source, 2000):
        assert task.reference is not None
        assert 0 < len(task.prompt) <= max_prompt, task.prompt
        assert 0 < len(task.reference) <= max_answer, task.reference


@pytest.mark.parametrize("source", ["builtin:arithmetic", HARDEST[0]])
def test_arithmetic_reference_is_the_value_of_the_expression(source: str) -> None:
    for task in samples(source, 1000):
        assert task.prompt.endswith("=")
        assert str(eval(task.prompt[:-1])) == task.reference == task.verifier_fields["answer"]


@pytest.mark.parametrize("source", ["builtin:pyexpr", HARDEST[1], "builtin:pyexpr?terms=2&operators=*"])
def test_pyexpr_reference_hits_target_and_matches_pattern(source: str) -> None:
    for task in samples(source, 1000):
        assert task.reference is not None
        target = task.verifier_fields["target"]
        pattern = task.verifier_fields["pattern"]
        assert eval(task.reference) == target
        assert re.fullmatch(pattern, task.reference)
        assert re.fullmatch(pattern, " " + task.reference.replace("+", " + ") + " ")
        assert f"-> {target} " in task.prompt
        assert not re.fullmatch(pattern, str(target)), "the bare target must not satisfy the pattern"


def test_pyexpr_pattern_rejects_other_digits_order_and_operators() -> None:
    task = samples("builtin:pyexpr?terms=3&operators=+-", 1)[0]
    pattern = task.verifier_fields["pattern"]
    digits = task.prompt.split(" -> ")[0].split()
    assert re.fullmatch(pattern, "+".join(digits))
    assert not re.fullmatch(pattern, "*".join(digits))
    assert not re.fullmatch(pattern, "+".join([*digits, "1"]))
    assert not re.fullmatch(pattern, "+".join(digits[:-1]))
    assert not re.fullmatch(pattern, "(" + "+".join(digits) + ")")


@pytest.mark.parametrize("source", ["builtin:extract", HARDEST[2], "builtin:extract?fields=2&ask=1"])
def test_extract_reference_is_json_of_the_asked_fields(source: str) -> None:
    for task in samples(source, 1000):
        assert task.reference is not None
        record_text, asked_text = task.prompt.split("?")
        record = dict(item.split("=") for item in record_text.split(";"))
        asked = asked_text.split(",")
        answer = json.loads(task.reference)
        assert list(answer) == asked
        assert answer == task.verifier_fields["fields"]
        for key, value in answer.items():
            assert str(value) == record[key]
            assert isinstance(value, int) == (key == "age")


def test_task_ids_are_stable_and_name_the_domain() -> None:
    a = open_source("builtin:arithmetic", domain="math-a", heldout=0).sample(random.Random(3))
    b = open_source("builtin:arithmetic", domain="math-a", heldout=0).sample(random.Random(3))
    c = open_source("builtin:arithmetic", domain="math-b", heldout=0).sample(random.Random(3))
    assert a.id == b.id and a.id.startswith("math-a-")
    assert c.key == a.key and c.id != a.id


@pytest.mark.parametrize(
    ("source", "options", "message"),
    [
        ("builtin:arithmetic", {"digits": 9}, "option 'digits': expected a value in [1, 4], got 9"),
        ("builtin:arithmetic", {"digit": 2}, "unknown option 'digit'; expected one of: digits, operators, ops"),
        ("builtin:arithmetic", {"ops": "two"}, "option 'ops': expected an integer, got 'two'"),
        ("builtin:arithmetic?operators=/", {}, "expected a non-empty subset of '+-*', got '/'"),
        ("builtin:arithmetic?digits=2", {"digits": 3}, "option 'digits' given both"),
        ("builtin:arithmetic?digits", {}, "expected option=value after '?'"),
        ("builtin:pyexpr", {"terms": 1}, "option 'terms': expected a value in [2, 5], got 1"),
        ("builtin:extract", {"ask": 3, "fields": 2}, "option 'ask': expected a value in [1, 2], got 3"),
        ("builtin:extract", {"heldout_fraction": 1.5}, "heldout_fraction': expected a value in (0, 1)"),
        ("builtin:arithmatic", {}, "unknown builtin (did you mean builtin:arithmetic?)"),
        ("arithmetic", {}, "expected builtin:<name> or jsonl:<path>"),
        ("http:x", {}, "unknown scheme 'http'"),
    ],
)
def test_bad_source_or_options_raise_one_line_errors(source: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(SourceError) as info:
        open_source(source, domain="d", heldout=0, options=options)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_query_string_options_apply() -> None:
    for task in samples("builtin:arithmetic?digits=1&ops=3&operators=*", 100):
        assert re.fullmatch(r"\d\*\d\*\d\*\d=", task.prompt)
