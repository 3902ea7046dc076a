"""specs/REFERENCE.md documents every spec key: it is what `flywheel reference` generates from the models.

The reference is generated in a fresh interpreter: the registry is process-wide, and other tests of a session
register test-only kinds into it (the runtime tests' ``kinds_env``), which the application's reference never has.
"""

from __future__ import annotations

import os
import subprocess
import sys

from click.testing import CliRunner
from pydantic import BaseModel, Field

from tests.conftest import ROOT
from topology import actor_kinds, spec_sections
from topology._reference import _comments, reference_markdown
from topology.cli import main


def application_reference() -> str:
    env = {k: v for k, v in os.environ.items() if k != "FLYWHEEL_PLUGINS"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "topology.cli", "reference"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_checked_in_reference_is_current() -> None:
    current = (ROOT / "specs" / "REFERENCE.md").read_text()
    assert current == application_reference(), (
        "specs/REFERENCE.md is stale: run `flywheel reference > specs/REFERENCE.md`"
    )


def test_every_field_of_every_model_has_a_row_with_a_meaning() -> None:
    text = reference_markdown()
    for name, kind in actor_kinds().items():
        if kind.factory.startswith("tests."):  # registered by another test of this session
            continue
        for field in kind.config.model_fields:
            row = next((line for line in text.splitlines() if line.startswith(f"| `actors.<{name}>.{field}` |")), None)
            assert row is not None, f"{name}.{field} is not documented"
            assert not row.rstrip().endswith("|  |"), f"actors.<{name}>.{field} has no comment in its model"
    for name, section in spec_sections().items():
        prefix = f"{name}.<name>" if section.keyed else name
        for field in section.model.model_fields:
            assert f"| `{prefix}.{field}` |" in text, f"{prefix}.{field} is not documented"


def test_the_command_prints_it() -> None:
    result = CliRunner().invoke(main, ["reference"])
    assert result.exit_code == 0 and result.output == reference_markdown()


class _Commented(BaseModel):
    plain: int = 1  # on the line
    spread: int = Field(default=2, ge=0)  # a comment with a bracket (that opens here and closes
    #   on its continuation line)
    # above the field,
    # over two lines
    below: int = 3
    long_form: int = Field(
        default=4,
        ge=0,
    )  # after the closing bracket
    #   and continued
    last: int = 5  # the last field


def test_each_comment_goes_to_its_own_field() -> None:
    """A field's ``#   …`` continuation lines are its own, not the next field's; a bracket inside a comment does not
    make the field look unfinished (both once put one field's comment into the rows of the fields below it)."""
    assert _comments(_Commented) == {
        "plain": "on the line",
        "spread": "a comment with a bracket (that opens here and closes on its continuation line)",
        "below": "above the field, over two lines",
        "long_form": "after the closing bracket and continued",
        "last": "the last field",
    }


def test_the_builtin_sources_options_are_all_documented() -> None:
    """``source_options``' row names every option of every builtin source, with its default."""
    import dataclasses

    from actors.domains import ArithmeticOptions, ExtractOptions, PyExprOptions

    row = next(
        line for line in reference_markdown().splitlines() if line.startswith("| `domains.<name>.source_options`")
    )
    for name, options in (("arithmetic", ArithmeticOptions), ("pyexpr", PyExprOptions), ("extract", ExtractOptions)):
        documented = row[row.index(f"{name}:") :]
        for field in dataclasses.fields(options):
            assert f" {field.name} (" in documented, f"{name}'s option {field.name} is not in the reference"
            said = documented[documented.index(f" {field.name} (") :].split(")")[0]
            assert f"default {field.default}" in said, f"{name}.{field.name}: the reference says {said!r}"
