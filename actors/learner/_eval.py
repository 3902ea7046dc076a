"""Held-out evaluation bookkeeping: which prompts to publish, and accuracy per (round, domain) from the scores.

The learner publishes a round of held-out prompts after the warm start and every ``eval_every_steps`` steps:
the first ``eval_size`` held-out tasks of each domain (a fixed list, so rounds are comparable), once per decoding
in ``eval_temperature``: greedy (``temperature: 0``, ``group_size: 1``) or sampled (``group_size: eval_samples``),
message id ``eval-<version>-<task id>`` for the first decoding and ``eval-<version>-T<temperature>-<task id>`` for
the others (retries of a round dedupe on the bus). Their scores come back on ``scored`` with ``heldout: true`` and
the temperature they were decoded at; the generator and verifier derive their ids from the prompt's
(``<prompt id>.r.s``), so the round is read back from the id — falling back to the oldest token version when an id
has another shape (e.g. a custom generator). A round is one (version, domain, temperature).

A completion counts as correct when its reward is ≥ 1 − 1e-9; accuracy is the mean over the completions of the
round the verifier scored (sampled: the expected accuracy of one sample). A completion it failed on (verdict
``VERIFIER_ERROR``: its 0 says nothing about the answer) is left out of the accuracy and counted in ``errors``; a
round whose every completion failed so has no accuracy (``n`` 0). A (round, domain) is complete when all of its
prompts have come back, however many completions each carries (the post-warm-start round draws more per prompt
than the others, ``eval_baseline_samples``); only complete rounds are reported (a half-evaluated round would be a
biased number).

A domain's rounds form one *series* as long as they measure the same thing: the same held-out prompts scored by
the same verifier (`EvalSeries`, recorded with every round). A run resumed with another ``eval_size``, another
``heldout`` set or another verifier starts a new series for that domain; rounds of two series are never compared.

Non-goals: pass@k, confidence intervals.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from actors.domains import Task
from actors.protocol import CORRECT, VERIFIER_ERROR, ScoredMsg

__all__ = ["EvalResult", "EvalSeries", "EvalTracker", "eval_message_id", "eval_series", "round_version"]

_ID = re.compile(r"^eval-(\d+)-")
_KEEP_ROUNDS = 16  # incomplete rounds older than the newest 16 are forgotten


def round_version(message_id: str, msg: ScoredMsg) -> int:
    """The version a held-out score's round is labelled with: from its id, else its oldest token's version."""
    match = _ID.match(message_id)
    return int(match.group(1)) if match else min((v for c in msg.completions for v in c.versions), default=0)


def eval_message_id(version: int, task: Task, temperature: float | None = None) -> str:
    """The held-out prompt's id: ``eval-<version>-<task id>``, or with ``-T<temperature>`` before the task id for a
    decoding other than the round's first (``temperature`` None)."""
    return f"eval-{version}-{task.id}" if temperature is None else f"eval-{version}-T{temperature:g}-{task.id}"


@dataclass(frozen=True)
class EvalSeries:
    """What a domain's held-out rounds measure (see the module docstring)."""

    key: str  # a digest of the prompts (ids, text, what the verifier checks against) and the verifier with its config
    prompts: int
    verifier: str


def eval_series(tasks: Sequence[Task], verifier: str, verifier_config: Mapping[str, Any]) -> EvalSeries:
    """The series of rounds over ``tasks`` scored by ``verifier`` (with ``verifier_config``)."""
    content = [[t.id, t.prompt, dict(t.verifier_fields)] for t in tasks]
    data = orjson.dumps([content, verifier, dict(verifier_config)], option=orjson.OPT_SORT_KEYS, default=str)
    return EvalSeries(key=hashlib.sha256(data).hexdigest()[:16], prompts=len(tasks), verifier=verifier)


@dataclass(frozen=True)
class EvalResult:
    version: int
    domain: str
    n: int
    accuracy: float
    reward_mean: float
    temperature: float = 0.0  # the decoding: 0 greedy, else sampled at this temperature
    errors: int = 0  # completions the verifier failed on: not in n, accuracy or reward_mean


class EvalTracker:
    def __init__(self, tasks: Mapping[str, Sequence[Task]]) -> None:
        self.tasks = {domain: list(items) for domain, items in tasks.items() if items}
        self._rounds: dict[tuple[int, str, float], list[float]] = {}
        self._errors: dict[tuple[int, str, float], int] = {}
        # ids counted per round (kept after completion: dedupe)
        self._seen: dict[tuple[int, str, float], set[str]] = {}

    def expected(self, domain: str) -> int:
        """Prompts a complete round of ``domain`` holds."""
        return len(self.tasks.get(domain, ()))

    def record(self, message_id: str, msg: ScoredMsg) -> EvalResult | None:
        """Account one held-out score; returns the round's result when this score completes it."""
        key = (round_version(message_id, msg), msg.domain, msg.temperature)
        seen = self._seen.setdefault(key, set())
        if message_id in seen:  # a redelivery of a score already counted
            return None
        seen.add(message_id)
        rewards = self._rounds.setdefault(key, [])
        rewards.extend(c.reward for c in msg.completions if c.verdict != VERIFIER_ERROR)
        errors = sum(c.verdict == VERIFIER_ERROR for c in msg.completions)
        if errors:
            self._errors[key] = self._errors.get(key, 0) + errors
        self._forget_old()
        if len(seen) < max(self.expected(msg.domain), 1):
            return None
        del self._rounds[key]
        return EvalResult(
            version=key[0],
            domain=msg.domain,
            n=len(rewards),
            accuracy=sum(r >= CORRECT for r in rewards) / len(rewards) if rewards else 0.0,
            reward_mean=sum(rewards) / len(rewards) if rewards else 0.0,
            temperature=msg.temperature,
            errors=self._errors.pop(key, 0),
        )

    def _forget_old(self) -> None:
        versions = sorted({v for v, _, _ in self._seen})
        if len(versions) > _KEEP_ROUNDS:
            cutoff = versions[-_KEEP_ROUNDS]
            self._rounds = {k: v for k, v in self._rounds.items() if k[0] >= cutoff}
            self._errors = {k: v for k, v in self._errors.items() if k[0] >= cutoff}
            self._seen = {k: v for k, v in self._seen.items() if k[0] >= cutoff}
