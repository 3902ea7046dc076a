"""The `verify` actor kind: sandbox pool, verdicts, verifiers and pure scoring.

Its config model lives in `actors.verify._config` (imported by `actors`); this package re-exports the
runtime pieces.
"""

from ._isolation import Isolation, IsolationRefused
from ._pool import PoolStatistics, SandboxLimits, SandboxPool
from ._score import DomainVerifier, Scorer, score
from ._verdict import SandboxResult, Verdict
from ._verifiers import Verifier, VerifierError, VerifyResult, build_verifier, verifier_names

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
