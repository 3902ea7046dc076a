"""Size-capped replica logs: a log past its limit is copied aside and emptied in place ("copytruncate").

Contract: :func:`rotate` moves ``<log>.1`` … ``<log>.<keep - 1>`` one number up (the oldest beyond ``keep`` is
deleted), copies ``<log>`` to ``<log>.1`` and empties ``<log>``, when ``<log>`` holds more than ``max_bytes``.
The replica writing it keeps its descriptor: it appends (``O_APPEND``, as the supervisor opens every log), so its
next line goes to the start of the emptied file, without a hole. The copy is taken to the end of the file twice
over, so only what is written in the instant between the last read and the truncation can be lost. So a replica
takes at most ``max_bytes × (keep + 1)`` on disk, plus one line and one check interval's writing.

Non-goals: compression of the rotated copies; the embedded nats-server's own log (it writes little); logs of the
Ray runtime (on the nodes, written by Ray's workers).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["rotate"]

_CHUNK = 1 << 20


def rotate(log: Path, *, max_bytes: int, keep: int) -> bool:
    """Rotate ``log`` when it holds more than ``max_bytes``; returns whether it did."""
    try:
        if log.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    for number in range(keep, 0, -1):
        older = log.with_name(f"{log.name}.{number}")
        if number == keep:
            older.unlink(missing_ok=True)
        elif older.exists():
            os.replace(older, log.with_name(f"{log.name}.{number + 1}"))
    copy = log.with_name(f"{log.name}.1")
    with open(log, "rb") as source, open(copy, "wb") as target:
        for _ in range(2):  # what the replica wrote during the first pass, in a second (short) one
            while chunk := source.read(_CHUNK):
                target.write(chunk)
        os.truncate(log, 0)
    return True
