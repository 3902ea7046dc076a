"""The verifier protocol and its result type."""

from __future__ import annotations

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

    def as_dict(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "verdict": self.verdict,
            "detail": self.detail,
            "elapsed_s": self.elapsed_s,
        }


class Verifier(Protocol):
    name: str

    async def verify(self, completion_text: str, task: Mapping[str, Any]) -> VerifyResult: ...
