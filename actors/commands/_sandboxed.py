"""What the commands that run code in the sandbox (``flywheel sandbox run``, ``flywheel verify``) share.

The ``--isolation`` / ``--min-isolation`` options, the limits a wall-clock ``--timeout`` implies, a one-worker pool
and logs kept off stdout (which carries the command's one JSON object).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

import click
import structlog

from actors.sandbox._isolation import Isolation
from actors.sandbox._pool import SandboxLimits, SandboxPool

_Command = TypeVar("_Command", bound=Callable[..., Any])
_LEVELS = [str(level) for level in sorted(Isolation, reverse=True)]  # strongest first


def isolation_options(what: str) -> Callable[[_Command], _Command]:
    """``--isolation`` (default ``auto``: the strongest available) and ``--min-isolation`` (default ``bwrap``)."""

    def decorate(command: _Command) -> _Command:
        command = click.option(
            "--min-isolation",
            type=click.Choice(_LEVELS),
            default="bwrap",
            show_default=True,
            help=f"refuse to run {what} below this level (weaker only by this explicit opt-in)",
        )(command)
        return click.option("--isolation", type=click.Choice(["auto", *_LEVELS]), default="auto", show_default=True)(
            command
        )

    return decorate


def limits_for(timeout_s: float, memory_mb: int) -> SandboxLimits:
    """A job's limits for a wall-clock ``timeout_s``: the CPU limit is the next whole second above it."""
    return SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, cpu_s=max(1, int(timeout_s) + 1))


def one_worker_pool(limits: SandboxLimits, isolation: str, min_isolation: str) -> SandboxPool:
    """A pool of one worker at the levels the options named (``click.Choice`` checked them)."""
    return SandboxPool(workers=1, limits=limits, isolation=cast(Any, isolation), min_isolation=cast(Any, min_isolation))


def quiet_logs() -> None:
    """Warnings and worse only, on stderr: stdout is the command's JSON."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
