"""``flywheel verify --verifier NAME --reference TEXT [--config JSON] FILE``: score one answer, print one JSON object.

What a user needs to debug a reward, and how hostile answers are tried from outside: FILE (``-`` for stdin) is the
completion, scored by any verifier — a builtin (``math``, ``python-tests``, ``python-expr``, ``json-fields``) or a
user's ``module:function`` — exactly as the verify actor scores it. ``--reference`` becomes the task's verifier
fields (``@PATH`` reads it from a file):

- ``math``: the reference answer (``{"answer": TEXT}``);
- ``python-tests``: the tests' source (``{"tests": TEXT}``);
- ``python-expr``: the target, a Python literal (``{"target": LITERAL}``);
- ``json-fields``: the expected fields, a JSON object (``{"fields": OBJECT}``);
- ``module:function``: ``{"answer": TEXT}`` — what a JSONL row's ``"answer"`` becomes, so a function that reads
  ``task["answer"]`` scores here as it does in a run (a row's ``"reference"`` is the warm start's and never reaches a
  verifier; other fields: ``--task``).

``--task JSON`` adds or overrides fields; ``--config JSON`` is the domain's ``verifier_config``. Code runs under the
limits of a verify actor whose spec sets no ``sandbox`` keys (``--timeout`` and ``--memory`` replace its wall clock
and address space), so an answer that ran out of memory or CPU time in a run does here too. Prints one JSON
object: verifier, reward, verdict, detail, elapsed_s, isolation. Every answer finishes within its limit (the
sandbox's wall clock for code, the helper's time limit for symbolic checks and ``module:function`` verifiers) and
bounded in memory; a hostile answer gets reward 0 and its verdict. Exit status 0 for every verdict; 1 for a usage
mistake (one line); 2 when the verifier itself could not run; 3 when the required sandbox isolation is missing.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import click

from actors.commands._sandboxed import isolation_options, quiet_logs
from actors.domains._verifiers import VerifierError, build_verifier
from actors.domains._verifiers._base import read_literal
from actors.domains._verifiers._registry import needs_sandbox, task_problem
from actors.sandbox._isolation import IsolationRefused
from actors.sandbox._pool import SandboxPool
from topology import actor_kinds

MAX_ANSWER_BYTES = 1 << 20  # a longer FILE is refused (reward 0) rather than read whole


def _usage(option: str, message: str) -> click.ClickException:
    """A usage mistake: one line naming the option, exit status 1 (the module's contract; click's own usage errors
    print the usage too and exit 2, the status of a verifier that could not run)."""
    return click.ClickException(f"{option}: {message}")


def task_fields(verifier: str, reference: str, config: dict[str, Any]) -> dict[str, Any]:
    """The task's verifier fields that ``--reference`` stands for, for ``verifier``."""
    if verifier == "math":
        return {str(config.get("answer_field", "answer")): reference}
    if verifier == "python-tests":
        return {str(config.get("tests_field", "tests")): reference}
    if verifier == "python-expr":
        try:
            return {"target": read_literal(reference)}
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            literal = f"a Python literal is expected, got {reference[:60]!r}"
            raise _usage("--reference", literal) from None
    if verifier == "json-fields":
        try:
            fields = json.loads(reference)
        except ValueError as exc:
            raise _usage("--reference", f"a JSON object is expected ({exc})") from None
        if not isinstance(fields, dict):
            raise _usage("--reference", "a JSON object is expected")
        return {"fields": fields}
    return {"answer": reference}  # a user's function: as a JSONL row's "answer" reaches it in a run


