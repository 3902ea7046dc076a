"""Spec issues: one located message per user mistake, and the exception that carries all of them.

Contract: every problem found while loading a spec becomes a `SpecIssue` that names the file, the 1-based
line and column, the dotted key path ("actors.generator.replicas"; "" for the document itself) and a
message phrased "expected …, got …". `SpecError` carries *all* errors found in one run, so a user fixes
a spec in one pass instead of one error per run. Warnings (e.g. resources this machine cannot give) are
issues with ``severity="warning"``; they never make a spec invalid.

Non-goals: no colour, no source excerpts — one grep-able line per issue, like a compiler.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a spec file, located at ``file:line:col`` (1-based) and a dotted key path."""

    file: str
    line: int
    col: int
    path: str  # "actors.generator.replicas", "domains.math.weight"; "" for the document itself
    message: str  # "expected an integer >= 1, got 0"
    severity: Severity = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}:"
        what = f"warning: {self.message}" if self.severity == "warning" else self.message
        return f"{where} {self.path}: {what}" if self.path else f"{where} {what}"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"


def format_path(path: Iterable[str | int]) -> str:
    """``("actors", "gen", "consumes", 1)`` → ``"actors.gen.consumes[1]"``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


class SpecError(Exception):
    """A spec could not be loaded; ``issues`` lists every error (and warning) found, in file order."""

    def __init__(self, issues: Iterable[SpecIssue]) -> None:
        self.issues: list[SpecIssue] = sorted(issues, key=lambda i: (i.file, i.line, i.col))
        self.errors: list[SpecIssue] = [i for i in self.issues if i.is_error]
        count = len(self.errors)
        head = f"{count} error{'s' if count != 1 else ''} in spec"
        super().__init__("\n".join([head, *(str(i) for i in self.issues)]))


__all__ = ["Severity", "SpecError", "SpecIssue", "format_path"]
