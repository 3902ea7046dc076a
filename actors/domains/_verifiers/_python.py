"""``python-tests`` and ``python-expr`` verifiers: run the completion in the sandbox pool.

python-tests: the completion (its last fenced ```python block if there is one — a block the completion ends inside,
its closing fence never generated, runs to the end of the text — else the whole text) runs,
then the task's ``tests`` (assert-style source) in the same namespace; reward 1.0 only when the sandbox
reports PASS, i.e. the per-run nonce came back after every test ran (see ``_worker``).

python-expr: the completion (stripped; first line) must ``re.fullmatch`` the task's optional ``pattern`` and,
evaluated in the sandbox as an expression, be an exact builtin literal whose value equals ``target``
(numbers within ``rel_tol``/``abs_tol``, bools are not numbers, containers element-wise). The value is
compared here, outside the sandbox, so an object with a lying ``__eq__`` or ``__repr__`` earns nothing.
Expressions are taken to be pure: the sandbox's answer for an expression (a value, or the exception it raised)
is remembered (the last ``memo_size`` distinct expressions and at most ``memo_max_bytes`` of expressions, values
and details, per verifier — output is not kept) and reused for the same text; calls
made while a run of the same text is under way share that run's answer, whatever it is. A group of samples
often repeats an expression and a policy that has learnt a task repeats it across prompts; each sandbox job is a
fork of the warm worker, so this removes most of the verify actor's CPU in the embedded default (80 % of
expressions answered from the memo in a 10-minute run). Limits hit (timeout, memory, output) and crashes are
never remembered: a later call runs again. An expression whose value is not a function of its text (``id([])``,
a clock, a random draw) keeps its first value — a non-goal: targets are fixed literals.
"""

from __future__ import annotations

import math
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import anyio

from actors.domains._verifiers._base import VerifierError, VerifyResult, read_literal
from actors.sandbox import SandboxPool, SandboxResult, Verdict

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*)\Z", re.DOTALL)  # a block still open at the end of the text
TESTS_FIELD = "tests"  # python-tests: the task's field holding the tests, unless verifier_config names another


def extract_code(text: str) -> str:
    """The code a completion answers with: its last fenced block, or the whole text when it has none. A completion that
    ends inside a block (it stopped, or ran out of tokens, before the closing fence) answers with that block."""
    closed = list(_FENCE.finditer(text))
    still_open = _OPEN_FENCE.search(text, closed[-1].end() if closed else 0)
    if still_open is not None:
        return still_open.group(1)
    return closed[-1].group(1) if closed else text


class PythonTestsVerifier:
    name = "python-tests"

    def __init__(self, pool: SandboxPool, *, timeout_s: float | None = None, tests_field: str = TESTS_FIELD) -> None:
        self.pool, self.timeout_s, self.tests_field = pool, timeout_s, tests_field

    @staticmethod
    def task_problem(task: Mapping[str, Any], /, *, tests_field: str = TESTS_FIELD, **_config: Any) -> str | None:
        """Why no answer to ``task`` can be scored (its fields hold no test source, or one that does not compile: every
        answer would fail on it), or None. Compiling runs nothing of the tests."""
        tests = task.get(tests_field)
        if not isinstance(tests, str):
            kind = type(tests).__name__
            got = "" if tests is None else f" (its {tests_field!r} is of type {kind}, expected a string)"
            return f"python-tests verifier: the task has no {tests_field!r} source{got}"
        if not tests.strip():
            return f"python-tests verifier: the task has no {tests_field!r} source (its {tests_field!r} is empty)"
        try:
            compile(tests, "<tests>", "exec")
        except (SyntaxError, ValueError) as exc:  # ValueError: a NUL byte in the source
            where = f" at tests line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
            reason = exc.msg if isinstance(exc, SyntaxError) else str(exc)
            return f"python-tests verifier: the task's {tests_field!r} do not compile ({reason}{where})"
        return None

    async def verify(self, completion_text: str, task: Mapping[str, Any]) -> VerifyResult:
        problem = self.task_problem(task, tests_field=self.tests_field)
        if problem is not None:
            raise VerifierError(problem)
        tests = task[self.tests_field]
        result = await self.pool.run(extract_code(completion_text), tests=tests, timeout_s=self.timeout_s)
        reward = 1.0 if result.passed else 0.0
        return VerifyResult(reward, str(result.verdict), result.detail, result.elapsed_s, result.isolation)


def values_equal(got: Any, want: Any, *, rel_tol: float, abs_tol: float) -> bool:
    if isinstance(got, bool) or isinstance(want, bool):
        return type(got) is type(want) and got == want
    if isinstance(got, int | float) and isinstance(want, int | float):
        return math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol)
    if isinstance(got, list | tuple) and isinstance(want, list | tuple):
        return len(got) == len(want) and all(
            values_equal(g, w, rel_tol=rel_tol, abs_tol=abs_tol) for g, w in zip(got, want, strict=True)
        )
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(
            values_equal(got[k], want[k], rel_tol=rel_tol, abs_tol=abs_tol) for k in got
        )
    return type(got) is type(want) and bool(got == want)


