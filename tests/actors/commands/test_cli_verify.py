"""``flywheel verify``: one answer, any verifier, one JSON object — and hostile answers tried from outside."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from actors.commands._verify import task_fields, verify
from actors.domains import read_jsonl_tasks

pytestmark = pytest.mark.timeout(120)


def _verify(tmp_path: Path, answer: str, *args: str) -> tuple[int, dict[str, Any]]:
    path = tmp_path / "answer.txt"
    path.write_text(answer)
    result = CliRunner().invoke(verify, [*args, str(path)])
    lines = result.stdout.strip().splitlines()
    return result.exit_code, json.loads(lines[-1]) if lines else {"output": result.output}


@pytest.mark.parametrize(
    ("answer", "args", "reward", "isolation"),
    [
        ("so the answer is \\boxed{\\frac{1}{2}}", ["--verifier", "math", "--reference", "0.5"], 1.0, "in-process"),
        ("answer: sqrt(2)/2", ["--verifier", "math", "--reference", "1/sqrt(2)"], 1.0, "helper"),
        ("answer: 41", ["--verifier", "math", "--reference", "42"], 0.0, "in-process"),
        ("3*5+2", ["--verifier", "python-expr", "--reference", "17"], 1.0, "bwrap"),
        ('{"age": 36}', ["--verifier", "json-fields", "--reference", '{"age": 36}'], 1.0, "in-process"),
        (
            "```python\ndef sq(x):\n    return x * x\n```",
            ["--verifier", "python-tests", "--reference", "assert sq(3) == 9"],
            1.0,
            "bwrap",
        ),
    ],
)
def test_scores_one_answer_with_any_builtin(
    tmp_path: Path, answer: str, args: list[str], reward: float, isolation: str
) -> None:
    code, out = _verify(tmp_path, answer, *args)
    assert code == 0, out
    assert set(out) == {"verifier", "reward", "verdict", "detail", "elapsed_s", "isolation"}
    assert (out["reward"], out["isolation"]) == (reward, isolation), out


def test_scores_with_a_users_function_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fw_cli_verifier.py").write_text(
        "def score(text, task, config):\n    return float(text.strip() == task['answer'] + config['suffix'])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["--verifier", "fw_cli_verifier:score", "--reference", "ok", "--config", '{"suffix": "!"}']
    assert _verify(tmp_path, "ok!", *args)[1]["reward"] == 1.0
    assert _verify(tmp_path, "ok", *args)[1]["reward"] == 0.0


def test_a_users_function_gets_the_fields_a_jsonl_row_gives_it_in_a_run(tmp_path: Path) -> None:
    # the verify actor hands a user's function the row's verifier fields: "answer" is where a row's answer goes
    rows = tmp_path / "tasks.jsonl"
    rows.write_text('{"prompt": "Reverse: cat", "answer": "tac"}\n')
    (task,) = read_jsonl_tasks(rows, "words")
    assert task_fields("my_module:check", "tac", {}) == dict(task.verifier_fields)


def test_code_runs_under_the_verify_actors_default_limits(tmp_path: Path) -> None:
    # an answer that a run's verify actor (sandbox defaults: 256 MB, 2 s of CPU) fails for its memory or CPU time
    # fails here too: `flywheel verify` is how a user asks why a sample scored 0
    tests = ["--verifier", "python-tests", "--reference", "assert f(1) == 2"]
    hungry = "block = bytearray(300 << 20)\ndef f(x):\n    return x + 1\n"
    code, out = _verify(tmp_path, hungry, *tests)
    assert code == 0 and out["verdict"] == "memory_limit", out
    assert _verify(tmp_path, hungry, *tests, "--memory", "512")[1]["reward"] == 1.0
    slow = "import time\nend = time.process_time() + 3\nwhile time.process_time() < end:\n    pass\n"
    # a wall-clock limit far past the CPU one: on a loaded machine 5 s of wall time can hold less than 2 s of CPU
    code, out = _verify(tmp_path, slow + "def f(x):\n    return x + 1\n", *tests, "--timeout", "60")
    assert code == 0 and out["verdict"] == "timeout" and "CPU" in out["detail"], out


def test_reference_from_a_file_and_extra_task_fields(tmp_path: Path) -> None:
    tests = tmp_path / "tests.py"
    tests.write_text("assert add(2, 3) == 5\n")
    code, out = _verify(
        tmp_path, "def add(a, b):\n    return a + b\n", "--verifier", "python-tests", "--reference", f"@{tests}"
    )
    assert (code, out["reward"]) == (0, 1.0), out
    args = ["--verifier", "python-expr", "--reference", "17", "--task", '{"pattern": "[0-9]+"}']
    assert _verify(tmp_path, "3*5+2", *args)[1]["verdict"] == "fail"  # the pattern from --task applies


HOSTILE = [
    ("math", "1", "\\boxed{(a+b+c+d+f+g+h+k)^64}"),
    ("math", "7", "\\boxed{" * 2000),
    ("json-fields", '{"a": 1}', '{"a":' * 5000),
    ("python-expr", "17", "__import__('os')._exit(0)"),
    ("python-expr", "17", "type('A', (int,), {'__eq__': lambda s, o: True})(3)"),
    ("python-tests", "assert f(2) == 4", "class A:\n    __eq__ = lambda s, o: True\ndef f(x):\n    return A()"),
    (
        "python-tests",
        "assert f(2) == 4",
        "import os\nfor fd in range(64):\n    try: os.write(fd, b'P ok')\n    except OSError: pass",
    ),
    ("python-tests", "assert f(2) == 4", "while True:\n    pass"),
    ("python-tests", "assert f(2) == 4", "x = bytearray(8 << 30)"),
    ("python-tests", "assert f(2) == 4", "import os\nwhile True:\n    os.fork()"),
    ("python-tests", "assert f(2) == 4", "while True:\n    print('x' * 65536)"),
]


@pytest.mark.parametrize(("verifier", "reference", "answer"), HOSTILE)
def test_hostile_answers_tried_from_outside_earn_nothing(
    tmp_path: Path, verifier: str, reference: str, answer: str
) -> None:
    code, out = _verify(tmp_path, answer, "--verifier", verifier, "--reference", reference, "--timeout", "2")
    assert code == 0 and out["reward"] == 0.0 and out["verdict"] != "pass", out


def test_an_answer_over_the_size_cap_is_refused_unread(tmp_path: Path) -> None:
    code, out = _verify(tmp_path, "7" * (2 << 20), "--verifier", "math", "--reference", "7")
    assert code == 0 and out["reward"] == 0.0 and "longer than" in out["detail"], out


def test_mistakes_are_one_line(tmp_path: Path) -> None:
    for args in (
        ["--verifier", "nope", "--reference", "1"],
        ["--verifier", "math", "--reference", "1", "--config", "[1]"],
        ["--verifier", "python-expr", "--reference", "not a literal"],
        ["--verifier", "python-tests", "--reference", ""],  # no tests: no answer could pass, whatever it is
        ["--verifier", "json-fields", "--reference", "{}"],
    ):
        path = tmp_path / "a.txt"
        path.write_text("1")
        result = CliRunner().invoke(verify, [*args, str(path)])
        # exit status 1 and one line, as the command documents (2 is a verifier that could not run)
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
        assert result.output.startswith("Error: ") and "internal_error" not in result.output, result.output


def test_weaker_isolation_is_refused_unless_asked_for(tmp_path: Path) -> None:
    args = ["--verifier", "python-expr", "--reference", "2", "--isolation", "rlimits"]
    code, out = _verify(tmp_path, "1+1", *args)
    assert code == 3 and out["verdict"] == "isolation_refused", out
    assert "apt-get install bubblewrap" in out["detail"] and "min_isolation" in out["detail"], out
    code, out = _verify(tmp_path, "1+1", *args, "--min-isolation", "rlimits")
    assert code == 0 and (out["reward"], out["isolation"]) == (1.0, "rlimits"), out


def test_registered_path_is_importable() -> None:
    import importlib

    module, _, attr = "actors.commands._verify:verify".partition(":")
    assert getattr(importlib.import_module(module), attr) is verify
    assert textwrap.dedent(verify.help or "").startswith("Score the answer")
