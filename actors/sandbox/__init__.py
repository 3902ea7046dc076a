"""The sandbox: a pool of warm worker processes that run untrusted code under isolation and limits.

A library: the `verify` kind and the code verifiers run jobs through `SandboxPool`; ``flywheel sandbox run`` runs one
program from the command line. See `actors.sandbox._pool` for the contract and what it does not protect against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topology import lazy_exports

if TYPE_CHECKING:
    from actors.sandbox._isolation import Isolation as Isolation
    from actors.sandbox._isolation import IsolationRefused as IsolationRefused
    from actors.sandbox._pool import PoolStatistics as PoolStatistics
    from actors.sandbox._pool import SandboxLimits as SandboxLimits
    from actors.sandbox._pool import SandboxPool as SandboxPool
    from actors.sandbox._verdict import SandboxResult as SandboxResult
    from actors.sandbox._verdict import Verdict as Verdict

_EXPORTS = {
    "Isolation": "_isolation",
    "IsolationRefused": "_isolation",
    "PoolStatistics": "_pool",
    "SandboxLimits": "_pool",
    "SandboxPool": "_pool",
    "SandboxResult": "_verdict",
    "Verdict": "_verdict",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "Isolation",
    "IsolationRefused",
    "PoolStatistics",
    "SandboxLimits",
    "SandboxPool",
    "SandboxResult",
    "Verdict",
]
