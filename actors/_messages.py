"""The payloads that travel on the durable channels, validated at every consumer.

One model per channel; consumers pass it to ``Bus.consume(model=…)`` so that a malformed message goes to the
dead-letter channel with the validation error instead of reaching actor code. Every model ignores unknown
fields (``extra="ignore"``) so a newer producer can add fields without breaking an older consumer; missing or
mistyped required fields are errors.

Flow: ``prompts`` (source) → ``rollouts`` (generator: a group of completions per prompt) → ``scored`` (verify,
or the joiner for production feedback) → learner. ``heldout`` prompts travel the same path greedily and are
scored but never trained on: they are how held-out accuracy is measured, by version.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CompletionRecord",
    "PromptMsg",
    "RolloutMsg",
    "ScoredCompletion",
    "ScoredMsg",
]

_CONFIG = ConfigDict(extra="ignore", frozen=True)


class PromptMsg(BaseModel):
    """``prompts``: one task to sample ``group_size`` completions for."""

    model_config = _CONFIG
    task_id: str
    domain: str
    prompt: str
    group_size: int = Field(ge=1, le=1024)
    verifier_fields: dict[str, Any] = Field(default_factory=dict)
    reference: str = ""
    heldout: bool = False
    temperature: float | None = Field(default=None, ge=0)  # None: the generator's own; 0 for held-out evals


class CompletionRecord(BaseModel):
    """One sampled completion with what off-policy learning needs: tokens, behavior logprobs, versions."""

    model_config = _CONFIG
    text: str
    token_ids: list[int]
    logprobs: list[float]  # behavior logprob log μ_t per token
    versions: list[int]  # weight version per token
    finish_reason: Literal["stop", "length", "abort"]


class RolloutMsg(BaseModel):
    """``rollouts``: a prompt's group of completions, as generated."""

    model_config = _CONFIG
    task_id: str
    domain: str
    prompt: str
    prompt_ids: list[int]
    verifier_fields: dict[str, Any] = Field(default_factory=dict)
    heldout: bool = False
    temperature: float = Field(ge=0)
    generator: str = ""  # "<actor>/<replica>" that produced it
    generate_s: float = 0.0
    completions: list[CompletionRecord] = Field(min_length=1)


class ScoredCompletion(CompletionRecord):
    reward: float
    verdict: str
    detail: str = ""


class ScoredMsg(BaseModel):
    """``scored``: a group (or a single production sample) with rewards, ready for the learner."""

    model_config = _CONFIG
    task_id: str
    domain: str
    prompt_ids: list[int]
    heldout: bool = False
    temperature: float = Field(ge=0)
    origin: Literal["domain", "feedback", "review"] = "domain"
    generator: str = ""
    generate_s: float = 0.0
    verify_s: float = 0.0
    completions: list[ScoredCompletion] = Field(min_length=1)
