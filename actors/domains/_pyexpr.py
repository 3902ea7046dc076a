"""`builtin:pyexpr` — put Python operators between given digits so the expression hits a target.

Prompt: `3 5 2 -> 17 (python, +-*):`; a correct completion is `3*5+2`. The digits must stay in the given
order, each used once, joined only by the listed operators (spaces allowed). The target is the value of a
uniformly drawn operator choice, so every task has a solution; the reference is the first solution in
operator order `+ - *` (a fixed rule the warm start can imitate).

Verifier fields (for the `python-expr` verifier, which evaluates the completion in the sandbox):
`{"target": 17, "pattern": "<regex>"}` — the completion (stripped) must `re.fullmatch` `pattern` and
evaluate to `target`. Without the pattern the literal `17` would score, so the verifier must apply it.
Key: `pyexpr|<digits>|<target>|<operators>`. Bounds: terms 2–5 → prompts ≤ 40 characters, answers ≤ 9.

`parse(prompt)` rebuilds the task of any such prompt, so served traffic that asked one can be scored.

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

_PROMPT = re.compile(r"^([1-9](?: [1-9]){1,4}) -> (-?\d+) \(python, ([-+*]{1,3})\):$")


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
        draw = _task(digits, evaluate_int_expression(digits, chosen), self._operators)
        assert draw is not None  # the drawn operators reach the target
        return draw

    def parse(self, prompt: str) -> Draw | None:
        """The task whose prompt is ``prompt`` (``3 5 2 -> 17 (python, +-*):``), or None when it is not one (or no
        choice of the listed operators reaches its target)."""
        match = _PROMPT.match(prompt)
        if match is None or len(set(match.group(3))) != len(match.group(3)):
            return None
        digits = [int(d) for d in match.group(1).split()]
        return _task(digits, int(match.group(2)), sorted(match.group(3), key="+-*".index))


def _task(digits: list[int], target: int, operators: list[str]) -> Draw | None:
    reference = next(
        (
            _join(digits, ops)
            for ops in itertools.product(operators, repeat=len(digits) - 1)
            if evaluate_int_expression(digits, list(ops)) == target
        ),
        None,
    )
    if reference is None:
        return None
    shown = " ".join(map(str, digits))
    op_class = "[" + "".join(re.escape(op) for op in operators) + "]"
    pattern = r"\s*" + rf"\s*{op_class}\s*".join(map(str, digits)) + r"\s*"
    return Draw(
        key=f"pyexpr|{''.join(map(str, digits))}|{target}|{''.join(operators)}",
        prompt=f"{shown} -> {target} (python, {''.join(operators)}):",
        reference=reference,
        verifier_fields={"target": target, "pattern": pattern},
    )


def _join(digits: list[int], ops: tuple[str, ...]) -> str:
    return str(digits[0]) + "".join(f"{op}{d}" for op, d in zip(ops, digits[1:], strict=True))
