"""The verifier protocol and its result type."""

from __future__ import annotations

import ast
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class VerifierError(ValueError):
    """A user-facing configuration problem (unknown verifier, bad config, unimportable function)."""


@dataclass(frozen=True)
class VerifyResult:
    reward: float  # in [0, 1] for builtins
    verdict: str  # "pass" | "fail" | a sandbox verdict ("timeout", "memory_limit", ...)
    detail: str = ""  # why: the extracted answer, the failing test, the mismatched fields
    elapsed_s: float = 0.0
    # where the answer was checked: a sandbox level ("bwrap", "unshare", "rlimits") for code, "helper" for a
    # killable, memory-limited helper process, "in-process" for parsing and comparing text here
    isolation: str = "in-process"

    def as_dict(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "verdict": self.verdict,
            "detail": self.detail,
            "elapsed_s": self.elapsed_s,
            "isolation": self.isolation,
        }


class Verifier(Protocol):
    name: str

    async def verify(self, completion_text: str, task: Mapping[str, Any]) -> VerifyResult: ...


# CPython 3.11 keeps one recursion-depth counter for converting between C and Python ASTs (`ast.parse`,
# `ast.literal_eval`, `compile` of an AST). Two threads converting at once can leave it wrong, and every later
# conversion in the process then fails with "SystemError: AST constructor recursion depth mismatch"
# (python/cpython gh-106905, fixed in 3.12). A caller may verify from several threads, so every AST conversion
# of ours goes through this lock, and the common literals are read without an AST at all.
AST_LOCK = threading.Lock()

_INT = re.compile(r"-?\d{1,4300}")
_FLOAT = re.compile(r"-?(?:\d+\.\d*(?:e[+-]?\d+)?|\d+e[+-]?\d+)")  # not inf/nan: literal_eval refuses those
_CONSTANTS: dict[str, Any] = {"True": True, "False": False, "None": None}


def read_literal(text: str) -> Any:
    """`ast.literal_eval(text)`: ints, floats, True/False/None directly, anything else under `AST_LOCK`.

    Raises what `literal_eval` raises (ValueError, SyntaxError, …) for text that is not a literal.
    """
    text = text.strip()
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if text in _CONSTANTS:
        return _CONSTANTS[text]
    with AST_LOCK:
        return ast.literal_eval(text)