def _json_object(text: str, option: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise _usage(option, f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _usage(option, "a JSON object is expected")
    return value


def _read_text(source: str, what: str) -> str:
    """``source`` itself, or the file after a leading ``@`` (``-`` is stdin), at most MAX_ANSWER_BYTES + 1 bytes."""
    try:
        if source == "-":
            return sys.stdin.buffer.read(MAX_ANSWER_BYTES + 1).decode("utf-8", "replace")
        with open(source, "rb") as f:
            return f.read(MAX_ANSWER_BYTES + 1).decode("utf-8", "replace")
    except OSError as exc:
        raise click.ClickException(f"cannot read {what} {source}: {exc.strerror}") from None


def sandbox_pool(timeout_s: float | None, memory_mb: int | None, isolation: str, min_isolation: str) -> SandboxPool:
    """One worker with the limits of a verify actor whose spec sets no ``sandbox`` keys (the kind's defaults, read
    from its config model), so an answer passes or fails here for its memory or CPU as it does in a run; ``timeout_s``
    and ``memory_mb`` replace the wall clock and the address space when given."""
    defaults: Any = actor_kinds()["verify"].config()  # commands do not import kinds: the registry hands its model
    sandbox = defaults.sandbox
    update: dict[str, Any] = {"workers": 1, "isolation": isolation, "min_isolation": min_isolation}
    if timeout_s is not None:
        update["wall_s"] = timeout_s
    if memory_mb is not None:
        update["memory_mb"] = memory_mb
    return SandboxPool.from_config(sandbox.model_copy(update=update))


async def _score(
    verifier: str,
    config: dict[str, Any],
    answer: str,
    fields: dict[str, Any],
    isolation: str,
    min_isolation: str,
    timeout_s: float | None,
    memory_mb: int | None,
) -> dict[str, Any]:
    from actors.domains._score import score

    pool: SandboxPool | None = None
    if needs_sandbox(verifier):
        pool = sandbox_pool(timeout_s, memory_mb, isolation, min_isolation)
        await pool.start()
    try:
        built = build_verifier(verifier, config, pool=pool, user_timeout_s=timeout_s)
        result = await score(answer, fields, verifier=built)
    finally:
        if pool is not None:
            await pool.aclose()
    return {"verifier": verifier, **result.as_dict()}


@click.command("verify")
@click.argument("file", type=str)
@click.option("--verifier", required=True, help="math, python-tests, python-expr, json-fields or module:function")
@click.option("--reference", required=True, help="the reference answer, tests, target or fields (@PATH: from a file)")
@click.option("--config", "config_json", default="{}", show_default=True, help="the verifier_config, a JSON object")
@click.option("--task", "task_json", default=None, help="more task fields, a JSON object (overrides --reference's)")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.01),
    default=None,
    help="wall-clock seconds for code (default: the verify actor's sandbox.wall_s) and for a module:function "
    "verifier (default 30); code's other limits (CPU time, processes, files) are the verify actor's defaults",
)
@click.option(
    "--memory",
    "memory_mb",
    type=click.IntRange(min=16),
    default=None,
    help="code's address space in MB (default: the verify actor's sandbox.memory_mb)",
)
@isolation_options("code")
def verify(
    file: str,
    verifier: str,
    reference: str,
    config_json: str,
    task_json: str | None,
    timeout_s: float | None,
    memory_mb: int | None,
    isolation: str,
    min_isolation: str,
) -> None:
    """Score the answer in FILE (- for stdin) with one verifier and print one JSON object."""
    quiet_logs()
    config = _json_object(config_json, "--config")
    if reference.startswith("@"):
        reference = _read_text(reference[1:], "the reference")
    fields = task_fields(verifier, reference, config)
    if task_json is not None:
        fields.update(_json_object(task_json, "--task"))
    # a task that can score no answer (no tests, no target) is a usage mistake, not a verdict
    problem = task_problem(verifier, config, fields)
    if problem is not None:
        raise _usage("--reference" if task_json is None else "--reference/--task", problem)
    answer = _read_text(file, "the answer")
    if len(answer.encode("utf-8", "replace")) > MAX_ANSWER_BYTES:
        out = {"verifier": verifier, "reward": 0.0, "verdict": "fail", "elapsed_s": 0.0, "isolation": "in-process"}
        click.echo(json.dumps({**out, "detail": f"the answer is longer than {MAX_ANSWER_BYTES} bytes"}))
        return
    started = time.monotonic()
    try:
        out = asyncio.run(_score(verifier, config, answer, fields, isolation, min_isolation, timeout_s, memory_mb))
    except VerifierError as exc:
        raise click.ClickException(str(exc)) from None
    except IsolationRefused as exc:
        refused = {"verifier": verifier, "reward": 0.0, "verdict": "isolation_refused", "detail": str(exc)}
        click.echo(json.dumps({**refused, "elapsed_s": time.monotonic() - started, "isolation": ""}))
        sys.exit(3)
    except Exception as exc:
        failed = {"verifier": verifier, "reward": 0.0, "verdict": "internal_error", "detail": f"verify failed: {exc}"}
        click.echo(json.dumps({**failed, "elapsed_s": time.monotonic() - started, "isolation": ""}))
        sys.exit(2)
    click.echo(json.dumps(out))


__all__ = ["task_fields", "verify"]
