"""Verifiers for replay tests: reward 1 when the completion is exactly the expected text; one that always fails."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def exact(completion_text: str, task: Mapping[str, Any]) -> float:
    return 1.0 if completion_text == task.get("expected") else 0.0


def broken(completion_text: str, task: Mapping[str, Any]) -> float:
    raise RuntimeError("the verifier's service is down")
