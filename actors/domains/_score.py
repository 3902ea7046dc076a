"""Pure scoring: (domain, completion, verifier fields) → reward, verdict, detail, timing.

The verify actor calls ``Scorer.score`` for each rollout; nothing here touches the bus. Verifiers are
built once per domain from the spec's ``verifier`` and ``verifier_config`` (errors surface at
construction, as ``VerifierError`` with one line). A verifier that raises on a task turns into
``internal_error`` with reward 0 — one bad task never stops the actor.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from actors.domains._verifiers import Verifier, VerifierError, VerifyResult, build_verifier
from actors.domains._verifiers._registry import PLAIN_VERIFIERS
from actors.sandbox import SandboxPool

_log = structlog.get_logger("flywheel.verify")


@dataclass(frozen=True)
class DomainVerifier:
    verifier: str  # math | python-tests | python-expr | json-fields | module:function
    config: Mapping[str, Any]
    timeout_s: float | None = None  # a module:function verifier's limit per call (None: its default)
    processes: int = 2  # a module:function verifier's helper processes (calls at once)


class Scorer:
    def __init__(self, domains: Mapping[str, DomainVerifier], *, pool: SandboxPool | None = None) -> None:
        self._verifiers: dict[str, Verifier] = {}
        for name, dom in domains.items():
            try:
                self._verifiers[name] = build_verifier(
                    dom.verifier, dom.config, pool=pool, user_timeout_s=dom.timeout_s, user_processes=dom.processes
                )
            except VerifierError as exc:
                raise VerifierError(f"domain {name!r}: {exc}") from None

    def memo_stats(self) -> dict[str, int]:
        """Sandbox jobs run and expressions answered from a verifier's memo, per domain that has one."""
        out: dict[str, int] = {}
        for name, verifier in self._verifiers.items():
            if hasattr(verifier, "memo_hits"):
                out[f"sandbox_runs.{name}"] = int(getattr(verifier, "sandbox_runs", 0))
                out[f"memo_hits.{name}"] = int(verifier.memo_hits)
        return out

    def in_process(self, domain: str) -> bool:
        """True when ``domain``'s verifier is a builtin that runs in this process (math, json-fields): scoring
        a group's completions one after another then costs no task per completion, and waits on nothing that
        running them concurrently would overlap."""
        verifier = self._verifiers.get(domain)
        return verifier is not None and verifier.name in PLAIN_VERIFIERS

    async def score(self, domain: str, completion_text: str, task: Mapping[str, Any]) -> VerifyResult:
        verifier = self._verifiers.get(domain)
        if verifier is None:
            return VerifyResult(0.0, "internal_error", f"no verifier for domain {domain!r}")
        return await score(completion_text, task, verifier=verifier)


async def score(completion_text: str, task: Mapping[str, Any], *, verifier: Verifier) -> VerifyResult:
    """Score one completion; never raises for anything the completion or the task contains."""
    started = time.monotonic()
    try:
        result = await verifier.verify(completion_text, task)
    except Exception as exc:
        result = VerifyResult(0.0, "internal_error", f"{type(exc).__name__}: {exc}"[:300])
    if not 0.0 <= result.reward <= 1.0 or result.reward != result.reward:
        result = VerifyResult(0.0, "internal_error", f"reward {result.reward!r} outside [0, 1]", 0.0, result.isolation)
    elapsed = time.monotonic() - started
    if result.verdict != "pass":
        _log.debug("verify_verdict", verifier=verifier.name, verdict=result.verdict, detail=result.detail[:200])
    return VerifyResult(result.reward, result.verdict, result.detail, result.elapsed_s or elapsed, result.isolation)
