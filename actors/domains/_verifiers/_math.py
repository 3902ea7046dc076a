"""``math`` verifier: is the completion's final answer equal to the reference answer?

Extraction (first that applies): the last ``\\boxed{...}``; the text after the last "answer is",
"answer:" or "####"; otherwise the last number in the text. Comparison: both sides parsed exactly as
rationals (integers, decimals, ``a/b``, ``\\frac{a}{b}``, thousands separators, a trailing ``%`` is kept as
a percent sign and compared literally) — no float rounding; when that fails, as simple symbolic forms
with sympy (``sqrt(2)/2`` = ``1/sqrt(2)``, ``2*x+1`` = ``1+2x``).

Safety: sympy's parser evaluates Python, so text reaches it only after a whitelist (digits, operators,
parentheses, single-letter symbols and a few function names; no dots after letters, no underscores,
no quotes, no brackets), a length cap, and a structural check that refuses huge powers and numbers
before anything is simplified. Even so a small expression can expand without bound
(``(a+b+c+d+f+g+h+k)^64``), so every symbolic comparison — and every comparison of a long answer — runs in a
helper process with an address-space limit (``HELPER_MEMORY_MB``) that is killed at ``SYMPY_TIMEOUT_S``
(verdict ``timeout``, reward 0; ``memory_limit`` when it runs out of memory first): nothing keeps a thread busy
or grows this process's memory after the verdict. The common case — a short numeric answer — is decided here,
with regexes and a ``Fraction``, in linear time. Non-goals: units, intervals, sets, multiple answers, LaTeX
beyond ``\\frac``, ``\\sqrt``, ``\\cdot``, ``\\pi``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from actors.domains._verifiers._base import AST_LOCK, VerifierError, VerifyResult
from actors.domains._verifiers._helpers import (
    HelperError,
    HelperMemoryError,
    HelperPool,
    HelperTimeout,
    shared_helpers,
)

_BOXED = re.compile(r"\\boxed\s*\{")
_ANSWER = re.compile(r"(?:answer\s*(?:is|:|=)|####)\s*(.+)", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|[-+]?\.\d+")
_SAFE = re.compile(r"^[0-9a-z+\-*/^(). ]{1,80}$")
_FUNCS = {"sqrt", "pi", "exp", "log", "sin", "cos", "tan"}
SYMPY_TIMEOUT_S = 2.0  # a symbolic comparison (or a long answer's) is killed after this
HELPER_MEMORY_MB = 1024  # address space of the helper process that runs them
_INLINE_CHARS = 200  # answers up to this long are compared on the event loop (regexes and a Fraction: microseconds)
ANSWER_FIELD = "answer"  # the task's field holding the reference answer, unless verifier_config names another


def _boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` whose braces close (one pass: braces are matched once)."""
    closing: dict[int, int] = {}
    opened: list[int] = []
    for i, char in enumerate(text):
        if char == "{":
            opened.append(i)
        elif char == "}" and opened:
            closing[opened.pop()] = i
    last = None
    for m in _BOXED.finditer(text):
        end = closing.get(m.end() - 1)
        if end is not None:
            last = text[m.end() : end]
    return last


def extract_answer(text: str) -> str | None:
    """The final answer in ``text``, or None when there is nothing answer-like."""
    boxed = _boxed(text)
    if boxed is not None:
        return boxed.strip()
    matches = list(_ANSWER.finditer(text))
    if matches:
        candidate = matches[-1].group(1).strip().splitlines()[0].strip()
        if candidate:
            return candidate
    numbers = _NUMBER.findall(text)
    return numbers[-1].strip() if numbers else None


def _clean(text: str) -> str:
    s = text.strip().strip("$").strip()
    s = re.sub(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"(\1)/(\2)", s)
    s = re.sub(r"\\sqrt\s*\{([^{}]*)\}", r"sqrt(\1)", s)
    s = (
        s.replace("\\cdot", "*")
        .replace("\\times", "*")
        .replace("\\pi", "pi")
        .replace("\\left", "")
        .replace("\\right", "")
    )
    s = s.replace("{", "(").replace("}", ")").replace("−", "-")
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)  # thousands separators
    return s.rstrip(".").strip()


def parse_exact(text: str) -> Fraction | None:
    """An exact rational for integers, decimals, a/b and (a)/(b); None otherwise."""
    s = _clean(text).replace(" ", "")
    m = re.fullmatch(r"\(?([-+]?\d+(?:\.\d+)?|[-+]?\.\d+)\)?(?:/\(?([-+]?\d+(?:\.\d+)?)\)?)?", s)
    if not m or len(s) > 200:
        return None
    try:
        value = Fraction(m.group(1))
        if m.group(2) is not None:
            value /= Fraction(m.group(2))
    except (ValueError, ZeroDivisionError):
        return None
    return value


