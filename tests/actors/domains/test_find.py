"""`find(prompt)`: a served request that asked a domain's prompt gets back the task (and so its verifier fields)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from actors.domains import Domain, find_task, open_source

BUILTINS = [
    "builtin:arithmetic",
    "builtin:arithmetic?digits=4&ops=3&operators=+-*",
    "builtin:pyexpr",
    "builtin:pyexpr?terms=5&operators=-*",
    "builtin:extract?fields=3&ask=3",
]


@pytest.mark.parametrize("source", BUILTINS)
def test_every_builtin_prompt_is_found_with_its_task(source: str) -> None:
    src = open_source(source, domain="d", heldout=5)
    rng = random.Random(3)
    for task in [src.sample(rng) for _ in range(300)] + src.heldout():
        found = src.find(task.prompt)
        assert found is not None, task.prompt
        assert (found.id, found.key, found.verifier_fields) == (task.id, task.key, task.verifier_fields)
        if not source.startswith("builtin:pyexpr"):  # pyexpr's reference is the first solution, the draw's too
            assert found.reference == task.reference


@pytest.mark.parametrize(
    ("source", "prompt"),
    [
        ("builtin:arithmetic", "2+2"),
        ("builtin:arithmetic", "user: 2+2=\nassistant: "),
        ("builtin:arithmetic", "2/2="),
        ("builtin:extract", "name=Ada;age=old?age"),
        ("builtin:extract", "name=Ada?city"),
        ("builtin:extract", "color=red?color"),
        ("builtin:pyexpr", "3 5 -> 100 (python, +):"),  # no operator choice reaches 100
        ("builtin:pyexpr", "3 5 -> 8 (python, /):"),
    ],
)
def test_other_text_is_not_a_task(source: str, prompt: str) -> None:
    assert open_source(source, domain="d", heldout=0).find(prompt) is None


def test_a_prompt_from_other_options_is_still_answered_right() -> None:
    found = open_source("builtin:arithmetic?digits=1", domain="d").find("37+5*12=")
    assert found is not None and found.verifier_fields == {"answer": "97"} and found.reference == "97"


def test_jsonl_rows_are_found_training_and_held_out(tmp_path: Path) -> None:
    rows = [f'{{"prompt": "q{i}?", "answer": "{i}"}}' for i in range(10)]
    (tmp_path / "t.jsonl").write_text("\n".join(rows) + "\n")
    src = open_source("jsonl:t.jsonl", domain="d", heldout=3, base_dir=tmp_path)
    for i in range(10):
        found = src.find(f"q{i}?")
        assert found is not None and found.verifier_fields == {"answer": str(i)}
    assert len(src.heldout()) == 3 and all(src.find(t.prompt) == t for t in src.heldout())
    assert src.find("q10?") is None


def test_find_task_tries_each_text_of_a_request_in_turn() -> None:
    domains = {"math": Domain("math", open_source("builtin:arithmetic", domain="math"))}
    found = find_task(domains, "math", ["user: 1+2=\nassistant: ", "1+2="])
    assert found is not None and found.verifier_fields == {"answer": "3"}
    assert find_task(domains, "other", ["1+2="]) is None
    assert find_task(domains, None, ["1+2="]) is None
