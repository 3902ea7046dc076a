"""``flywheel sandbox run FILE [--tests TESTS] [--timeout S] [--memory MB]``: one program, one JSON line.

Prints a single JSON object: verdict, reward, isolation, elapsed_s, stdout, stderr (capped), detail.
Reward is 1.0 only when tests were given and all passed (judged outside the program, on the values it
returned: see ``actors.sandbox._worker``); a program run without tests earns 0.0 whatever it does (verdict
``pass`` then only says it ran to completion: end of file or ``exit(0)``). It runs under bubblewrap unless
``--min-isolation`` opts in to less. Exit status 0 for every verdict; non-zero only when the sandbox itself
could not run (or the required isolation is missing: verdict ``isolation_refused``, exit 3, with how to
install bubblewrap or opt in).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import click

from actors.commands._sandboxed import isolation_options, limits_for, one_worker_pool, quiet_logs
from actors.sandbox import IsolationRefused, SandboxLimits, SandboxResult, Verdict


@click.group()
def sandbox() -> None:
    """Run programs in the verifier sandbox."""


async def _run(
    code: str, tests: str | None, limits: SandboxLimits, isolation: str, min_isolation: str
) -> SandboxResult:
    async with one_worker_pool(limits, isolation, min_isolation) as pool:
        return await pool.run(code, tests=tests)


@sandbox.command("run")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--tests",
    "tests_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="assert-style tests run after FILE",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.01),
    default=5.0,
    show_default=True,
    help="wall-clock seconds",
)
@click.option(
    "--memory",
    "memory_mb",
    type=click.IntRange(min=16),
    default=512,
    show_default=True,
    help="address-space MB",
)
@isolation_options("FILE")
def run(
    file: Path, tests_file: Path | None, timeout_s: float, memory_mb: int, isolation: str, min_isolation: str
) -> None:
    """Run FILE in the sandbox and print one JSON object with the verdict."""
    quiet_logs()
    try:
        code = file.read_text(errors="replace")
        tests = tests_file.read_text(errors="replace") if tests_file else None
    except OSError as exc:
        raise click.ClickException(f"cannot read {exc.filename}: {exc.strerror}") from None
    limits = limits_for(timeout_s, memory_mb)
    try:
        result = asyncio.run(_run(code, tests, limits, isolation, min_isolation))
    except IsolationRefused as exc:
        out = SandboxResult(Verdict.ISOLATION_REFUSED, str(exc)).as_dict()
        out["reward"] = 0.0
        click.echo(json.dumps(out))
        sys.exit(3)
    except Exception as exc:
        click.echo(
            json.dumps({"verdict": str(Verdict.INTERNAL_ERROR), "reward": 0.0, "detail": f"sandbox failed: {exc}"})
        )
        sys.exit(2)
    out = result.as_dict()
    if tests is None:
        out["reward"] = 0.0
        if result.passed:
            out["detail"] = "ran to completion; no tests given, so the reward is 0.0"
    if result.verdict is Verdict.INTERNAL_ERROR:
        click.echo(json.dumps(out))
        sys.exit(2)
    click.echo(json.dumps(out))
