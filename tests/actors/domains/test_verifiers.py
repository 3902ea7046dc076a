from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from actors.domains import VerifierError, build_verifier
from actors.domains._verifiers._base import read_literal
from actors.domains._verifiers._math import answers_equal, exact_equal, extract_answer
from actors.domains._verifiers._python import extract_code
from actors.sandbox import IsolationRefused, SandboxPool, Verdict
from actors.sandbox._verdict import classify
from tests.actors.sandbox._pool_runner import PoolRunner

pytestmark = pytest.mark.timeout(30)


def test_verdicts_are_distinct() -> None:
    assert len({str(v) for v in Verdict}) == 8


def test_limits_win_over_a_reported_pass() -> None:
    report = {"passed": True, "signal": None, "stdout_bytes": 10, "stderr_bytes": 0, "timed_out": True}
    assert classify(report, file_limit_bytes=100, timeout_s=1)[0] is Verdict.TIMEOUT
    report = {"passed": True, "signal": None, "stdout_bytes": 100, "stderr_bytes": 0}
    assert classify(report, file_limit_bytes=100, timeout_s=1)[0] is Verdict.OUTPUT_LIMIT


@pytest.mark.parametrize(
    ("text", "reference", "ok"),
    [
        ("The answer is 42.", "42", True),
        ("so \\boxed{\\frac{1}{2}}", "0.5", True),
        ("total: 1,000", "1000", True),
        ("#### 3/4", "0.75", True),
        ("answer: sqrt(2)/2", "1/sqrt(2)", True),
        ("answer: 2x+1", "1+2*x", True),
        ("answer: 41", "42", False),
        ("answer: 0.1", "0.10000001", False),
        ("no numbers here", "1", False),
        ("answer: __import__('os').system('true')", "0", False),
        ("answer: 9^9^9^9", "1", False),
    ],
)
def test_math_equivalence(text: str, reference: str, ok: bool) -> None:
    answer = extract_answer(text)
    assert (answer is not None and answers_equal(answer, reference)) is ok


def test_math_verifier_reward() -> None:
    v = build_verifier("math")
    assert asyncio.run(v.verify("3 + 4 = 7", {"answer": "7"})).reward == 1.0
    assert asyncio.run(v.verify("it is 8", {"answer": "7"})).verdict == "fail"
    assert asyncio.run(v.verify("answer: sqrt(2)/2", {"answer": "1/sqrt(2)"})).reward == 1.0  # via sympy


@pytest.mark.parametrize(
    ("answer", "reference", "decided"),
    [
        ("146", "146", True),
        ("1,000", "1000", True),
        ("0.5", "1/2", True),
        ("147", "146", False),
        ("-3", "3", False),
        ("sqrt(2)/2", "1/sqrt(2)", None),
        ("2x+1", "1+2*x", None),
    ],
)
def test_math_exact_part_decides_numbers_and_leaves_symbols_to_sympy(
    answer: str, reference: str, decided: bool | None
) -> None:
    assert exact_equal(answer, reference) is decided


@pytest.mark.parametrize(
    "text", ["17", "-3", "1.5", "1e+16", "-2.5e-07", "True", "None", "[1, -2]", "{'a': (1,)}", "'x'", "9" * 4000]
)
def test_read_literal_agrees_with_literal_eval(text: str) -> None:
    import ast

    got, want = read_literal(text), ast.literal_eval(text)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("text", ["inf", "nan", "x", "1+", "__import__('os')"])
def test_read_literal_refuses_what_literal_eval_refuses(text: str) -> None:
    with pytest.raises((ValueError, SyntaxError)):
        read_literal(text)


def test_json_fields_partial_credit_and_modes() -> None:
    v = build_verifier("json-fields", {"modes": {"city": "normalized", "age": "numeric"}})
    task = {"fields": {"age": 36, "city": "Rome", "pet": "cat"}}
    full = asyncio.run(v.verify('Here: {"age": "36.0", "city": "  rome ", "pet": "cat"}', task))
    assert full.reward == 1.0 and full.verdict == "pass"
    part = asyncio.run(v.verify('{"age": 36, "city": "Oslo"}', task))
    assert part.reward == pytest.approx(1 / 3) and part.verdict == "fail"
    assert asyncio.run(v.verify('{"age": 36, "city": ', task)).reward == 0.0
    assert asyncio.run(build_verifier("json-fields").verify('{"age": 36.0}', {"fields": {"age": 36}})).reward == 0.0


