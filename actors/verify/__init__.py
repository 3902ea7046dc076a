"""The `verify` actor kind: sandbox pool, verdicts, verifiers and pure scoring.

Its config model lives in `actors.verify._config` (imported by `actors`); this package re-exports the
runtime pieces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors._lazy import lazy_exports

if TYPE_CHECKING:
    from ._isolation import Isolation as Isolation
    from ._isolation import IsolationRefused as IsolationRefused
    from ._pool import PoolStatistics as PoolStatistics
    from ._pool import SandboxLimits as SandboxLimits
    from ._pool import SandboxPool as SandboxPool
    from ._score import DomainVerifier as DomainVerifier
    from ._score import Scorer as Scorer
    from ._score import score as score
    from ._verdict import SandboxResult as SandboxResult
    from ._verdict import Verdict as Verdict
    from ._verifiers import Verifier as Verifier
    from ._verifiers import VerifierError as VerifierError
    from ._verifiers import VerifyResult as VerifyResult
    from ._verifiers import build_verifier as build_verifier
    from ._verifiers import verifier_names as verifier_names

_EXPORTS = {
    "DomainVerifier": "_score",
    "Isolation": "_isolation",
    "IsolationRefused": "_isolation",
    "PoolStatistics": "_pool",
    "SandboxLimits": "_pool",
    "SandboxPool": "_pool",
    "SandboxResult": "_verdict",
    "Scorer": "_score",
    "Verdict": "_verdict",
    "Verifier": "_verifiers",
    "VerifierError": "_verifiers",
    "VerifyResult": "_verifiers",
    "build_verifier": "_verifiers",
    "score": "_score",
    "verifier_names": "_verifiers",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "DomainVerifier",
    "Isolation",
    "IsolationRefused",
    "PoolStatistics",
    "SandboxLimits",
    "SandboxPool",
    "SandboxResult",
    "Scorer",
    "Verdict",
    "Verifier",
    "VerifierError",
    "VerifyResult",
    "build_verifier",
    "score",
    "verifier_names",
]
