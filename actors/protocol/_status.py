"""What a learner tells the actors that feed it, and what they read of its spec: the backpressure contract.

A source with ``max_in_flight`` bounds the training groups anywhere between itself and its learners (see
`actors.source._actor`). Two things cross the kind boundary for that, both defined here:

- `LearnerStatus`: the part of a learner replica's heartbeat its feeders steer by — groups buffered and not yet
  applied (``buffered_groups``) and held-out prompts it has out (``eval_out``: they travel the training stages but
  are not training groups). The learner reports it with `LearnerStatus.counters`; a feeder reads it back from a
  heartbeat with `LearnerStatus.from_counters`.
- `LearnerPace`: the fields of a learner's config a feeder sizes its ``auto`` bound from (batch size, publish
  cadence, staleness limit, sync or async mode). A learner kind's config model satisfies it; a feeder checks
  ``isinstance(config, LearnerPace)`` instead of reading fields by name.

A third steers what a source draws rather than how much: `TaskOutcomes`, published by a learner on the core NATS
subject `TASK_OUTCOMES` (``fw.<topology>.eph.<TASK_OUTCOMES>``), says which training tasks' latest groups carried
signal and which were settled (every completion the same reward: solved, or failed, by all). A source whose
``skip_no_signal`` is set passes over settled tasks now and then: a group that teaches nothing costs as much to
generate and verify as one that does. It is a hint: a report lost while the bus is away only costs generation. A
learner reports only where `task_outcomes_wanted` says some actor of the spec listens.

Non-goals: anything a feeder does not steer by (the learner's other counters are for people and dashboards).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from topology import Spec

__all__ = ["TASK_OUTCOMES", "LearnerPace", "LearnerStatus", "TaskOutcomes", "task_outcomes_wanted"]

TASK_OUTCOMES = "learner.task_outcomes"  # the ephemeral subject suffix `TaskOutcomes` travel on


class LearnerStatus(BaseModel):
    """A learner replica's backpressure figures, as its heartbeat carries them."""

    model_config = ConfigDict(frozen=True)

    buffered_groups: int = 0  # training groups received and buffered, not applied yet
    eval_out: int = 0  # held-out prompts published whose scores are not back yet

    def counters(self) -> dict[str, int]:
        """The heartbeat counters that carry this status."""
        return {"buffered_groups": self.buffered_groups, "eval_out": self.eval_out}

    @classmethod
    def from_counters(cls, counters: Mapping[str, Any]) -> LearnerStatus:
        """Read the status back from a heartbeat's counters (absent ones count as 0)."""
        return cls(
            buffered_groups=int(counters.get("buffered_groups", 0) or 0),
            eval_out=int(counters.get("eval_out", 0) or 0),
        )


@runtime_checkable
class LearnerPace(Protocol):
    """The fields of a learner's config that its feeders size their bound from."""

    batch_size: int  # completions per learner step
    publish_every_steps: int  # steps between weight versions
    max_staleness: int  # versions a sample may lag before the learner drops it
    mode: str  # "async", or "sync": one batch per version


class TaskOutcomes(BaseModel):
    """Training tasks whose latest group a learner took in, by whether it carried signal (ids as the source drew
    them: `PromptMsg.task_id`). A task in both lists had groups of both kinds since the previous report; it counts as
    having signal (the report does not say which came later)."""

    model_config = ConfigDict(frozen=True)

    settled: list[str] = []  # every completion of the group got the same reward (no failed-group reference trained)
    signal: list[str] = []  # rewards differed within the group (or a failed group's reference was trained)


@runtime_checkable
class SkipsSettled(Protocol):
    """Configs of actors that pass over settled tasks by the learners' `TaskOutcomes` when ``skip_no_signal`` > 0."""

    skip_no_signal: float


def task_outcomes_wanted(spec: Spec) -> bool:
    """Whether an actor of ``spec`` steers by `TaskOutcomes`: one whose config sets ``skip_no_signal`` above 0."""
    return any(isinstance(a.config, SkipsSettled) and a.config.skip_no_signal > 0 for a in spec.actors.values())
