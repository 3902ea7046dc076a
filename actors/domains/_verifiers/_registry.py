"""Verifier registry: names → builtin verifiers, ``module:function`` → a user's function, run in a helper process.

A user's function is imported here once, when the verifier is built, so that a typo, or a signature that cannot take
``(completion_text, task)`` and the domain's ``verifier_config`` as ``config=``, is a one-line `VerifierError` at
start-up rather than an ``internal_error`` on every answer (``function_problem``; ``flywheel up`` runs the same check
at the domain's spec line). It is called in a killable, memory-limited helper process (see ``_helpers``): a function
that hangs on a hostile answer or grows without bound costs ``USER_TIMEOUT_S`` and a helper, never the caller's event
loop or memory. Its arguments (the completion, the task's fields, the domain's ``verifier_config`` as ``config=``) and
its result must therefore be JSON data (a ``VerifyResult`` is fine): a reward, or ``{"reward", "verdict", "detail"}``
where ``verdict`` is a short name (``MAX_VERDICT_CHARS``; a verdict made of the answer would be a counter per answer:
it becomes pass / fail, and the detail says what it was).
"""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any

from actors.domains._verifiers._base import Verifier, VerifierError, VerifyResult
from actors.domains._verifiers._helpers import HelperError, HelperMemoryError, HelperTimeout, shared_helpers
from actors.domains._verifiers._json_fields import JsonFieldsVerifier
from actors.domains._verifiers._math import MathVerifier
from actors.domains._verifiers._python import PythonExprVerifier, PythonTestsVerifier
from actors.sandbox import SandboxPool

_SANDBOXED = {"python-tests": PythonTestsVerifier, "python-expr": PythonExprVerifier}
_PLAIN: dict[str, Callable[..., Verifier]] = {"math": MathVerifier, "json-fields": JsonFieldsVerifier}
USER_TIMEOUT_S = 30.0  # a user's verifier function is killed after this (verdict timeout, reward 0)
USER_MEMORY_MB = 2048  # address space of the helper process that runs users' verifier functions
MAX_VERDICT_CHARS = 40  # a user's verdict is a name, counted per value (longer ones: pass / fail, said in the detail)


def verifier_names() -> list[str]:
    return sorted([*_SANDBOXED, *_PLAIN])


PLAIN_VERIFIERS = frozenset(_PLAIN)  # builtins that score in this process, without the sandbox


def needs_sandbox(name: str) -> bool:
    return name in _SANDBOXED


