"""Config of the `source` actor kind (light module: no torch; registers the kind on import).

The source draws tasks from the spec's domains by their sampling weights and publishes them to `prompts`,
holding back when too many are waiting (backpressure), so generators are never starved nor flooded.
"""

from __future__ import annotations

from pydantic import Field

from topology._registry import ActorKind, register_actor_kind
from topology._spec import SpecModel


class SourceConfig(SpecModel):
    """Fields of a `source` actor block (besides kind/replicas/resources/consumes/publishes)."""

    domains: tuple[str, ...] | None = None  # domains to draw from; null: every domain in the spec, by weight
    max_pending: int = Field(default=256, ge=1)  # prompts published but not yet taken before the source waits
    # training groups anywhere between this source and the learner (queued prompts, prompts being generated,
    # rollouts waiting for verification, scored groups not yet delivered to or still buffered in the learner);
    # null: only max_pending applies. Bounds staleness: a group is trained ~max_in_flight groups after it was drawn.
    max_in_flight: int | None = Field(default=None, ge=1)
    prompts_per_s: float | None = Field(default=None, gt=0)  # optional rate limit; null: as fast as backpressure allows
    seed: int = 0  # seed of the domain/task sampler (replica i uses seed + i)


register_actor_kind(
    ActorKind(
        name="source",
        config=SourceConfig,
        factory="actors.source._actor:SourceActor",
        consumes=(),
        publishes=("prompts",),
        summary="draws tasks from the domains (by weight) and publishes them as prompts",
        domain_fields=("domains",),
    )
)

__all__ = ["SourceConfig"]
