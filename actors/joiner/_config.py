"""Config of the `joiner` actor kind (light module; registers the kind on import).

The joiner matches feedback to the served request it rates (by request id; feedback may arrive hours
later) and publishes the pair to `scored`, so the learner can train on production traffic off-policy. With
``review_fraction > 0`` it also queues that fraction of traffic on `review` for ``flywheel review``.
"""

from __future__ import annotations

from pydantic import Field

from topology import ActorKind, SpecModel, register_actor_kind


class JoinerConfig(SpecModel):
    """Fields of a `joiner` actor block (besides kind/replicas/resources/consumes/publishes)."""

    # how long a served request waits for its feedback, and feedback for its request (then: feedback.unmatched)
    window_s: float = Field(default=86_400.0, gt=0)
    # requests held waiting for feedback; when full the oldest are dropped first, counted as traffic.evicted
    max_pending: int = Field(default=100_000, ge=1)
    domain: str | None = None  # domain to tag joined samples with; null: the domain recorded with the request
    review_fraction: float = Field(default=0.0, ge=0, le=1)  # share of traffic queued for human review
    #   (chosen by a hash of the request id, so a redelivered record is chosen again or not at all)


def _channels(config: JoinerConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return ("traffic", "feedback"), ("scored", "review") if config.review_fraction > 0 else ("scored",)


register_actor_kind(
    ActorKind(
        name="joiner",
        config=JoinerConfig,
        factory="actors.joiner._actor:JoinerActor",
        consumes=("traffic", "feedback"),
        publishes=("scored",),
        summary="joins late feedback to served traffic by request id and publishes scored samples",
        references={"domain": "domains"},
        channels=_channels,
    )
)

__all__ = ["JoinerConfig"]
