"""Config of the `learner` actor kind (light module: no torch; registers the kind on import).

The learner trains the policy off-policy from `scored` (decoupled PPO with truncated importance weights,
GRPO group advantages, per-domain baselines; see reference/ALGORITHMS.md) and publishes new weights.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from topology._registry import ActorKind, register_actor_kind
from topology._spec import SpecModel


class LearnerConfig(SpecModel):
    """Fields of a `learner` actor block (besides kind/replicas/resources/consumes/publishes)."""

    lr: float = Field(default=3e-5, gt=0)  # RL learning rate; on tiny models >= 2e-4 collapsed accuracy, 2e-5..5e-5 climbed
    batch_size: int = Field(default=64, ge=1)  # completions per optimizer step
    max_staleness: int = Field(default=4, ge=0)  # drop samples older than this many versions; 0 = synchronous
    publish_every_steps: int = Field(default=1, ge=1)  # publish new weights every K optimizer steps
    checkpoint_every_steps: int = Field(default=50, ge=1)  # checkpoint model, optimizer and statistics every K steps
    eval_every_steps: int = Field(default=20, ge=0)  # held-out evaluation cadence; 0 = off
    clip_low: float = Field(default=0.2, gt=0, lt=1)  # PPO clip below: ratio >= 1 - clip_low
    clip_high: float = Field(default=0.28, gt=0)  # PPO clip above ("clip-higher"): ratio <= 1 + clip_high
    iw_cap: float = Field(default=3.0, ge=1)  # truncation C of the importance weight proximal/behavior
    kl_beta: float = Field(default=0.0, ge=0)  # weight of the k3 KL to the initial policy; 0 = off
    grad_clip: float = Field(default=1.0, gt=0)  # max global gradient norm
    per_domain_normalization: bool = True  # express advantages in each domain's reward units
    baseline_decay: float = Field(default=0.99, gt=0, lt=1)  # running baseline of single (non-group) samples per domain
    buffer_size: int = Field(default=4096, ge=1)  # scored samples held before the oldest are dropped
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when present
    weight_transport: Literal["object-store", "disk", "distributed"] = "object-store"  # how generators get weights
    domains: tuple[str, ...] | None = None  # learn only from these domains; null: every domain (and production)

    @model_validator(mode="after")
    def _batch_fits_buffer(self) -> LearnerConfig:
        if self.buffer_size < self.batch_size:
            raise ValueError(f"expected buffer_size >= batch_size ({self.batch_size}), got {self.buffer_size}")
        return self


register_actor_kind(
    ActorKind(
        name="learner",
        config=LearnerConfig,
        factory="actors.learner._actor:LearnerActor",
        consumes=("scored",),
        publishes=(),
        summary="off-policy policy-gradient learner; publishes new weight versions",
        domain_fields=("domains",),
    )
)

__all__ = ["LearnerConfig"]
