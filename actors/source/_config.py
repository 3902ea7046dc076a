"""Config of the `source` actor kind (light module: no torch; registers the kind on import).

The source draws tasks from the spec's domains by their sampling weights and publishes them to `prompts`,
holding back when too many are waiting (backpressure), so generators are never starved nor flooded.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from topology import ActorKind, SpecModel, register_actor_kind


class SourceConfig(SpecModel):
    """Fields of a `source` actor block (besides kind/replicas/resources/consumes/publishes)."""

    domains: tuple[str, ...] | None = None  # domains to draw from; null: every domain in the spec, by weight
    max_pending: int = Field(default=256, ge=1)  # prompts published but not yet taken before the source waits
    # training groups anywhere between this source and the learner (queued prompts, prompts being generated,
    # rollouts waiting for verification, scored groups not yet delivered to or still buffered in the learner).
    # Bounds staleness: a group is trained ~max_in_flight groups after it was drawn. auto: 4 of the learner's
    # batches, fewer when publish_every_steps x max_staleness is smaller (see actors/source/_actor.py
    # `resolve_max_in_flight`); null: only max_pending applies.
    max_in_flight: Annotated[int, Field(ge=1)] | Literal["auto"] | None = "auto"
    prompts_per_s: float | None = Field(default=None, gt=0)  # optional rate limit; null: as fast as backpressure allows
    # pass over a task whose latest group carried no signal (every completion the same reward: solved, or failed, by
    #   all; the learners report each group's outcome) with this probability, compounded per such group in a row up
    #   to three (0.5: one in two, three in four, seven in eight), and draw another of its domain instead: such a
    #   group costs generation and verification and teaches nothing, but the tasks trained on narrow to the unsolved
    #   ones. A task is passed over at most as many times in a row as it had such groups, so one that comes unsettled
    #   is seen again soon. 0 (the default): draw as the domains' sources do
    skip_no_signal: float = Field(default=0.0, ge=0, lt=1)
    seed: int = 0  # seed of the domain/task sampler (replica i uses seed + i)

    @field_validator("max_in_flight", mode="before")
    @classmethod
    def _auto_or_count(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "auto":
            raise ValueError(f"expected an integer >= 1, 'auto' or null, got {value!r}")
        return value


register_actor_kind(
    ActorKind(
        name="source",
        config=SourceConfig,
        factory="actors.source._actor:SourceActor",
        consumes=(),
        publishes=("prompts",),
        summary="draws tasks from the domains (by weight) and publishes them as prompts",
        references={"domains": "domains"},
        required_references=("domains",),  # no domain, nothing to draw: the source would fail at every start
    )
)

__all__ = ["SourceConfig"]
