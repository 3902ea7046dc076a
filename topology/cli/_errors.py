"""What a command shows a user instead of a traceback, when the error is theirs (or their machine's) to fix.

Contract: :func:`user_error` finds such an error whether it arrives bare or wrapped in the exception group that
an anyio task group raises around it (``flywheel up`` runs the topology inside one), so the command can print it
as one line. A group that also holds any other error is a bug, and stays a traceback.
"""

from __future__ import annotations


def user_error(exc: BaseException, expected: tuple[type[BaseException], ...]) -> BaseException | None:
    """``exc`` when it is one of ``expected``; the first error of an exception group (nested too) whose every
    error is one of them; else None."""
    if isinstance(exc, BaseExceptionGroup):
        found = [user_error(inner, expected) for inner in exc.exceptions]
        return found[0] if found and all(e is not None for e in found) else None
    return exc if isinstance(exc, expected) else None


__all__ = ["user_error"]
