"""Bus settings and the naming scheme for subjects, streams and consumers.

Subjects are ``fw.<topology>.<channel>``; stream names ``FW_<TOPOLOGY>_<CHANNEL>`` (upper case, '-' → '_').
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DEADLETTER", "BusSettings", "consumer_name", "stream_name", "subject"]

DEADLETTER = "deadletter"
_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class BusSettings:
    max_ack_pending: int = 256  # per consumer group: messages delivered but not yet acked
    max_deliver: int = 5  # deliveries before a message goes to the dead-letter channel
    ack_wait_s: float = 30.0  # un-acked for this long → redelivered (e.g. the consumer died)
    dedupe_window_s: float = 120.0  # a re-published id within this window is stored once

    def __post_init__(self) -> None:
        for name in ("max_ack_pending", "max_deliver"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"BusSettings.{name}: expected an integer >= 1, got {value!r}")
        for name in ("ack_wait_s", "dedupe_window_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BusSettings.{name}: expected a number > 0, got {value!r}")


def _check_token(kind: str, value: str) -> str:
    if not _TOKEN.match(value):
        raise ValueError(f"invalid {kind} name {value!r}: use letters, digits, '-' and '_'")
    return value


def subject(topology: str, channel: str) -> str:
    return f"fw.{_check_token('topology', topology)}.{_check_token('channel', channel)}"


def stream_name(topology: str, channel: str) -> str:
    name = f"FW_{_check_token('topology', topology)}_{_check_token('channel', channel)}"
    return name.upper().replace("-", "_")


def consumer_name(group: str) -> str:
    return _check_token("consumer group", group)
