"""The actor-kind registry: which kinds exist, their config models, default channels and factories.

Contract: a kind registers itself from a *light* module (``actors/<kind>/_config.py``: a pydantic model
and one `register_actor_kind` call — no torch, no engine imports), so validating or planning a spec never
imports heavy code. The actor class itself is named by a ``"module:attribute"`` factory string and
imported only by `resolve_factory`, at run time. Third-party kinds register through the entry-point group
``flywheel.actors`` (an entry point may name a module that registers on import, or an `ActorKind`).

Non-goals: unregistering, versioning of kinds.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pydantic

ENTRY_POINT_GROUP = "flywheel.actors"

# (consumes, publishes) computed from a validated config, for kinds whose channels depend on it
ChannelsFn = Callable[[Any], tuple[tuple[str, ...], tuple[str, ...]]]


@dataclass(frozen=True)
class ActorKind:
    """Everything the spec loader and the runtime need to know about one kind of actor."""

    name: str  # "generator"
    config: type[pydantic.BaseModel]  # kind-specific fields (frozen, extra="forbid"); must not import torch
    factory: str  # "actors.generator._actor:GeneratorActor", imported lazily at run time
    consumes: tuple[str, ...] = ()  # default channels consumed
    publishes: tuple[str, ...] = ()  # default channels published
    summary: str = ""  # one line for `plan` and did-you-mean help
    domain_fields: tuple[str, ...] = ()  # config fields holding a domain name or a list of names
    channels: ChannelsFn | None = None  # optional: default channels that depend on the config

    def default_channels(self, config: pydantic.BaseModel) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The (consumes, publishes) this kind uses when the spec does not override them."""
        if self.channels is not None:
            return self.channels(config)
        return self.consumes, self.publishes


_KINDS: dict[str, ActorKind] = {}
_LOADED = False


def register_actor_kind(kind: ActorKind) -> None:
    """Register (or re-register, e.g. on module reload) an actor kind under ``kind.name``."""
    existing = _KINDS.get(kind.name)
    if existing is not None and existing.factory != kind.factory:
        raise ValueError(
            f"actor kind {kind.name!r} is already registered with factory {existing.factory!r}; "
            f"refusing to replace it with {kind.factory!r}"
        )
    _KINDS[kind.name] = kind


def _load_builtin_and_plugins() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    importlib.import_module("actors")  # builtin kinds register from their light _config modules
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry.load()
        except Exception as exc:  # a broken plugin must not break validation of every spec
            warnings.warn(f"flywheel: actor plugin {entry.name!r} failed to load: {exc}", stacklevel=2)
            continue
        if isinstance(loaded, ActorKind):
            register_actor_kind(loaded)


def actor_kinds() -> Mapping[str, ActorKind]:
    """All registered kinds (builtin and plugins), by name; read-only."""
    _load_builtin_and_plugins()
    return MappingProxyType(_KINDS)


def resolve_factory(kind: ActorKind) -> type[Any]:
    """Import the actor class named by ``kind.factory`` (``"module:attribute"``)."""
    module_name, sep, attribute = kind.factory.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"actor kind {kind.name!r}: factory {kind.factory!r} is not 'module:attribute'")
    module = importlib.import_module(module_name)
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part)
    if not isinstance(target, type):
        raise TypeError(f"actor kind {kind.name!r}: factory {kind.factory!r} is not a class")
    return target


__all__ = ["ENTRY_POINT_GROUP", "ActorKind", "ChannelsFn", "actor_kinds", "register_actor_kind", "resolve_factory"]
