"""The payloads that travel on the durable channels, validated at every consumer.

One model per channel; consumers pass it to ``Bus.consume(model=…)`` so that a malformed message goes to the
dead-letter channel with the validation error instead of reaching actor code. Every model ignores unknown
fields (``extra="ignore"``) so a newer producer can add fields without breaking an older consumer; missing or
mistyped required fields are errors.

Flow: ``prompts`` (source) → ``rollouts`` (generator: a group of completions per prompt) → ``scored`` (verify,
or the joiner for production feedback) → learner. ``heldout`` prompts travel the same path greedily and are
scored but never trained on: they are how held-out accuracy is measured, by version.

Production: the gateway publishes one ``traffic`` message per served request (envelope id = ``request_id``)
and one ``feedback`` message per accepted ``/v1/feedback`` call; the joiner pairs them by ``request_id``
whichever arrives first.

"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "CORRECT",
    "FEEDBACK_LABELS",
    "VERIFIER_ERROR",
    "CompletionRecord",
    "FeedbackMsg",
    "PromptMsg",
    "RolloutMsg",
    "ScoredCompletion",
    "ScoredMsg",
    "TrafficMsg",
]

_CONFIG = ConfigDict(extra="ignore", frozen=True)
TokenId = Annotated[int, Field(ge=0)]  # an index into a vocabulary; which one is the consumer's to check
Version = Annotated[int, Field(ge=0)]  # a weight version: 0 is the initial weights

# the verdict of a completion its domain's verifier could not score (it raised, returned no reward, or the sandbox
# failed): scored 0 so the group still flows, but it says nothing about the answer, so the learner never trains on it
VERIFIER_ERROR = "internal_error"
# a reward at or above this is full marks: a correct answer (below it, partial credit counts as not correct)
CORRECT = 1.0 - 1e-9


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
    token_ids: list[TokenId]
    logprobs: list[float]  # behavior logprob log μ_t per token
    versions: list[Version]  # weight version per token
    finish_reason: Literal["stop", "length", "abort"]

    @model_validator(mode="after")
    def _one_entry_per_token(self) -> CompletionRecord:
        # the learner lines the three up token by token: a shorter list would misalign or fail a whole batch
        if not len(self.token_ids) == len(self.logprobs) == len(self.versions):
            raise ValueError(
                f"token_ids, logprobs and versions must have one entry per token, got "
                f"{len(self.token_ids)}, {len(self.logprobs)} and {len(self.versions)}"
            )
        return self


class RolloutMsg(BaseModel):
    """``rollouts``: a prompt's group of completions, as generated."""

    model_config = _CONFIG
    task_id: str
    domain: str
    prompt: str
    prompt_ids: list[TokenId]
    verifier_fields: dict[str, Any] = Field(default_factory=dict)
    heldout: bool = False
    temperature: float = Field(ge=0)
    generator: str = ""  # "<actor>/<replica>" that produced it
    generate_s: float = 0.0
    completions: list[CompletionRecord] = Field(min_length=1)
    reference: str = ""  # the task's reference answer, passed along for the learner's `failed_groups: reference`


class ScoredCompletion(CompletionRecord):
    reward: float = Field(ge=0, le=1)  # every verifier's and every user's score is in [0, 1] (domains._score)
    verdict: str  # "pass", "fail", a sandbox limit ("timeout", …), VERIFIER_ERROR
    detail: str = ""


class ScoredMsg(BaseModel):
    """``scored``: a group (or a single production sample) with rewards, ready for the learner."""

    model_config = _CONFIG
    task_id: str
    domain: str
    prompt_ids: list[TokenId]
    heldout: bool = False
    temperature: float = Field(ge=0)
    origin: Literal["domain", "feedback", "review"] = "domain"
    generator: str = ""
    generate_s: float = 0.0
    verify_s: float = 0.0
    completions: list[ScoredCompletion] = Field(min_length=1)
    prompt: str = ""  # the prompt text (recorded for replay; empty from producers that predate it)
    verifier_fields: dict[str, Any] = Field(default_factory=dict)  # what the verifier checked against (replay)
    reference: str = ""  # the task's reference answer (domain groups; empty for production feedback)
    # the reference scored by the domain's verifier as one more completion would be — set by the verify actor when
    # no completion of the group is correct and the domain trains on references (`failed_groups_of`); None: not
    # scored. The learner trains on a reference only when this is `CORRECT`: a wrong dataset row is never taught
    reference_reward: float | None = Field(default=None, ge=0, le=1)


class TrafficMsg(BaseModel):
    """``traffic``: one request the gateway served — enough to train on it off-policy once feedback arrives."""

    model_config = _CONFIG
    request_id: str  # also the envelope id, so a re-published record is stored once
    ts: float  # unix time the gateway received the request
    model: str  # the model name the client asked for
    route: Literal["chat", "completions"]  # /v1/chat/completions or /v1/completions
    domain: str | None = None  # x-flywheel-domain header, else the gateway's default_domain
    prompt: str  # the prompt text the policy saw (chat messages rendered by the chat template)
    messages: list[dict[str, Any]] = Field(default_factory=list)  # chat route: the messages as sent
    prompt_ids: list[TokenId]
    completion: CompletionRecord  # text, token_ids, behavior logprobs, versions, finish_reason
    temperature: float = Field(ge=0)
    top_p: float = 1.0
    max_tokens: int
    stream: bool = False
    generator: str = ""  # "<actor>/<replica>" that generated it
    latency_s: float = 0.0  # request received → completion ready at the gateway


# Labels /v1/feedback accepts instead of a numeric score, and the score each one stands for.
FEEDBACK_LABELS: dict[str, float] = {
    "good": 1.0,
    "thumbs_up": 1.0,
    "up": 1.0,
    "positive": 1.0,
    "correct": 1.0,
    "accept": 1.0,
    "neutral": 0.5,
    "bad": 0.0,
    "thumbs_down": 0.0,
    "down": 0.0,
    "negative": 0.0,
    "incorrect": 0.0,
    "reject": 0.0,
}


class FeedbackMsg(BaseModel):
    """``feedback``: a user's rating of a served request, possibly long after it (or before its traffic
    record reached the joiner). The envelope id hashes (request_id, score, label, comment): a retried POST
    is stored once inside the dedupe window, and the joiner applies a repeat at most once."""

    model_config = _CONFIG
    request_id: str
    score: float = Field(ge=0, le=1)  # 1 = good; a label is mapped through FEEDBACK_LABELS
    label: str | None = None  # the label as sent, when the client sent one
    comment: str = ""
    ts: float  # unix time the gateway accepted it
    key_id: str = ""  # which API key sent it: a short hash, never the key
