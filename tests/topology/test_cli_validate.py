"""`flywheel validate` and `flywheel plan`: exit codes, FILE:LINE output, no tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from topology.cli import main

ROOT = Path(__file__).parents[2]
BROKEN = Path(__file__).parent / "broken_specs"
EMBEDDED = str(ROOT / "specs" / "embedded.yaml")


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_validate_good_specs_exit_zero() -> None:
    code, out, _ = _run("validate", EMBEDDED, str(ROOT / "specs" / "multi-domain.yaml"))
    assert code == 0
    assert f"ok {EMBEDDED}" in out


def test_validate_reports_every_file_and_a_summary() -> None:
    bad = str(BROKEN / "many_errors.yaml")
    code, out, err = _run("validate", EMBEDDED, bad, str(BROKEN / "replicas_zero.yaml"))
    assert code == 1
    assert f"ok {EMBEDDED}" in out
    assert f"{bad}:17:23: actors.verify.sandbox.wall_s: expected a number > 0, got -1" in err
    assert err.strip().endswith("6 errors in 2 files")


def test_validate_missing_file_and_directory_are_one_line_errors(tmp_path: Path) -> None:
    code, _, err = _run("validate", str(tmp_path / "nope.yaml"), str(tmp_path))
    assert code == 1
    assert "no such file" in err and "is a directory" in err
    assert "Traceback" not in err


def test_validate_help_teaches() -> None:
    code, out, _ = _run("validate", "--help")
    assert code == 0 and "Examples:" in out and "file:line" in out.lower().replace("file:line:col", "file:line")
    assert "exit" in out.lower()


def test_plan_prints_table_and_mermaid() -> None:
    code, out, _ = _run("plan", EMBEDDED)
    assert code == 0 and "channels" in out and "fw.embedded-default.prompts" in out
    code, out, _ = _run("plan", EMBEDDED, "--mermaid")
    assert code == 0 and out.startswith("flowchart LR")


def test_plan_of_a_broken_spec_fails_with_locations() -> None:
    code, _, err = _run("plan", str(BROKEN / "unknown_kind.yaml"))
    assert code == 1 and "unknown_kind.yaml:8:11: actors.gen.kind: unknown actor kind 'genrator'" in err


def test_cli_subprocess_broken_spec_exit_one_without_traceback() -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLYWHEEL_TEST_UNDEFINED_VAR"}
    spec = BROKEN / "env_undefined.yaml"
    proc = subprocess.run(
        [sys.executable, "-c", "from topology.cli import main; main()", "validate", str(spec)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 1
    assert f"{spec}:4:8: bus.url:" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_python_dash_m_runs_the_cli_as_the_justfile_does() -> None:
    # `just demo` and `just validate` call `python -m topology.cli`: a package needs a __main__ for that.
    proc = subprocess.run(
        [sys.executable, "-m", "topology.cli", "validate", EMBEDDED],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"ok {EMBEDDED}" in proc.stdout
