"""`builtin:pyexpr` — put Python operators between given digits so the expression hits a target.

Prompt: `3 5 2 -> 17 (python, +-*):`; a correct completion is `3*5+2`. The digits must stay in the given
order, each used once, joined only by the listed operators (spaces allowed). The target is the value of a
uniformly drawn operator choice, so every task has a solution; the reference is the first solution in
operator order `+ - *` (a fixed rule the warm start can imitate).

Verifier fields (for the `python-expr` verifier, which evaluates the completion in the sandbox):
`{"target": 17, "pattern": "<regex>"}` — the completion (stripped) must `re.fullmatch` `pattern` and
evaluate to `target`. Without the pattern the literal `17` would score, so the verifier must apply it.
Key: `pyexpr|<digits>|<target>|<operators>`. Bounds: terms 2–5 → prompts ≤ 40 characters, answers ≤ 9.

Non-goals: parentheses, multi-digit operands, division.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass
from typing import ClassVar

from actors.domains._arithmetic import evaluate_int_expression
from actors.domains._builtin import Draw, check_range
from actors.domains._task import SourceError

__all__ = ["PyExprGenerator", "PyExprOptions"]


@dataclass(frozen=True)
class PyExprOptions:
    terms: int = 3  # number of digits to combine (2–5)
    operators: str = "+-*"  # non-empty subset of "+-*"


class PyExprGenerator:
    name: ClassVar[str] = "pyexpr"

    def __init__(self, options: PyExprOptions) -> None:
        source = "builtin:pyexpr"
        check_range(source, "terms", options.terms, 2, 5)
        if not options.operators or set(options.operators) - set("+-*"):
            raise SourceError(
                f"{source}: option 'operators': expected a non-empty subset of '+-*', got {options.operators!r}",
                option="operators",
            )
        self.options = options
        # Fixed order + - * so the reference rule does not depend on how the option was spelled.
        self._operators = [op for op in "+-*" if op in options.operators]

    def describe(self) -> str:
        return f"terms={self.options.terms},operators={''.join(self._operators)}"

    def draw(self, rng: random.Random) -> Draw:
        digits = [rng.randint(1, 9) for _ in range(self.options.terms)]
        chosen = [rng.choice(self._operators) for _ in range(self.options.terms - 1)]
        target = evaluate_int_expression(digits, chosen)
        reference = next(
            _join(digits, ops)
            for ops in itertools.product(self._operators, repeat=len(chosen))
            if evaluate_int_expression(digits, list(ops)) == target
        )
        shown = " ".join(map(str, digits))
        op_class = "[" + "".join(re.escape(op) for op in self._operators) + "]"
        pattern = r"\s*" + rf"\s*{op_class}\s*".join(map(str, digits)) + r"\s*"
        return Draw(
            key=f"pyexpr|{''.join(map(str, digits))}|{target}|{''.join(self._operators)}",
            prompt=f"{shown} -> {target} (python, {''.join(self._operators)}):",
            reference=reference,
            verifier_fields={"target": target, "pattern": pattern},
        )


def _join(digits: list[int], ops: tuple[str, ...]) -> str:
    return str(digits[0]) + "".join(f"{op}{d}" for op, d in zip(ops, digits[1:], strict=True))
