"""Config of the `gate` actor kind (light module; registers the kind on import).

The promotion gate watches the learner's newest weight version and lets it reach the serving generators
(``follow: serving``) only if replaying recent recorded samples with it does not lose more than
``threshold`` mean reward against the version serving now. Decisions go to ``<run_dir>/gate/decisions.jsonl``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from topology import ActorKind, SpecModel, register_actor_kind


class GateConfig(SpecModel):
    """Fields of a `gate` actor block (besides kind/replicas/resources/consumes/publishes)."""

    threshold: float = Field(default=0.02, ge=0)  # largest allowed drop in mean reward vs the serving version
    min_samples: int = Field(default=32, ge=1)  # scored replay samples needed to decide on evidence
    max_samples: int = Field(default=256, ge=1)  # newest recorded samples replayed per decision
    recent_window_s: float = Field(default=86_400.0, gt=0)  # only samples recorded this recently
    recordings: str = "recordings"  # the recorder's directory; relative paths are inside the run directory
    without_evidence: Literal["hold", "promote"] = "hold"  # fewer than min_samples: keep serving, or promote
    seed: int = 0  # replay sampling seed (same seed for candidate and serving: a paired comparison)
    greedy: bool = False  # replay greedily instead of at the recorded temperatures
    concurrency: int = Field(default=16, ge=1)  # replay requests in flight


register_actor_kind(
    ActorKind(
        name="gate",
        config=GateConfig,
        factory="actors.gate._actor:GateActor",
        consumes=(),
        publishes=(),
        summary="promotes a new weight version to the serving generators unless replay shows a regression",
    )
)

__all__ = ["GateConfig"]
