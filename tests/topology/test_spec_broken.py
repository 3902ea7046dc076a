"""Every file in broken_specs/ is rejected with the FILE:LINE and key path its header announces.

Header lines (at the top of each broken spec):
    # expect: [FILE:]LINE: KEY.PATH      an error at that line (FILE relative to the spec's folder)
    # expect-message: TEXT               some error's message contains TEXT
An empty KEY.PATH means "the document itself" (syntax errors, empty files).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from topology import SpecError, check_spec, load_spec

HERE = Path(__file__).parent / "broken_specs"
BROKEN = sorted(p for p in HERE.glob("*.yaml"))
_EXPECT = re.compile(r"^# expect: (?:(?P<file>[^:\s]+):)?(?P<line>\d+):(?: (?P<path>\S+))?\s*$")


def _expectations(spec: Path) -> tuple[list[tuple[str, int, str]], list[str]]:
    errors: list[tuple[str, int, str]] = []
    messages: list[str] = []
    for line in spec.read_text().splitlines():
        if line.startswith("# expect-message: "):
            messages.append(line.removeprefix("# expect-message: "))
            continue
        match = _EXPECT.match(line)
        if match:
            file = str(HERE / match["file"]) if match["file"] else str(spec)
            errors.append((file, int(match["line"]), match["path"] or ""))
    return errors, messages


def test_there_are_many_broken_specs() -> None:
    assert len(BROKEN) >= 40


@pytest.mark.parametrize("spec", BROKEN, ids=lambda p: p.name)
def test_broken_spec_is_rejected_at_the_announced_place(spec: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLYWHEEL_TEST_UNDEFINED_VAR", "FLYWHEEL_TEST_UNDEFINED_DOMAIN", "FLYWHEEL_TEST_UNDEFINED_REPLICAS"):
        monkeypatch.delenv(name, raising=False)
    expected, messages = _expectations(spec)
    assert expected, f"{spec.name} has no '# expect:' header"
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    errors = caught.value.errors
    found = {(str(Path(e.file).resolve()), e.line, e.path) for e in errors}
    rendered = "\n".join(str(e) for e in errors)
    for file, line, path in expected:
        assert (str(Path(file).resolve()), line, path) in found, f"expected {file}:{line}: {path}; got:\n{rendered}"
    for message in messages:
        assert any(message in e.message for e in errors), f"no message contains {message!r}; got:\n{rendered}"
    for error in errors:
        assert str(error).startswith(f"{error.file}:{error.line}:{error.col}: ")
        assert error.line >= 1 and error.col >= 1
        assert "Traceback" not in error.message


def test_check_spec_reports_without_raising() -> None:
    spec, issues = check_spec(HERE / "many_errors.yaml")
    assert spec is None
    assert sum(1 for i in issues if i.is_error) >= 5


def test_a_value_no_member_of_a_union_takes_is_one_error_naming_each() -> None:
    """``eval_temperature: [0, hot]`` is a list: one error at its bad item, not also "expected a number, got a list"
    from the union's other member."""
    with pytest.raises(SpecError) as caught:
        load_spec(HERE / "learner_eval_temperature_bad_item.yaml")
    assert [e.path for e in caught.value.errors] == ["actors.learner.eval_temperature[1]"]


def test_a_refused_field_hides_neither_the_hooks_errors_nor_invents_one_about_itself(tmp_path: Path) -> None:
    """A domain whose model refuses a field still gets its section check on the rest: a misspelt verifier beside a
    negative ``heldout`` is reported with it, at once. The check saw ``heldout`` at its default (200, more than the
    file's three rows), and says nothing about it: the only error there is the one about what was written."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "three_rows.jsonl").write_text((HERE / "data" / "three_rows.jsonl").read_text())
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: broken\npolicy: {model: builtin:tiny-gpt}\ndomains:\n"
        "  mine: {source: jsonl:data/three_rows.jsonl, verifier: maths, heldout: -1}\n"
        "actors: {source: {}, generator: {}, verify: {}, learner: {}}\n"
    )
    _, issues = check_spec(spec)
    found = sorted((i.path, i.message) for i in issues if i.is_error)
    assert [path for path, _ in found] == ["domains.mine.heldout", "domains.mine.verifier"], found
    assert "count >= 0" in found[0][1] and "did you mean 'math'" in found[1][1], found
