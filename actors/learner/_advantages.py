"""Advantages and the staleness filter: from scored samples to one number per completion.

- Groups: the G completions of one prompt are centred on their mean, ``r_i − mean(r)``; a group whose rewards
  are all equal carries no signal: it is counted and skipped, never divided by ~0. The scale then follows
  ``normalize``:
    * ``"group"`` — classic GRPO, divide by the group's std: ``(r_i − mean(r)) / (std(r) + ε)``;
    * ``"domain"`` — per-domain normalization: divide by the *domain's* running reward std, so every advantage
      is in its domain's units: a domain with rewards in {0, 1} and one with partial credit in [0, 0.1] pull
      with comparable force, without GRPO's bias towards groups that happen to have a small spread;
    * ``"none"`` — raw centred rewards (the ablation that shows what normalization buys).
- Single samples (production feedback): ``A = r − b_d`` with ``b_d`` an exponential running mean of domain ``d``,
  divided by the domain's running std unless ``normalize`` is ``"none"``.
- Staleness: ``learner_version − min(token versions)``; samples over ``max_staleness`` are dropped and counted.

Non-goals: no batching policy (the batcher decides what goes together) and no I/O; the running statistics are
plain data so the learner can checkpoint them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class RunningStats:
    """Exponential running mean and variance of one domain's rewards."""

    decay: float = 0.99
    mean: float = 0.0
    var: float = 1.0
    count: int = 0

    def update(self, rewards: Sequence[float]) -> None:
        for reward in rewards:
            if self.count == 0:
                self.mean, self.var = reward, 0.0
            else:
                delta = reward - self.mean
                self.mean += (1.0 - self.decay) * delta
                self.var = self.decay * (self.var + (1.0 - self.decay) * delta * delta)
            self.count += 1

    @property
    def std(self) -> float:
        return math.sqrt(max(self.var, 0.0))

    def to_dict(self) -> dict[str, float]:
        return {"decay": self.decay, "mean": self.mean, "var": self.var, "count": float(self.count)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunningStats:
        return cls(
            decay=float(data["decay"]), mean=float(data["mean"]), var=float(data["var"]), count=int(data["count"])
        )


@dataclass
class AdvantageEstimator:
    """Turns rewards into advantages, keeping per-domain running statistics."""

    normalize: Literal["domain", "group", "none"] = "domain"
    decay: float = 0.99
    eps: float = 1e-6
    min_std: float = 0.05  # a floor on the domain std so a nearly constant domain cannot explode advantages
    domains: dict[str, RunningStats] = field(default_factory=dict)
    groups_skipped: int = 0  # groups with all-equal rewards (no signal)

    def stats_for(self, domain: str) -> RunningStats:
        stats = self.domains.get(domain)
        if stats is None:
            stats = self.domains[domain] = RunningStats(decay=self.decay)
        return stats

    def observe(self, domain: str, rewards: Sequence[float]) -> None:
        self.stats_for(domain).update(rewards)

    def group(self, domain: str, rewards: Sequence[float]) -> list[float] | None:
        """Group-relative advantages, or ``None`` (counted) when the group carries no signal."""
        self.observe(domain, rewards)
        count = len(rewards)
        mean = sum(rewards) / count
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / count)
        if count < 2 or std < self.eps:
            self.groups_skipped += 1
            return None
        if self.normalize == "group":
            scale = std + self.eps
        elif self.normalize == "domain":
            scale = max(self.stats_for(domain).std, self.min_std)
        else:
            scale = 1.0
        return [(r - mean) / scale for r in rewards]

    def single(self, domain: str, reward: float) -> float:
        """Advantage of a lone sample against its domain's running baseline (taken before this reward)."""
        stats = self.stats_for(domain)
        baseline = stats.mean if stats.count else reward
        std = stats.std if stats.count > 1 else 1.0
        self.observe(domain, [reward])
        advantage = reward - baseline
        if self.normalize != "none":
            advantage /= max(std, self.min_std)
        return advantage

    def state_dict(self) -> dict[str, Any]:
        return {
            "groups_skipped": self.groups_skipped,
            "domains": {name: stats.to_dict() for name, stats in self.domains.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.groups_skipped = int(state["groups_skipped"])
        self.domains = {name: RunningStats.from_dict(data) for name, data in state["domains"].items()}


def staleness(learner_version: int, token_versions: Sequence[int]) -> int:
    """``learner_version − oldest token version`` (0 for an empty completion)."""
    return learner_version - min(token_versions) if token_versions else 0


def is_stale(learner_version: int, token_versions: Sequence[int], max_staleness: int) -> bool:
    return staleness(learner_version, token_versions) > max_staleness
