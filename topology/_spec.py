"""Typed models of a topology spec (pydantic v2, frozen, ``extra="forbid"``) and the validated `Spec`.

Contract: each section of the YAML has one model here; `topology._check` validates every section (and
every actor block, against its kind's registered config model) separately, so one run reports all errors.
Validation runs in pydantic's *strict JSON* mode: YAML ``"2"`` is not an integer and ``"yes"`` is not a
boolean, but ``2`` is a valid float and a YAML list is a valid tuple. Messages raised from validators here
are phrased "expected …, got …" because they are shown to users verbatim.

`Spec` is the validated whole that other parts consume: ``spec.actors["generator"].config`` is an instance
of the generator kind's config model, ``spec.channels`` lists every channel used (resolved subjects),
``spec.runtime.run_dir`` is absolute.

Non-goals: defaults that depend on the machine (that is `plan`'s warnings), validating ``policy.config``
(the generator owns the model's hyper-parameters).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from topology._errors import SpecIssue

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"  # topology name: used in NATS subjects and stream names
KEY_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"  # actor, domain and channel names
BUILTIN_MODELS = ("tiny-gpt",)
BUILTIN_SOURCES = ("arithmetic", "pyexpr", "extract")
BUILTIN_VERIFIERS = ("math", "python-tests", "python-expr", "json-fields")
CANONICAL_CHANNELS = ("prompts", "rollouts", "scored", "traffic", "feedback", "review", "deadletter")
_CALLABLE_REF = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

ChannelName = str  # validated against KEY_PATTERN where used


class SpecModel(BaseModel):
    """Base of every spec section: frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def show(value: Any) -> str:
    """A short, YAML-flavoured rendering of a user's value for "got …" messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        return repr(text)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return str(value)


class BusSpec(SpecModel):
    """Where the NATS bus is. Credentials are never written here: only a file path or an env var name."""

    embedded: bool = True  # start our own nats-server (JetStream, loopback, free port); false when url is set
    url: str | None = None  # external server, nats://host:4222 (tls://, ws://, wss:// too)
    creds_file: str | None = None  # path to a NATS .creds file ("" counts as not given)
    token_env: str | None = None  # name of an environment variable holding a token
    max_ack_pending: int = Field(default=256, ge=1)  # per consumer group: bounds messages in flight
    max_deliver: int = Field(default=5, ge=1)  # deliveries before a message goes to the dead-letter channel
    ack_wait_s: float = Field(default=30.0, gt=0)  # seconds before an un-acked message is redelivered
    dedupe_window_s: float = Field(default=120.0, gt=0)  # JetStream duplicate window for Nats-Msg-Id

    @model_validator(mode="before")
    @classmethod
    def _embedded_follows_url(cls, data: Any) -> Any:
        if isinstance(data, dict) and "embedded" not in data and data.get("url") is not None:
            return {**data, "embedded": False}
        return data

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"^(nats|tls|ws|wss)://[^\s]+$", url):
            raise ValueError(f"expected a URL like nats://host:4222, got {show(url)}")
        return url

    @field_validator("creds_file")
    @classmethod
    def _empty_creds(cls, creds_file: str | None) -> str | None:
        return creds_file or None

    @field_validator("token_env")
    @classmethod
    def _check_token_env(cls, name: str | None) -> str | None:
        if name is not None and not _ENV_NAME.match(name):
            raise ValueError(f"expected the NAME of an environment variable (not the token itself), got {show(name)}")
        return name

    @model_validator(mode="after")
    def _one_server(self) -> BusSpec:
        if self.embedded and self.url is not None:
            raise ValueError("expected either embedded: true or url: nats://…, got both")
        return self


class RestartSpec(SpecModel):
    """How the supervisor restarts a crashed actor replica."""

    max_restarts: int = Field(default=5, ge=0)  # restarts allowed within window_s before the topology gives up
    window_s: float = Field(default=60.0, gt=0)  # sliding window for max_restarts
    backoff_s: float = Field(default=0.5, ge=0)  # first delay before a restart; doubles per restart
    backoff_max_s: float = Field(default=10.0, gt=0)  # cap on the delay

    @model_validator(mode="after")
    def _ordered(self) -> RestartSpec:
        if self.backoff_max_s < self.backoff_s:
            raise ValueError(f"expected backoff_max_s >= backoff_s ({self.backoff_s}), got {self.backoff_max_s}")
        return self


class RuntimeSpec(SpecModel):
    """Where actor replicas run. ``runtime: local`` is shorthand for ``runtime: {kind: local}``."""

    kind: Literal["local", "ray"] = "local"  # local: one OS process per replica; ray: Ray actors
    run_dir: Path = Path("runs")  # run directories go under it; relative to the spec file
    restart: RestartSpec = RestartSpec()
    heartbeat_s: float = Field(default=1.0, gt=0)  # how often each replica reports its state and counters
    address: str | None = None  # kind: ray only — cluster address ("auto", "ray://host:10001"); null starts one
    # kind: ray only — how replicas spread over the cluster's nodes. null: Ray's default, each replica placed
    # on its own; spread: one placement group, bundles on as many nodes as possible; pack: one placement
    # group, bundles on as few nodes as possible. Placement groups are all-or-nothing: nothing starts until
    # every replica's resources are reserved.
    placement: Literal["spread", "pack"] | None = None
    # kind: ray only — groups of actor names whose replicas must share one node (a STRICT_PACK placement
    # group per group), e.g. [[learner, generator]] keeps a learner beside its generators
    colocate: list[list[str]] = Field(default_factory=list)
    placement_timeout_s: float = Field(default=120.0, gt=0)  # kind: ray only — wait this long for placement

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"kind": data} if isinstance(data, str) else data

    @field_validator("colocate")
    @classmethod
    def _check_colocate(cls, groups: list[list[str]]) -> list[list[str]]:
        seen: set[str] = set()
        for group in groups:
            if not group:
                raise ValueError("expected each colocate group to list at least one actor name, got an empty list")
            for name in group:
                if name in seen:
                    raise ValueError(f"expected each actor in at most one colocate group, got {show(name)} twice")
                seen.add(name)
        return groups

    @model_validator(mode="after")
    def _ray_fields_need_ray(self) -> RuntimeSpec:
        if self.kind == "ray":
            return self
        for name, value in (("address", self.address), ("placement", self.placement)):
            if value is not None:
                raise ValueError(
                    f"expected no {name} with kind: {self.kind} ({name} is for kind: ray), got {show(value)}"
                )
        if self.colocate:
            raise ValueError(f"expected no colocate with kind: {self.kind} (colocate is for kind: ray), got a list")
        return self


class WarmStartSpec(SpecModel):
    """Supervised warm start run by the learner when no checkpoint exists."""

    # null: 200 for a builtin model (random weights: RL needs some reward to climb from), 0 for an hf: model (a
    # trained model's weights are the starting point; an SFT phase it did not ask for would change them); 0 disables
    steps: int | None = Field(default=None, ge=0)
    lr: float = Field(default=1e-3, gt=0)  # supervised learning rate (RL rates are far smaller; see learner.lr)
    batch_size: int = Field(default=32, ge=1)


class PolicySpec(SpecModel):
    """The language model being trained and served."""

    model: str  # builtin:<name> (builtin:tiny-gpt) or hf:<model dir or hub id>
    tokenizer: str | None = None  # null: the model's own tokenizer
    config: dict[str, Any] = Field(default_factory=dict)  # free-form model hyper-parameters (builtin models)
    checkpoint: str | None = None  # start from these weights (path, relative to the spec file); null: fresh
    warm_start: WarmStartSpec = WarmStartSpec()

    @property
    def warm_start_steps(self) -> int:
        """``warm_start.steps``, its default resolved by the kind of model (see `WarmStartSpec`)."""
        if self.warm_start.steps is not None:
            return self.warm_start.steps
        return 200 if self.model.startswith("builtin:") else 0

    @field_validator("model")
    @classmethod
    def _check_model(cls, model: str) -> str:
        scheme, sep, rest = model.partition(":")
        if scheme == "builtin" and sep:
            if rest not in BUILTIN_MODELS:
                raise ValueError(f"expected a builtin model ({', '.join(BUILTIN_MODELS)}), got {show(model)}")
            return model
        if scheme == "hf" and sep and rest:
            return model
        raise ValueError(f"expected builtin:<name> or hf:<path or hub id>, got {show(model)}")


class DomainSpec(SpecModel):
    """A task domain: where prompts come from and how completions are scored."""

    source: str  # builtin:<arithmetic|pyexpr|extract>[?option=value&…] or jsonl:<path relative to the spec>
    source_options: dict[str, Any] = Field(default_factory=dict)  # options of a builtin source (e.g. max_operand)
    verifier: str  # math | python-tests | python-expr | json-fields | <module>:<function>
    verifier_config: dict[str, Any] = Field(default_factory=dict)  # passed to the verifier as keyword arguments
    weight: float = Field(default=1.0, gt=0)  # sampling weight: the share of prompts drawn (normalized over all
    #   domains); the learner's batches hold each domain's completions in the same proportion, weight × group_size
    group_size: int = Field(default=8, ge=1)  # completions per prompt (GRPO group); 1 = single samples
    heldout: int | str = 200  # held-out prompts for evaluation: a count (>= 0) or jsonl:<path>
    max_new_tokens: int = Field(default=64, ge=1)  # generation budget for this domain's prompts
    # a prompt whose last group scored full marks in every completion is passed over its next N draws (0: off);
    # pays where prompts repeat (a JSONL file drawn several times over), the groups it saves carry no signal
    skip_solved: int = Field(default=0, ge=0)
    # a group with no correct completion: skip it when all scored 0, or train on the task's reference answer
    # added to it (partial credit counts as not correct)
    # (null: the learner's `failed_groups`, skip by default) — see actors/learner/_actor.py `_guidance`
    failed_groups: Literal["skip", "reference"] | None = None

    @field_validator("source")
    @classmethod
    def _check_source(cls, source: str) -> str:
        scheme, sep, rest = source.partition(":")
        if scheme == "builtin" and sep:
            if rest.partition("?")[0] not in BUILTIN_SOURCES:
                raise ValueError(f"expected a builtin source ({', '.join(BUILTIN_SOURCES)}), got {show(source)}")
            return source
        if scheme == "jsonl" and sep and rest:
            return source
        raise ValueError(f"expected builtin:<name> or jsonl:<path>, got {show(source)}")

    @field_validator("verifier")
    @classmethod
    def _check_verifier(cls, verifier: str) -> str:
        if verifier in BUILTIN_VERIFIERS or _CALLABLE_REF.match(verifier):
            return verifier
        raise ValueError(f"expected one of {', '.join(BUILTIN_VERIFIERS)} or module:function, got {show(verifier)}")

    @field_validator("heldout", mode="before")
    @classmethod
    def _check_heldout(cls, heldout: Any) -> Any:
        if isinstance(heldout, int) and not isinstance(heldout, bool) and heldout >= 0:
            return heldout
        if isinstance(heldout, str) and heldout.startswith("jsonl:") and len(heldout) > len("jsonl:"):
            return heldout
        raise ValueError(f"expected a count >= 0 or jsonl:<path>, got {show(heldout)}")


class ResourcesSpec(SpecModel):
    """What one replica of an actor needs (Ray places by it; the local runtime sizes thread pools by it)."""

    num_cpus: float = Field(default=1.0, ge=0)  # cores per replica (fractions allowed; torch threads = ceil)
    num_gpus: float = Field(default=0.0, ge=0)  # GPUs per replica (fractions share a GPU under Ray)
    memory_mb: int | None = Field(default=None, ge=1)  # memory per replica, for Ray placement; null: unspecified
    custom: dict[str, float] = Field(default_factory=dict)  # custom Ray resources, e.g. {sandbox_host: 1}


class ActorCommon(SpecModel):
    """Fields every actor block has, whatever its kind; the rest of the block is the kind's config."""

    kind: str | None = None  # registered actor kind; defaults to the actor's name
    replicas: int = Field(default=1, ge=1)  # processes running this actor; they share its consumer groups
    resources: ResourcesSpec = ResourcesSpec()
    consumes: tuple[ChannelName, ...] | None = None  # override the kind's default input channels
    publishes: tuple[ChannelName, ...] | None = None  # override the kind's default output channels

    @field_validator("consumes", "publishes")
    @classmethod
    def _check_channels(cls, names: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for name in names or ():
            if not re.match(KEY_PATTERN, name):
                raise ValueError(f"expected channel names matching {KEY_PATTERN}, got {show(name)}")
        return names


class ChannelOverride(SpecModel):
    """Settings of one channel, as written under ``channels:``."""

    durable: bool = True  # JetStream stream (survives restarts, at-least-once) vs core NATS (fire-and-forget)
    max_age_s: float | None = Field(default=None, gt=0)  # drop messages older than this; null: keep
    max_msgs: int = Field(default=-1, ge=-1)  # keep at most this many messages; -1: unlimited
    external: bool = False  # fed from outside the topology: consumers need no producer in the spec


class ChannelSpec(SpecModel):
    """A resolved channel: every channel an actor uses, with its NATS subject."""

    name: str
    subject: str  # fw.<topology>.<channel>
    durable: bool = True
    max_age_s: float | None = None
    max_msgs: int = -1
    external: bool = False


@dataclass(frozen=True)
class ActorSpec:
    """One validated actor block; ``config`` is an instance of the kind's registered config model."""

    name: str
    kind: str
    replicas: int
    resources: ResourcesSpec
    consumes: tuple[str, ...]
    publishes: tuple[str, ...]
    config: BaseModel


@dataclass(frozen=True)
class Spec:
    """A validated topology spec."""

    name: str
    bus: BusSpec
    runtime: RuntimeSpec
    policy: PolicySpec
    domains: dict[str, DomainSpec]
    actors: dict[str, ActorSpec]
    channels: dict[str, ChannelSpec]
    source_path: Path  # the spec file (absolute)
    description: str = ""
    warnings: tuple[SpecIssue, ...] = ()  # non-fatal issues (e.g. resources this machine cannot give)
    data: Mapping[str, Any] | None = None  # merged plain data after includes and ${ENV} (for run.json)


def subject_for(topology: str, channel: str) -> str:
    """NATS subject of a channel: ``fw.<topology>.<channel>``."""
    return f"fw.{topology}.{channel}"


__all__ = [
    "BUILTIN_MODELS",
    "BUILTIN_SOURCES",
    "BUILTIN_VERIFIERS",
    "CANONICAL_CHANNELS",
    "KEY_PATTERN",
    "NAME_PATTERN",
    "ActorCommon",
    "ActorSpec",
    "BusSpec",
    "ChannelOverride",
    "ChannelSpec",
    "DomainSpec",
    "PolicySpec",
    "ResourcesSpec",
    "RestartSpec",
    "RuntimeSpec",
    "SpecModel",
    "WarmStartSpec",
    "show",
    "subject_for",
]