class PythonExprVerifier:
    name = "python-expr"

    def __init__(
        self,
        pool: SandboxPool,
        *,
        timeout_s: float | None = None,
        rel_tol: float = 1e-9,
        abs_tol: float = 1e-9,
        max_chars: int = 2000,
        memo_size: int = 4096,
        memo_max_bytes: int = 8 << 20,
    ) -> None:
        self.pool, self.timeout_s = pool, timeout_s
        self.rel_tol, self.abs_tol, self.max_chars = rel_tol, abs_tol, max_chars
        self.memo_size, self.memo_max_bytes = memo_size, memo_max_bytes
        self._memo: OrderedDict[str, SandboxResult] = OrderedDict()
        self.memo_bytes = 0  # what the memo holds, counted as in `_memo_cost`
        self._running: dict[str, tuple[anyio.Event, list[SandboxResult]]] = {}  # jobs under way, by text
        self.sandbox_runs = 0  # jobs sent to the sandbox
        self.memo_hits = 0  # expressions answered from the memo (or by a job already under way)

    async def evaluate(self, expr: str) -> SandboxResult:
        """The sandbox's verdict on ``expr`` (mode ``expr``), from the memo when it holds one, or shared with a
        run of the same text already under way."""
        known = self._memo.get(expr)
        if known is not None:
            self._memo.move_to_end(expr)
            self.memo_hits += 1
            return known
        running = self._running.get(expr)
        if running is not None:
            done, answer = running
            await done.wait()
            if answer:
                self.memo_hits += 1
                return answer[0]
        done, answer = anyio.Event(), []
        self._running[expr] = (done, answer)
        try:
            self.sandbox_runs += 1
            result = await self.pool.run(expr, mode="expr", timeout_s=self.timeout_s)
            answer.append(result)
            if result.verdict in (Verdict.PASS, Verdict.FAIL):
                self._remember(expr, result)
            return result
        finally:
            if self._running.get(expr) == (done, answer):
                del self._running[expr]
            done.set()

    def _remember(self, expr: str, result: SandboxResult) -> None:
        """Keep what the verdict needs (not the output), then drop the oldest until both bounds hold."""
        kept = SandboxResult(result.verdict, result.detail, result.isolation, result.elapsed_s, value=result.value)
        cost = _memo_cost(expr, kept)
        if self.memo_size < 1 or cost > self.memo_max_bytes or expr in self._memo:
            return
        self._memo[expr] = kept
        self.memo_bytes += cost
        while len(self._memo) > self.memo_size or self.memo_bytes > self.memo_max_bytes:
            old_expr, old = self._memo.popitem(last=False)
            self.memo_bytes -= _memo_cost(old_expr, old)

    @staticmethod
    def task_problem(task: Mapping[str, Any], /, **_config: Any) -> str | None:
        """Why no answer to ``task`` can be scored (its fields lack the target value), or None."""
        return None if "target" in task else "python-expr verifier: the task has no 'target' field"

    async def verify(self, completion_text: str, task: Mapping[str, Any]) -> VerifyResult:
        started = time.monotonic()
        problem = self.task_problem(task)
        if problem is not None:
            raise VerifierError(problem)
        lines = completion_text.strip().splitlines()
        expr = lines[0].strip() if lines else ""
        if not expr or len(expr) > self.max_chars:
            return VerifyResult(0.0, "fail", "empty or over-long expression", time.monotonic() - started)
        pattern = task.get("pattern")
        if pattern and not re.fullmatch(str(pattern), expr):
            return VerifyResult(
                0.0, "fail", "expression does not match the required pattern", time.monotonic() - started
            )
        result = await self.evaluate(expr)
        iso = result.isolation
        if result.verdict is not Verdict.PASS or result.value is None:
            return VerifyResult(0.0, str(result.verdict), result.detail, result.elapsed_s, iso)
        try:
            got = read_literal(result.value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return VerifyResult(0.0, "fail", "value is not a literal", result.elapsed_s, iso)
        ok = values_equal(got, task["target"], rel_tol=self.rel_tol, abs_tol=self.abs_tol)
        detail = f"value {result.value[:60]} {'=' if ok else '≠'} target {task['target']!r}"[:200]
        return VerifyResult(1.0 if ok else 0.0, "pass" if ok else "fail", detail, result.elapsed_s, iso)


def _memo_cost(expr: str, result: SandboxResult) -> int:
    """Bytes a memo entry holds, about: its texts (as UTF-8 at most 4 bytes a character) and the objects around them."""
    return 4 * (len(expr) + len(result.value or "") + len(result.detail) + len(result.isolation)) + 400
