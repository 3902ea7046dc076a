"""Typed models of a topology spec (pydantic v2, frozen, ``extra="forbid"``) and the validated `Spec`.

Contract: each of the framework's sections of the YAML (bus, runtime, actors, channels) has one model here;
applications register their own sections (`topology._registry.SpecSection`). `topology._check` validates every
section, every entry of a keyed section and every actor block (against its kind's registered config model)
separately, so one run reports all errors.
Validation runs in pydantic's *strict JSON* mode: YAML ``"2"`` is not an integer and ``"yes"`` is not a
boolean, but ``2`` is a valid float and a YAML list is a valid tuple. Messages raised from validators here
are phrased "expected …, got …" because they are shown to users verbatim.

`Spec` is the validated whole that other parts consume: ``spec.actors["generator"].config`` is an instance
of the generator kind's config model, ``spec.channels`` lists every channel used (resolved subjects),
``spec.runtime.run_dir`` is absolute, ``spec.sections`` holds the application's sections.

Non-goals: defaults that depend on the machine (that is `plan`'s warnings).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from topology._errors import SpecIssue

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"  # topology name: used in NATS subjects and stream names
KEY_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"  # actor, domain and channel names
# the framework's own top-level keys; applications add theirs as spec sections (topology._registry)
FRAMEWORK_KEYS = ("name", "description", "include", "bus", "runtime", "actors", "channels")
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


class RetentionSpec(SpecModel):
    """What every durable channel keeps; a channel's own ``max_age_s`` (under ``channels:``) wins.

    Limits drop the oldest messages first, consumed or not: they bound the disk an always-on run takes, and must stay
    well above the longest time a consumer may be away (a stopped learner, a recorder being fixed). Before them,
    ``trim_acked`` drops what every consumer group of a channel has acknowledged (``topology.runtime._trim``)."""

    max_age_s: float | None = Field(default=7 * 86400.0, gt=0)  # drop messages older than this; null: keep
    max_mb: int | None = Field(default=None, ge=1)  # per channel: keep at most this many MiB; null: no limit
    # drop what every consumer group of a channel (one consumed by an actor of the spec, not external) acknowledged,
    # once older than bus.dedupe_window_s: a channel then holds what is in flight, not max_age_s of history
    trim_acked: bool = True


class BusSpec(SpecModel):
    """Where the NATS bus is. Credentials are never written here: only a file path or an env var name."""

    # start our own nats-server (JetStream on loopback, data under the run dir, a token every client must present,
    # restarted on the same port when it dies); false when url is set
    embedded: bool = True
    url: str | None = None  # external server, nats://host:4222 (tls://, ws://, wss:// too)
    creds_file: str | None = None  # path to a NATS .creds file, relative to the current directory ("": not given)
    token_env: str | None = None  # name of an environment variable holding a token
    max_ack_pending: int = Field(default=256, ge=1)  # per consumer group: bounds messages in flight
    max_deliver: int = Field(default=5, ge=1)  # deliveries before a message goes to the dead-letter channel
    ack_wait_s: float = Field(default=30.0, gt=0)  # seconds before an un-acked message is redelivered
    dedupe_window_s: float = Field(default=120.0, gt=0)  # JetStream duplicate window for Nats-Msg-Id
    retention: RetentionSpec = RetentionSpec()  # how long durable channels keep messages (the oldest go first)
    # embedded only — how often JetStream fsyncs its files: seconds, or always (after every write). An acknowledged
    # message survives a kill of nats-server or of the whole run whatever this is (it is in the OS page cache);
    # this bounds what a crash of the machine itself (power, kernel) can take. always costs throughput
    # (bench/RESULTS.md).
    sync_interval_s: Annotated[float, Field(gt=0)] | Literal["always"] = 1.0
    # embedded only — JetStream's disk budget in MiB; null: nats-server's default, 75 % of the free disk at start.
    #   When it is reached, publishes fail (nothing is dropped) until retention frees room.
    max_file_store_mb: int | None = Field(default=None, ge=1)
    max_memory_store_mb: int | None = Field(default=None, ge=1)  # embedded only — JetStream's memory budget in MiB

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

    @property
    def sync_interval(self) -> str:
        """``sync_interval_s`` as nats-server's configuration spells it (``always``, ``250ms``)."""
        if self.sync_interval_s == "always":
            return "always"
        return f"{max(1, round(float(self.sync_interval_s) * 1000))}ms"


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


class LogsSpec(SpecModel):
    """How big each replica's log (``<run_dir>/logs/<actor>-<replica>.log``) may grow (local runtime)."""

    # past this many MiB a log is copied to <log>.1 (older copies move up to .2, .3, …) and emptied in place, so an
    # always-on run's logs stay bounded; null: never rotated
    max_mb: float | None = Field(default=100.0, gt=0)
    keep: int = Field(default=3, ge=1)  # rotated copies kept per replica (the oldest is deleted)


class RuntimeSpec(SpecModel):
    """Where actor replicas run. ``runtime: local`` is shorthand for ``runtime: {kind: local}``."""

    kind: Literal["local", "ray"] = "local"  # local: one OS process per replica; ray: Ray actors
    run_dir: Path = Path("runs")  # run directories go under it; relative to the spec file
    restart: RestartSpec = RestartSpec()
    heartbeat_s: float = Field(default=1.0, gt=0)  # how often each replica reports its state and counters
    logs: LogsSpec = LogsSpec()  # local runtime: how big a replica's log may grow before it is rotated
    # flywheel up serves every replica's state and numeric counters as Prometheus metrics on this port
    # (http://<metrics_host>:<port>/metrics); 0 picks a free one (printed at start); null: no endpoint
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"  # interface of the metrics endpoint; 0.0.0.0 exposes it to the network
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
    actors: dict[str, ActorSpec]
    channels: dict[str, ChannelSpec]
    source_path: Path  # the spec file (absolute)
    description: str = ""
    warnings: tuple[SpecIssue, ...] = ()  # non-fatal issues (e.g. resources this machine cannot give)
    data: Mapping[str, Any] | None = None  # merged plain data after includes and ${ENV} (for run.json)
    # the application's sections by top-level key: the section's model, or for a keyed section a dict of entry
    # name → model; a registered section the spec leaves out is absent (the application supplies defaults)
    sections: Mapping[str, Any] = field(default_factory=dict)


__all__ = [
    "FRAMEWORK_KEYS",
    "KEY_PATTERN",
    "NAME_PATTERN",
    "ActorCommon",
    "ActorSpec",
    "BusSpec",
    "ChannelOverride",
    "ChannelSpec",
    "ResourcesSpec",
    "RestartSpec",
    "RetentionSpec",
    "RuntimeSpec",
    "SpecModel",
    "show",
]
