"""Verifier registry: names → builtin verifiers, ``module:function`` → a user's function."""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any

from actors.domains._verifiers._base import Verifier, VerifierError, VerifyResult
from actors.domains._verifiers._json_fields import JsonFieldsVerifier
from actors.domains._verifiers._math import MathVerifier
from actors.domains._verifiers._python import PythonExprVerifier, PythonTestsVerifier
from actors.sandbox import SandboxPool

_SANDBOXED = {"python-tests": PythonTestsVerifier, "python-expr": PythonExprVerifier}
_PLAIN: dict[str, Callable[..., Verifier]] = {"math": MathVerifier, "json-fields": JsonFieldsVerifier}


def verifier_names() -> list[str]:
    return sorted([*_SANDBOXED, *_PLAIN])


PLAIN_VERIFIERS = frozenset(_PLAIN)  # builtins that score in this process, without the sandbox


def needs_sandbox(name: str) -> bool:
    return name in _SANDBOXED


class FunctionVerifier:
    """Wraps a user's ``fn(completion_text, task)`` (sync or async)."""

    def __init__(self, name: str, fn: Callable[..., Any], config: Mapping[str, Any]) -> None:
        self.name, self.fn, self.config = name, fn, dict(config)

    async def verify(self, completion_text: str, task: Mapping[str, Any]) -> VerifyResult:
        started = time.monotonic()
        kwargs = {"config": self.config} if self.config else {}
        try:
            out = self.fn(completion_text, task, **kwargs)
            if inspect.isawaitable(out):
                out = await out
        except Exception as exc:
            return VerifyResult(
                0.0,
                "internal_error",
                f"{self.name} raised {type(exc).__name__}: {exc}"[:300],
                time.monotonic() - started,
            )
        elapsed = time.monotonic() - started
        if isinstance(out, VerifyResult):
            return out
        if isinstance(out, Mapping) and "reward" in out:
            reward = float(out["reward"])
            return VerifyResult(
                reward,
                str(out.get("verdict", "pass" if reward >= 1.0 else "fail")),
                str(out.get("detail", "")),
                elapsed,
            )
        if isinstance(out, bool | int | float):
            reward = float(out)
            return VerifyResult(reward, "pass" if reward >= 1.0 else "fail", "", elapsed)
        return VerifyResult(
            0.0, "internal_error", f"{self.name} returned {type(out).__name__}, expected a float", elapsed
        )


def _import_function(target: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise VerifierError(
            f"unknown verifier {target!r}: expected one of {', '.join(verifier_names())} or module:function"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise VerifierError(
            f"verifier {target!r}: cannot import module {module_name!r} ({type(exc).__name__}: {exc})"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise VerifierError(f"verifier {target!r}: module {module_name!r} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]


def build_verifier(name: str, config: Mapping[str, Any] | None = None, *, pool: SandboxPool | None = None) -> Verifier:
    """The verifier called ``name`` configured with the domain's ``verifier_config``."""
    config = dict(config or {})
    try:
        if name in _PLAIN:
            return _PLAIN[name](**config)
        if name in _SANDBOXED:
            if pool is None:
                raise VerifierError(f"verifier {name!r} runs code and needs a sandbox pool")
            sandboxed: Verifier = _SANDBOXED[name](pool, **config)
            return sandboxed
    except TypeError as exc:
        raise VerifierError(f"verifier {name!r}: bad verifier_config ({exc})") from None
    return FunctionVerifier(name, _import_function(name), config)