def test_unknown_and_unimportable_verifiers_are_one_line_errors() -> None:
    with pytest.raises(VerifierError, match="expected one of"):
        build_verifier("nope")
    with pytest.raises(VerifierError, match="cannot import module"):
        build_verifier("no_such_module_xyz:fn")
    with pytest.raises(VerifierError, match="bad verifier_config"):
        build_verifier("math", {"bogus": 1})


def test_module_function_verifier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "myverif.py").write_text(
        "async def score(text, task):\n    return float(text.strip() == task['want'])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    v = build_verifier("myverif:score")
    assert asyncio.run(v.verify(" yes ", {"want": "yes"})).reward == 1.0
    assert asyncio.run(v.verify("no", {"want": "yes"})).reward == 0.0


def test_python_expr_verifier(sandbox: PoolRunner) -> None:
    v = build_verifier("python-expr", pool=sandbox.pool)
    task: dict[str, Any] = {"target": 17, "pattern": r"[0-9+\-* ]+"}
    assert sandbox.call(v.verify("3*5+2", task)).reward == 1.0
    assert sandbox.call(v.verify("3*5+3", task)).reward == 0.0
    assert sandbox.call(v.verify("17", {"target": 17})).reward == 1.0
    assert sandbox.call(v.verify("17", {"target": 17, "pattern": r"\d \+ \d"})).reward == 0.0


def test_python_expr_rejects_lying_objects(sandbox: PoolRunner) -> None:
    v = build_verifier("python-expr", pool=sandbox.pool)
    liar = "type('A', (int,), {'__eq__': lambda s, o: True, '__repr__': lambda s: '17'})(3)"
    result = sandbox.call(v.verify(liar, {"target": 17}))
    assert result.reward == 0.0 and result.verdict == "fail", result


def test_python_expr_runs_each_expression_once_and_never_remembers_a_limit(sandbox: PoolRunner) -> None:
    v = build_verifier("python-expr", pool=sandbox.pool, config={"timeout_s": 0.5, "memo_size": 2})
    task: dict[str, Any] = {"target": 17}

    async def group(texts: list[str]) -> list[Any]:  # a rollout's completions are scored concurrently
        return list(await asyncio.gather(*(v.verify(t, task) for t in texts)))

    results = sandbox.call(group(["3*5+2", "3*5+2", " 3*5+2", "1/0", "3*5+2", "1/0"]))
    assert [r.reward for r in results] == [1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    assert all("ZeroDivisionError" in r.detail for r in results if r.reward == 0.0), results
    assert (v.sandbox_runs, v.memo_hits) == (2, 4)  # one job per distinct expression, also while it runs
    assert sandbox.call(v.verify("3*5+2", {"target": 18})).reward == 0.0  # the value is remembered, not the verdict
    hang = "any(iter(int, 1))"  # loops until the time limit, using no memory
    assert [r.verdict for r in sandbox.call(group([hang, hang]))] == ["timeout", "timeout"]
    assert v.sandbox_runs == 3  # the second shared the first's run...
    assert sandbox.call(v.verify(hang, task)).verdict == "timeout" and v.sandbox_runs == 4  # ...but it is not kept
    sandbox.call(v.verify("2+2", task))
    sandbox.call(v.verify("5", task))  # memo_size 2: "3*5+2" is the least recently used and goes
    assert sandbox.call(v.verify("3*5+2", task)).reward == 1.0 and v.sandbox_runs == 7
    sandbox.still_serves()


def test_python_tests_verifier_uses_fenced_code(sandbox: PoolRunner) -> None:
    v = build_verifier("python-tests", pool=sandbox.pool)
    text = "Sure:\n```python\ndef sq(x):\n    return x * x\n```\n"
    assert sandbox.call(v.verify(text, {"tests": "assert sq(3) == 9"})).reward == 1.0
    assert sandbox.call(v.verify("print('PASS')", {"tests": "assert sq(3) == 9"})).reward == 0.0
    # a completion that ended before its closing fence (end of text, or the token budget) answers with its open block
    unclosed = "Here it is:\n```python\ndef sq(x):\n    return x * x\n"
    assert sandbox.call(v.verify(unclosed, {"tests": "assert sq(3) == 9"})).reward == 1.0
    after_a_closed_one = "```python\ndef sq(x):\n    return 0\n```\nFixed:\n```python\ndef sq(x):\n    return x * x"
    assert sandbox.call(v.verify(after_a_closed_one, {"tests": "assert sq(3) == 9"})).reward == 1.0
    assert extract_code("```python\nA\n```\nDone. ```") == "A\n"  # a stray fence after the last block opens none


def test_pool_refuses_weaker_isolation_than_required() -> None:
    async def start() -> None:
        async with SandboxPool(workers=1, isolation="rlimits", min_isolation="bwrap"):
            pass

    with pytest.raises(IsolationRefused, match="bwrap is required"):
        asyncio.run(start())


def test_statistics_count_verdicts(sandbox: PoolRunner) -> None:
    before = sandbox.pool.statistics().verdicts["fail"]
    sandbox.run("x = 1", tests="assert x == 2")
    stats = sandbox.pool.statistics()
    assert stats.verdicts["fail"] == before + 1 and stats.isolation and stats.queue_size >= 2


def _cli(args: list[str]) -> tuple[int, dict[str, Any]]:
    from topology.cli import main

    res = CliRunner().invoke(main, ["sandbox", "run", *args])
    return res.exit_code, json.loads(res.stdout.strip().splitlines()[-1])


def test_cli_reports_one_json_object(tmp_path: Path) -> None:
    prog, tests = tmp_path / "p.py", tmp_path / "t.py"
    prog.write_text("def f(x):\n    return 2 * x\n")
    tests.write_text("assert f(2) == 4\n")
    code, out = _cli([str(prog), "--tests", str(tests)])
    assert code == 0 and out["verdict"] == "pass" and out["reward"] == 1.0
    assert {"verdict", "reward", "isolation", "elapsed_s", "stdout", "stderr"} <= set(out)
    code, out = _cli([str(prog)])
    assert code == 0 and out["reward"] == 0.0  # no tests: nothing passed
    prog.write_text("while True:\n    pass\n")
    code, out = _cli([str(prog), "--tests", str(tests), "--timeout", "0.5"])
    assert code == 0 and out["verdict"] == "timeout" and out["reward"] == 0.0


def test_cli_isolation_refused_is_nonzero(tmp_path: Path) -> None:
    prog = tmp_path / "p.py"
    prog.write_text("x = 1\n")
    code, out = _cli([str(prog), "--isolation", "rlimits", "--min-isolation", "bwrap"])
    assert code == 3 and out["verdict"] == "isolation_refused"
    assert sys.executable  # the CLI ran in-process


def test_in_process_verifiers_are_scored_without_a_task_each(sandbox: PoolRunner) -> None:
    from actors.domains import DomainVerifier, Scorer

    scorer = Scorer(
        {
            "a": DomainVerifier("math", {}),
            "j": DomainVerifier("json-fields", {}),
            "p": DomainVerifier("python-expr", {}),
        },
        pool=sandbox.pool,
    )
    assert [scorer.in_process(d) for d in ("a", "j", "p", "missing")] == [True, True, False, False]
    assert sandbox.call(scorer.score("a", "12", {"answer": "12"})).reward == 1.0


def test_the_reference_names_every_key_each_builtin_verifier_takes_in_its_config() -> None:
    """The row of ``verifier_config`` in specs/REFERENCE.md lists each builtin's keyword arguments (validate refuses
    any other key): a verifier that gains one must say so there."""
    from actors.domains._verifiers._registry import config_keys, verifier_names

    root = Path(__file__).resolve().parents[3]
    row = next(
        line for line in (root / "specs" / "REFERENCE.md").read_text().splitlines() if ".verifier_config`" in line
    )
    for name in verifier_names():
        listed = row.split(f"{name}: ", 1)[1].split(";", 1)[0]
        assert set(listed.replace(" ", "").split(",")) == set(config_keys(name) or ()), name
    assert config_keys("mypkg.scoring:score") is None