def config_keys(name: str) -> tuple[str, ...] | None:
    """The keys a domain's ``verifier_config`` may hold for the builtin verifier ``name`` (its keyword arguments), or
    None for a user's ``module:function``, which is handed whatever the config holds."""
    verifier: Any = _PLAIN.get(name) or _SANDBOXED.get(name)
    if verifier is None:
        return None
    parameters = inspect.signature(verifier).parameters.values()
    return tuple(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def task_problem(name: str, config: Mapping[str, Any], task: Mapping[str, Any]) -> str | None:
    """Why the builtin verifier ``name``, configured with the domain's ``verifier_config``, could score no answer to a
    task with these verifier fields (the message its ``verify`` would raise on every answer), or None: it could, or
    ``name`` is a user's ``module:function``, which reads what it likes. Cheap: no verifier is built."""
    verifier: Any = _PLAIN.get(name) or _SANDBOXED.get(name)
    check = getattr(verifier, "task_problem", None)
    return check(task, **config) if check is not None else None


class FunctionVerifier:
    """A user's ``fn(completion_text, task)`` (sync or async), called in a helper process."""

    def __init__(
        self,
        name: str,
        config: Mapping[str, Any],
        *,
        timeout_s: float = USER_TIMEOUT_S,
        memory_mb: int = USER_MEMORY_MB,
        pass_config: bool = False,
        processes: int = 2,
    ) -> None:
        self.name, self.config, self.timeout_s, self.memory_mb = name, dict(config), timeout_s, memory_mb
        self.processes = processes
        # config= goes to a function that declares it (see `takes_config`) and whenever verifier_config is not empty
        self.pass_config = bool(pass_config) or bool(self.config)

    async def verify(self, completion_text: str, task: Mapping[str, Any]) -> VerifyResult:
        started = time.monotonic()
        kwargs = {"config": self.config} if self.pass_config else {}
        # a pool per function: one that hangs on every answer holds its own helpers, not another domain's
        helpers = shared_helpers(
            f"user-verifier-{self.name}-{self.memory_mb}mb", processes=self.processes, memory_mb=self.memory_mb
        )
        try:
            out = await helpers.call(self.name, (completion_text, dict(task)), kwargs, timeout_s=self.timeout_s)
        except HelperTimeout as exc:  # "<name> took longer than …", or "importing <module> took longer than …"
            detail = str(exc)
            return VerifyResult(0.0, "timeout", detail, time.monotonic() - started, "helper")
        except HelperMemoryError:
            detail = f"{self.name} ran out of memory ({self.memory_mb} MB)"
            return VerifyResult(0.0, "memory_limit", detail, time.monotonic() - started, "helper")
        except HelperError as exc:
            detail = f"{self.name} raised {exc}"[:300]
            return VerifyResult(0.0, "internal_error", detail, time.monotonic() - started, "helper")
        elapsed = time.monotonic() - started
        if isinstance(out, Mapping) and "reward" in out:
            if not isinstance(out["reward"], bool | int | float):  # as for a bare result: "1" is no reward, nor None
                kind = type(out["reward"]).__name__
                detail = f"{self.name} returned a reward of type {kind}, expected a float"
                return VerifyResult(0.0, "internal_error", detail, elapsed, "helper")
            reward = float(out["reward"])
            verdict, detail = out.get("verdict"), str(out.get("detail", ""))
            if verdict is not None and not (isinstance(verdict, str) and 0 < len(verdict) <= MAX_VERDICT_CHARS):
                # a verdict is a name that gets counted (verdict.<name>): one made of the answer would be a counter
                # per answer; what it said is kept in the detail
                detail = f"verdict {str(verdict)[:60]!r} is not a name of 1-{MAX_VERDICT_CHARS} characters; {detail}"
                verdict = None
            return VerifyResult(
                reward, verdict or ("pass" if reward >= 1.0 else "fail"), detail[:300], elapsed, "helper"
            )
        if isinstance(out, bool | int | float):
            reward = float(out)
            return VerifyResult(reward, "pass" if reward >= 1.0 else "fail", "", elapsed, "helper")
        return VerifyResult(
            0.0, "internal_error", f"{self.name} returned {type(out).__name__}, expected a float", elapsed, "helper"
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


def takes_config(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` declares a ``config`` parameter (or ``**kwargs``): it is then handed the domain's
    ``verifier_config`` as ``config=`` even when that is empty (``{}``), so a function written to read its config
    needs no default for it."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == "config" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) or p.kind is p.VAR_KEYWORD
        for p in parameters
    )


def function_problem(target: str, config: Mapping[str, Any]) -> str | None:
    """Why the user's ``module:function`` ``target`` could score no answer when handed ``config`` (the domain's
    ``verifier_config``), or None: it imports, is callable and takes ``(completion_text, task)`` plus ``config=`` when
    the config is not empty. Imports the user's module (the caller decides whether that may happen)."""
    try:
        fn = _import_function(target)
    except VerifierError as exc:
        return str(exc)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables have none to read: let the call decide
        return None
    kwargs = {"config": dict(config)} if config or takes_config(fn) else {}
    try:
        signature.bind("", {}, **kwargs)
    except TypeError:
        shown = f"{target.partition(':')[2]}{signature}"
        if config:
            try:
                signature.bind("", {})
            except TypeError:
                pass
            else:  # the arguments fit; only config= does not
                return (
                    f"verifier {target!r}: verifier_config is handed to it as config=, but {shown} takes no "
                    "'config' argument (add one, or remove verifier_config)"
                )
        return f"verifier {target!r}: expected a function taking (completion_text, task), got {shown}"
    return None


def build_verifier(
    name: str,
    config: Mapping[str, Any] | None = None,
    *,
    pool: SandboxPool | None = None,
    user_timeout_s: float | None = None,
    user_processes: int = 2,
) -> Verifier:
    """The verifier called ``name`` configured with the domain's ``verifier_config``.

    ``user_timeout_s`` bounds one call of a ``module:function`` verifier (default ``USER_TIMEOUT_S``);
    ``user_processes`` is how many helper processes run its calls (calls at once).
    """
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
    problem = function_problem(name, config)  # fail at build time, with one line, rather than on every answer
    if problem is not None:
        raise VerifierError(problem)
    pass_config = takes_config(_import_function(name))
    return FunctionVerifier(
        name, config, timeout_s=user_timeout_s or USER_TIMEOUT_S, pass_config=pass_config, processes=user_processes
    )
