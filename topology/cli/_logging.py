"""How the commands log: one console format on stderr (stdout stays the command's output), at a level per command.

Contract: :func:`configure_logging` replaces structlog's defaults — which print every level, debug included, to
stdout — with a filter at ``level`` and the console renderer on stderr (colours only on a terminal).
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: int = logging.INFO) -> None:
    """Log ``level`` and worse to stderr, timestamped (``flywheel up`` at info, ``status`` at warning)."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


__all__ = ["configure_logging"]
