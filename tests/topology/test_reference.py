"""specs/REFERENCE.md documents every spec key: it is what `flywheel reference` generates from the models."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from tests.conftest import ROOT
from topology import actor_kinds, spec_sections
from topology._reference import reference_markdown
from topology.cli import main


def fresh_reference() -> str:
    """``flywheel reference`` in a fresh interpreter: the application's kinds and sections only. In this process other
    tests may have registered test-only kinds (``tests/topology/runtime/_kinds.py``), which the file never lists."""
    done = subprocess.run(
        [sys.executable, "-m", "topology.cli", "reference"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_checked_in_reference_is_current() -> None:
    current = (ROOT / "specs" / "REFERENCE.md").read_text()
    assert current == fresh_reference(), "specs/REFERENCE.md is stale: run `flywheel reference > specs/REFERENCE.md`"


def test_every_field_of_every_model_has_a_row_with_a_meaning() -> None:
    text = fresh_reference()
    for name, kind in actor_kinds().items():
        if not kind.factory.startswith("actors."):  # a test-only kind registered by another test in this process
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
