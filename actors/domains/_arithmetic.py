"""`builtin:arithmetic` — integer expressions like `37+5*12=`; the answer is the value (`97`).

Contract: operands are uniform in [0, 10**digits); exactly `ops` operators drawn from `operators`;
Python precedence (`*` before `+ -`); the reference is `str(eval(expression))`, which the `math` verifier
receives as `verifier_fields = {"answer": "<value>"}`. Key: `arithmetic|<expression>`.
Bounds (checked at construction): digits 1–4, ops 1–3 → prompts ≤ 20 characters, answers ≤ 17.

`parse(prompt)` rebuilds the task of any such prompt (`12+3*4=`), whatever the options, so served traffic that
asked one can be scored.

Non-goals: division, parentheses, non-integers (a character-level tiny model must be able to learn it).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import ClassVar

from actors.domains._builtin import Draw, check_range
from actors.domains._task import SourceError

__all__ = ["ArithmeticGenerator", "ArithmeticOptions", "evaluate_int_expression"]

_PROMPT = re.compile(r"^(\d{1,4})((?:[-+*]\d{1,4}){1,3})=$")
_TERM = re.compile(r"([-+*])(\d+)")


@dataclass(frozen=True)
class ArithmeticOptions:
    digits: int = 2  # maximum digits per operand (1–4)
    ops: int = 1  # number of operators per expression (1–3)
    operators: str = "+-"  # non-empty subset of "+-*"


def evaluate_int_expression(numbers: list[int], operators: list[str]) -> int:
    """Value of n0 o0 n1 o1 … with `*` binding tighter than `+`/`-` (Python's rules), without eval."""
    terms: list[int] = [numbers[0]]
    signs: list[int] = [1]
    for op, number in zip(operators, numbers[1:], strict=True):
        if op == "*":
            terms[-1] *= number
        else:
            terms.append(number)
            signs.append(1 if op == "+" else -1)
    return sum(sign * term for sign, term in zip(signs, terms, strict=True))


class ArithmeticGenerator:
    name: ClassVar[str] = "arithmetic"

    def __init__(self, options: ArithmeticOptions) -> None:
        source = "builtin:arithmetic"
        check_range(source, "digits", options.digits, 1, 4)
        check_range(source, "ops", options.ops, 1, 3)
        if not options.operators or set(options.operators) - set("+-*"):
            raise SourceError(
                f"{source}: option 'operators': expected a non-empty subset of '+-*', got {options.operators!r}",
                option="operators",
            )
        self.options = options
        self._operators = sorted(set(options.operators))

    def describe(self) -> str:
        o = self.options
        return f"digits={o.digits},ops={o.ops},operators={''.join(self._operators)}"

    def draw(self, rng: random.Random) -> Draw:
        high = 10**self.options.digits - 1
        numbers = [rng.randint(0, high) for _ in range(self.options.ops + 1)]
        operators = [rng.choice(self._operators) for _ in range(self.options.ops)]
        expression = str(numbers[0]) + "".join(f"{op}{n}" for op, n in zip(operators, numbers[1:], strict=True))
        answer = str(evaluate_int_expression(numbers, operators))
        return Draw(
            key=f"arithmetic|{expression}",
            prompt=f"{expression}=",
            reference=answer,
            verifier_fields={"answer": answer},
        )

    def parse(self, prompt: str) -> Draw | None:
        """The task whose prompt is ``prompt`` (``37+5*12=``), or None when it is not an arithmetic prompt."""
        match = _PROMPT.match(prompt)
        if match is None:
            return None
        terms = _TERM.findall(match.group(2))
        numbers = [int(match.group(1)), *(int(n) for _, n in terms)]
        answer = str(evaluate_int_expression(numbers, [op for op, _ in terms]))
        expression = prompt[:-1]
        return Draw(key=f"arithmetic|{expression}", prompt=prompt, reference=answer, verifier_fields={"answer": answer})
