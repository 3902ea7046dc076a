"""The unit of work a domain hands out: a `Task`, plus the held-out partition of task keys.

Contract:
- A `Task` is immutable and self-describing: `prompt` is the exact text the policy continues, `reference` is
  one correct answer (used by the supervised warm start; may be None for user tasks without one) and
  `verifier_fields` are the inputs the domain's verifier needs besides the completion.
- `Task.key` is the canonical identity of a task's *content* (same content → same key, whatever the seed or
  the domain's name); `Task.id` is `<domain>-<12 hex of sha256(key)>`, stable across runs.
- `heldout_bucket(key)` maps a key to a uniform number in [0, 1) by hashing; a builtin source holds a task
  out iff its bucket is below the source's `heldout_fraction`. The partition depends on the key only, so it
  is identical across seeds, runs, processes and difficulty settings, and a smaller fraction's held-out set
  is a subset of a larger one's.

Non-goals: semantic deduplication (two prompts that differ only in spacing are different tasks).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SourceError", "Task", "heldout_bucket", "task_id"]

_HELDOUT_SALT = b"flywheel/heldout/v1|"


class SourceError(ValueError):
    """A user-facing problem with a task source: bad source string, bad option, bad JSONL row.

    The message is one line and says where (file:line when there is a file) and what was expected.
    `option` names the builtin option at fault and `key` the domain's spec key (``"heldout"``) when one is,
    so a spec checker can point at the line that holds it.
    """

    def __init__(self, message: str, *, option: str | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.option = option
        self.key = key


@dataclass(frozen=True)
class Task:
    id: str  # "<domain>-<sha256(key)[:12]>", stable across runs
    domain: str  # the spec's domain name, e.g. "arithmetic"
    prompt: str  # exact text the policy continues
    reference: str | None  # one correct completion (warm start); None when the source has none
    verifier_fields: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"answer": "42"}
    key: str = ""  # canonical content key; the held-out partition hashes it

    def payload(self, *, group_size: int, heldout: bool = False) -> dict[str, Any]:
        """The `prompts` message payload for this task (a fresh, JSON-ready dict)."""
        return {
            "task_id": self.id,
            "domain": self.domain,
            "prompt": self.prompt,
            "group_size": group_size,
            "verifier_fields": dict(self.verifier_fields),
            "reference": self.reference or "",
            "heldout": heldout,
        }


def task_id(domain: str, key: str) -> str:
    """Stable id of the task with content `key` in `domain`."""
    return f"{domain}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def heldout_bucket(key: str) -> float:
    """A uniform number in [0, 1) derived from `key` alone (sha256, salted)."""
    digest = hashlib.sha256(_HELDOUT_SALT + key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64
