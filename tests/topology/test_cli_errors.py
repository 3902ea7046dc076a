"""user_error: a user's error is found bare or inside a task group's exception group; a bug beside it is not."""

from __future__ import annotations

from topology.cli._errors import user_error
from topology.runtime import RunLocked, RunNotFound

EXPECTED = (RunNotFound, RunLocked, OSError)


def test_bare_and_grouped_errors_are_found() -> None:
    bare = RunNotFound("cannot resume")
    assert user_error(bare, EXPECTED) is bare
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [bare]), FileNotFoundError("x")])
    assert user_error(nested, EXPECTED) is bare


def test_a_group_holding_a_bug_stays_a_traceback() -> None:
    assert user_error(ExceptionGroup("tg", [RunLocked("live"), KeyError("bug")]), EXPECTED) is None
    assert user_error(KeyError("bug"), EXPECTED) is None
