"""``json-fields`` verifier: the first JSON object in the completion, compared field by field.

Task fields: ``{"fields": {name: expected, ...}}``. Config: ``mode`` (default for every field) and
``modes`` (per field): ``exact`` (JSON equality, type included; 1 and 1.0 differ, True and 1 differ),
``normalized`` (strings compared after case folding, trimming and collapsing whitespace; other values
as exact), ``numeric`` (``rel_tol``/``abs_tol``; numeric strings accepted). Reward = fraction of expected
fields that match (partial credit); extra keys neither help nor hurt unless ``penalize_extra``.
No JSON object, or a malformed one → reward 0, verdict fail. Verdict pass only when every field matches.
Scored in this process: the text is capped (``max_chars``) and only the first 16 opening braces are tried, so a
hostile completion costs bounded time.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import Any, Literal

from actors.domains._verifiers._base import VerifierError, VerifyResult

Mode = Literal["exact", "normalized", "numeric"]
_MODES = ("exact", "normalized", "numeric")


_MAX_STARTS = 16  # opening braces tried: each try may parse far, so a text of braces cannot cost quadratic time


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` that starts at one of its first ``_MAX_STARTS`` opening braces."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    for _ in range(_MAX_STARTS):
        if start == -1:
            break
        try:
            value, _ = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


def _norm(value: Any) -> Any:
    return " ".join(value.casefold().split()) if isinstance(value, str) else value


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().replace(",", ""))
        except ValueError:
            return None
    return None


def field_matches(got: Any, want: Any, mode: Mode, *, rel_tol: float, abs_tol: float) -> bool:
    if mode == "numeric":
        g, w = _number(got), _number(want)
        return g is not None and w is not None and math.isclose(g, w, rel_tol=rel_tol, abs_tol=abs_tol)
    if mode == "normalized":
        got, want = _norm(got), _norm(want)
    return type(got) is type(want) and bool(got == want)


class JsonFieldsVerifier:
    name = "json-fields"

    def __init__(
        self,
        *,
        mode: Mode = "exact",
        modes: Mapping[str, Mode] | None = None,
        rel_tol: float = 1e-6,
        abs_tol: float = 1e-9,
        penalize_extra: bool = False,
        max_chars: int = 20_000,
    ) -> None:
        for name, m in {"mode": mode, **dict(modes or {})}.items():
            if m not in _MODES:
                raise VerifierError(f"json-fields verifier: {name} must be one of {', '.join(_MODES)}, got {m!r}")
        self.mode, self.modes = mode, dict(modes or {})
        self.rel_tol, self.abs_tol, self.penalize_extra, self.max_chars = (
            rel_tol,
            abs_tol,
            penalize_extra,
            max_chars,
        )

    @staticmethod
    def task_problem(task: Mapping[str, Any], /, **_config: Any) -> str | None:
        """Why no answer to ``task`` can be scored (its fields lack the expected fields), or None."""
        expected = task.get("fields")
        if isinstance(expected, Mapping) and expected:
            return None
        return "json-fields verifier: the task has no non-empty 'fields' mapping"

    async def verify(self, completion_text: str, task: Mapping[str, Any]) -> VerifyResult:
        started = time.monotonic()
        problem = self.task_problem(task)
        if problem is not None:
            raise VerifierError(problem)
        expected = task["fields"]
        got = first_json_object(completion_text[: self.max_chars])
        if got is None:
            return VerifyResult(0.0, "fail", "no JSON object found", time.monotonic() - started)
        matched = [
            k
            for k, want in expected.items()
            if k in got
            and field_matches(got[k], want, self.modes.get(k, self.mode), rel_tol=self.rel_tol, abs_tol=self.abs_tol)
        ]
        total = len(expected) + (len(set(got) - set(expected)) if self.penalize_extra else 0)
        reward = len(matched) / total
        missed = [k for k in expected if k not in matched]
        verdict = "pass" if reward == 1.0 else "fail"
        detail = f"{len(matched)}/{total} fields" + (
            f"; wrong or missing: {', '.join(map(str, missed))[:150]}" if missed else ""
        )
        return VerifyResult(reward, verdict, detail, time.monotonic() - started)
