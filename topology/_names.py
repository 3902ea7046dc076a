"""Every name the framework puts on the bus or hands to a replica is built here, once.

Contract:
- a channel's subject is ``fw.<topology>.<channel>``; an ephemeral (core NATS, not stored) subject is
  ``fw.<topology>.eph.<suffix>``; the JetStream stream of a channel is ``FW_<TOPOLOGY>_<CHANNEL>`` (upper case,
  ``-`` → ``_``); a durable consumer is named after its consumer group (the consuming actor's name);
- a KV bucket or object store is ``fw_<topology>_<what>`` with ``-`` → ``_`` (NATS bucket names allow no ``-`` in
  every client);
- a replica is ``<actor>/<replica>`` wherever it is named (envelope ``source``, logs, status, ``generator``
  fields of payloads);
- a replica's torch thread pool is ``ceil(num_cpus)`` threads, at least one: a replica given half a core still
  needs a thread, one given 1.5 cores may use two.

Names are checked where they are built: a topology, channel or group name outside ``[A-Za-z0-9_-]`` raises
``ValueError`` (the spec's own patterns are stricter, so a validated spec never does).

Non-goals: subjects of external systems (an SGLang server's URL paths, users' NATS accounts).
"""

from __future__ import annotations

import math
import re

__all__ = [
    "DEADLETTER",
    "bucket_name",
    "channel_subject",
    "consumer_name",
    "ephemeral_subject",
    "replica_id",
    "stream_name",
    "torch_threads",
]

DEADLETTER = "deadletter"  # the channel where malformed messages and exhausted deliveries go, with the reason
_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


def _checked(kind: str, value: str) -> str:
    if not _TOKEN.match(value):
        raise ValueError(f"invalid {kind} name {value!r}: use letters, digits, '-' and '_'")
    return value


def channel_subject(topology: str, channel: str) -> str:
    """The NATS subject of a channel: ``fw.<topology>.<channel>``."""
    return f"fw.{_checked('topology', topology)}.{_checked('channel', channel)}"


def ephemeral_subject(topology: str, suffix: str) -> str:
    """A core NATS subject outside every stream: ``fw.<topology>.eph.<suffix>`` (``suffix`` may hold dots)."""
    return f"fw.{_checked('topology', topology)}.eph.{suffix}"


def stream_name(topology: str, channel: str) -> str:
    """The JetStream stream holding a durable channel: ``FW_<TOPOLOGY>_<CHANNEL>``."""
    return f"FW_{_checked('topology', topology)}_{_checked('channel', channel)}".upper().replace("-", "_")


def consumer_name(group: str) -> str:
    """The durable consumer of a consumer group (the consuming actor's name)."""
    return _checked("consumer group", group)


def bucket_name(topology: str, what: str) -> str:
    """A KV bucket or object store of this topology: ``fw_<topology>_<what>``, ``-`` → ``_``."""
    return f"fw_{_checked('topology', topology)}_{_checked('bucket', what)}".replace("-", "_")


def replica_id(actor: str, replica: int) -> str:
    """How one replica is named everywhere: ``<actor>/<replica>``."""
    return f"{actor}/{replica}"


def torch_threads(num_cpus: float) -> int:
    """The torch thread pool of a replica given ``num_cpus`` cores: ``ceil(num_cpus)``, at least 1."""
    return max(1, math.ceil(num_cpus))