def _sympy_expr(text: str) -> Any:
    s = _clean(text).lower().replace("^", "**")
    if not _SAFE.match(s) or re.search(r"[a-z]\s*\.|\.\s*[a-z]", s) or "**" in s.replace("**", "", 1):
        return None  # two power operators can already be astronomically large: refuse
    if any(word not in _FUNCS and len(word) > 1 for word in re.findall(r"[a-z]+", s)):
        return None
    import sympy
    from sympy.parsing.sympy_parser import (
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    names = {name: getattr(sympy, name) for name in _FUNCS}
    names.update({c: sympy.Symbol(c) for c in "abcdfghjkmnqrstuvwxyz"})
    names["E"] = sympy.E
    try:
        with AST_LOCK:  # evaluate=False parses through `ast` (see AST_LOCK)
            expr = parse_expr(
                s,
                local_dict=names,
                global_dict={"__builtins__": {}, **vars(sympy)},
                transformations=(*standard_transformations, implicit_multiplication_application),
                evaluate=False,
            )
    except Exception:
        return None
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Pow) and node.exp.is_number and abs(sympy.N(node.exp)) > 64:
            return None
        if isinstance(node, sympy.Integer) and abs(int(node)) > 10**30:
            return None
    return expr


def symbolic_equal(a: str, b: str) -> bool:
    import sympy

    left, right = _sympy_expr(a), _sympy_expr(b)
    if left is None or right is None:
        return False
    try:
        return bool(sympy.simplify(left - right) == 0)
    except Exception:
        return False


def exact_equal(candidate: str, reference: str) -> bool | None:
    """The cheap part of :func:`answers_equal`: True or False when the cleaned texts or the exact rationals
    decide, None when only sympy can."""
    if _clean(candidate) == _clean(reference):
        return True
    x, y = parse_exact(candidate), parse_exact(reference)
    if x is not None and y is not None:
        return x == y
    return None


def answers_equal(candidate: str, reference: str) -> bool:
    """Synchronous core: exact rational comparison, then (guarded) sympy."""
    decided = exact_equal(candidate, reference)
    return symbolic_equal(candidate, reference) if decided is None else decided


class MathVerifier:
    name = "math"

    def __init__(self, *, answer_field: str = ANSWER_FIELD) -> None:
        self.answer_field = answer_field

    @staticmethod
    def task_problem(task: Mapping[str, Any], /, *, answer_field: str = ANSWER_FIELD, **_config: Any) -> str | None:
        """Why no answer to ``task`` can be scored (its fields lack the reference answer), or None."""
        return None if answer_field in task else f"math verifier: the task has no {answer_field!r} field"

    async def verify(self, completion_text: str, task: Mapping[str, Any]) -> VerifyResult:
        started = time.monotonic()
        problem = self.task_problem(task, answer_field=self.answer_field)
        if problem is not None:
            raise VerifierError(problem)
        reference = str(task[self.answer_field])
        answer = extract_answer(completion_text[-4000:])
        if answer is None:
            return VerifyResult(0.0, "fail", "no answer found", time.monotonic() - started)
        # short answers (nearly all: a number) are decided here; sympy (and, for long answers, the exact part
        # too) runs in a memory-limited helper process that is killed at the time limit
        short = max(len(answer), len(reference)) <= _INLINE_CHARS
        ok = exact_equal(answer, reference) if short else None
        isolation = "in-process"
        if ok is None:
            isolation = "helper"
            target = f"{__name__}:{'symbolic_equal' if short else 'answers_equal'}"
            failed = ""
            try:
                ok = bool(await _helpers().call(target, (answer, reference), timeout_s=SYMPY_TIMEOUT_S))
            except HelperTimeout:
                verdict, failed = "timeout", f"comparing {answer[:40]!r} took longer than {SYMPY_TIMEOUT_S:g} s"
            except HelperMemoryError:
                verdict, failed = "memory_limit", f"comparing {answer[:40]!r} ran out of memory"
            except HelperError as exc:
                verdict, failed = "internal_error", f"comparing {answer[:40]!r}: {exc}"[:200]
            if failed:
                return VerifyResult(0.0, verdict, failed, time.monotonic() - started, isolation)
        detail = f"answer {answer[:60]!r} {'=' if ok else '≠'} {reference[:60]!r}"
        elapsed = time.monotonic() - started
        return VerifyResult(1.0 if ok else 0.0, "pass" if ok else "fail", detail, elapsed, isolation)


def _helpers() -> HelperPool:
    return shared_helpers("math", memory_mb=HELPER_MEMORY_MB, preload=(__name__, "sympy", "sympy.parsing.sympy_parser"))
