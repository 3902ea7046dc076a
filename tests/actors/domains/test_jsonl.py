"""JSONL task files: good rows, bad rows (errors name file:line and what was expected), held-out."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from actors.domains import JsonlSource, SourceError, open_source, read_jsonl_tasks


def write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def good_rows(n: int) -> list[object]:
    return [{"prompt": f"{i}+1=", "reference": str(i + 1), "verifier_fields": {"answer": str(i + 1)}} for i in range(n)]


def test_good_rows_become_tasks(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.jsonl",
        [
            "# a comment",
            "",
            {"prompt": "2+2=", "verifier_fields": {"answer": "4"}, "reference": "4"},
            {"id": "q2", "prompt": "say hi:"},
        ],
    )
    tasks = read_jsonl_tasks(path, "mine")
    assert [t.prompt for t in tasks] == ["2+2=", "say hi:"]
    assert tasks[0].verifier_fields == {"answer": "4"} and tasks[0].reference == "4"
    assert tasks[1].key == "q2" and tasks[1].reference is None and tasks[1].verifier_fields == {}
    assert all(t.domain == "mine" and t.id.startswith("mine-") for t in tasks)


def test_prompt_answer_rows_are_reference_and_verifier_answer(tmp_path: Path) -> None:
    """The common `{"prompt", "answer"}` file needs no flywheel-specific keys."""
    path = write(
        tmp_path / "t.jsonl",
        [
            {"prompt": "2+2=", "answer": "4"},
            {"prompt": "3*3=", "answer": 9},
            {"prompt": "1+0=", "answer": "1", "reference": "1 (one)"},
        ],
    )
    tasks = read_jsonl_tasks(path, "mine")
    assert [(t.reference, dict(t.verifier_fields)) for t in tasks] == [
        ("4", {"answer": "4"}),
        ("9", {"answer": "9"}),
        ("1 (one)", {"answer": "1"}),
    ]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "expected one JSON object per line"),
        ("[1, 2]", 'expected a JSON object with a "prompt", got list'),
        ({"reference": "4"}, '"prompt": expected a non-empty string, got None'),
        ({"prompt": ""}, '"prompt": expected a non-empty string'),
        ({"prompt": "x", "anwser": "4"}, "unknown key 'anwser'; expected only id, prompt, reference, verifier_fields"),
        ({"prompt": "x", "answer": ""}, '"answer": expected a non-empty string or a number'),
        ({"prompt": "x", "answer": "4", "verifier_fields": {"answer": "5"}}, "disagrees with verifier_fields.answer"),
        ({"prompt": "x", "reference": 4}, '"reference": expected a string, got 4'),
        ({"prompt": "x", "verifier_fields": [1]}, '"verifier_fields": expected a JSON object'),
        ({"prompt": "x", "id": 3}, '"id": expected a non-empty string, got 3'),
        ({"prompt": "1+1="}, "duplicate task key '1+1=' (first on line 2)"),
    ],
)
def test_bad_row_error_names_file_line_and_expectation(tmp_path: Path, row: object, message: str) -> None:
    path = write(tmp_path / "bad.jsonl", ["# header", {"prompt": "1+1="}, row])
    with pytest.raises(SourceError) as info:
        open_source("jsonl:bad.jsonl", domain="d", heldout=0, base_dir=tmp_path)
    assert str(info.value).startswith(f"{path}:3: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_every_bad_row_of_a_file_is_found_at_once(tmp_path: Path) -> None:
    """Only the first bad row was reported: a file with a mistake on every row took one validate per row. The first is
    explained and the lines of the others follow, in the same one line."""
    rows: list[object] = [{"prompt": "1+1=", "target": "2"}, {"reference": "2"}, *good_rows(2), {"prompt": "1+1="}]
    path = write(tmp_path / "bad.jsonl", rows + [{"prompt": f"{i}?", "target": "x"} for i in range(8)])
    with pytest.raises(SourceError) as info:
        open_source("jsonl:bad.jsonl", domain="d", heldout=0, base_dir=tmp_path)
    message = str(info.value)
    assert message.startswith(f"{path}:1: unknown key 'target'") and "\n" not in message
    assert message.endswith("(10 more bad rows: lines 2, 5, 6, 7, 8, …)"), message
    write(tmp_path / "two.jsonl", [{"prompt": "a", "target": "2"}, *good_rows(1), {"reference": "2"}])
    with pytest.raises(SourceError, match=r"\(1 more bad row: line 3\)$"):
        open_source("jsonl:two.jsonl", domain="d", heldout=0, base_dir=tmp_path)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"nope\.jsonl: file not found"):
        open_source("jsonl:nope.jsonl", domain="d", base_dir=tmp_path)


def test_integer_heldout_is_fixed_and_disjoint(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", good_rows(100))
    src = open_source(f"jsonl:{path}", domain="d", heldout=10)
    assert isinstance(src, JsonlSource) and len(src) == 90
    held = src.heldout()
    assert len(held) == 10
    # Row order does not change the partition.
    shuffled = good_rows(100)
    random.Random(0).shuffle(shuffled)
    other = open_source(f"jsonl:{write(tmp_path / 's.jsonl', shuffled)}", domain="d", heldout=10)
    assert {t.key for t in other.heldout()} == {t.key for t in held}
    rng = random.Random(0)
    train = {src.sample(rng).key for _ in range(10_000)}
    assert len(train) == 90 and not train & {t.key for t in held}


def test_heldout_file_rows_are_removed_from_training(tmp_path: Path) -> None:
    write(tmp_path / "train.jsonl", good_rows(20))
    write(tmp_path / "held.jsonl", good_rows(5))
    src = open_source("jsonl:train.jsonl", domain="d", heldout="jsonl:held.jsonl", base_dir=tmp_path)
    rng = random.Random(0)
    seen = {src.sample(rng).prompt for _ in range(2000)}
    assert len(seen) == 15 and not seen & {t.prompt for t in src.heldout()}


def test_heldout_too_large_or_bad_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "t.jsonl", good_rows(3))
    with pytest.raises(SourceError, match="held-out size 3 leaves no training tasks"):
        open_source("jsonl:t.jsonl", domain="d", heldout=3, base_dir=tmp_path)
    with pytest.raises(SourceError, match="heldout: expected an integer >= 0 or jsonl:<path>"):
        open_source("jsonl:t.jsonl", domain="d", heldout="200", base_dir=tmp_path)
