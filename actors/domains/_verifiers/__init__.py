"""Verifiers: turn a completion and a task's verifier fields into a reward, by name.

Contract: a verifier is ``async def verify(completion_text, task) -> VerifyResult`` where ``task`` is the
task's ``verifier_fields`` mapping. Builtins are registered by name (``math``, ``python-tests``,
``python-expr``, ``json-fields``) and built from the domain's ``verifier_config``; any other name of the
form ``module:function`` is a user's function (sync or async) taking ``(completion_text, task)`` and
returning a float, a bool, a ``VerifyResult`` or a mapping with ``reward`` (and optionally ``verdict``,
``detail``), called in a killable, memory-limited helper process. Verifiers that execute code get the shared
``SandboxPool``. Every result says where the answer was checked (``VerifyResult.isolation``), and a hostile
answer costs at most its verifier's time limit: the sandbox's wall clock, the helper's time limit, or (for the
text-only checks done in-process) linear time in the capped text.
"""

from actors.domains._verifiers._base import Verifier, VerifierError, VerifyResult
from actors.domains._verifiers._registry import build_verifier, verifier_names

__all__ = ["Verifier", "VerifierError", "VerifyResult", "build_verifier", "verifier_names"]
