"""Config of the `gate` actor kind (light module; registers the kind on import).

The promotion gate watches the learner's newest weight version and lets it reach the serving generators
(``follow: serving``) only if replaying recent recorded samples with it loses no more than ``threshold`` mean
reward against the version serving now *and* against the best version served so far; it rolls the serving
version back when users' live feedback on it drops. Decisions go to ``<run_dir>/gate/decisions.jsonl``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from topology import ActorKind, SpecModel, register_actor_kind


class GateConfig(SpecModel):
    """Fields of a `gate` actor block (besides kind/replicas/resources/consumes/publishes)."""

    threshold: float = Field(default=0.02, ge=0)  # largest allowed drop in mean reward vs the serving version and
    #   vs the best version served so far (replayed on the same samples): no chain of slightly worse versions
    min_samples: int = Field(default=32, ge=1)  # scored replay samples needed to decide on evidence
    max_samples: int = Field(default=256, ge=1)  # newest recorded samples replayed per decision
    recent_window_s: float = Field(default=86_400.0, gt=0)  # only samples recorded this recently
    # what is replayed: traffic (requests users sent, scored by their domain's verifier: a request whose prompt is
    # a task of its domain), scored (the task domains' training samples), both (users' requests first, topped up
    # with training samples up to max_samples)
    replay_from: Literal["traffic", "scored", "both"] = "both"
    recordings: str = "recordings"  # the recorder's directory; relative paths are inside the run directory
    without_evidence: Literal["hold", "promote"] = "hold"  # fewer than min_samples: keep serving, or promote
    seed: int = 0  # replay sampling seed (same seed for every version compared: a paired comparison)
    greedy: bool = False  # replay greedily instead of at the recorded temperatures
    concurrency: int = Field(default=16, ge=1)  # replay requests in flight
    # roll the serving version back to the one it replaced when users' mean feedback score on its answers is this
    # much below the replaced version's (and the drop is over twice its standard error); null: never
    rollback_margin: float | None = Field(default=0.1, gt=0, le=1)
    rollback_min_feedback: int = Field(default=50, ge=1)  # feedback events needed on each version to compare them
    rollback_check_s: float = Field(default=10.0, gt=0)  # how often live feedback is read (from the recordings)


register_actor_kind(
    ActorKind(
        name="gate",
        config=GateConfig,
        factory="actors.gate._actor:GateActor",
        consumes=(),
        publishes=(),
        summary="promotes a new weight version to the serving generators unless replay shows a regression; "
        "rolls back when live feedback drops",
    )
)

__all__ = ["GateConfig"]
