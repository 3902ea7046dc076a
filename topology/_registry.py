"""The registry: what an application adds to the framework — actor kinds, spec sections, commands, a live view.

The framework knows no application. An application is a Python package that, when imported, registers:
- its **actor kinds** (`register_actor_kind`): a config model and a ``"module:attribute"`` factory string;
- its **spec sections** (`register_spec_section`): top-level keys of the spec beside the framework's own (name,
  bus, runtime, actors, channels), each validated into its model and then checked by the section's hook; what a
  resumed run may change of it (`SpecSection.fixed_on_resume`, and the ``record`` / ``on_resume`` hooks for what the
  spec's text does not say);
- its **commands** (`register_command`): ``flywheel <name>``, named by a ``"module:attribute"`` click command;
- optionally a **live view** (`register_live_view`): what ``flywheel up`` draws above the replica table.

Applications are found through the entry-point group ``flywheel.plugins`` (an entry point names a module that
registers on import, or an `ActorKind`), and through ``FLYWHEEL_PLUGINS`` (comma-separated module names, for
projects that are not installed and for tests; replica processes inherit it).

Contract: registration happens in *light* modules (pydantic models and strings — no torch, no engines), so
validating or planning a spec imports no heavy code. Factories, commands and views are imported only when used.

Non-goals: unregistering, versioning of plugins, ordering between plugins (two that register one name clash,
which is an error unless it is the same registration again, as on a module reload).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import pydantic

if TYPE_CHECKING:
    from topology._spec import ActorSpec, Spec
    from topology._yaml import KeyPath

ENTRY_POINT_GROUP = "flywheel.plugins"
PLUGINS_ENV = "FLYWHEEL_PLUGINS"

# (consumes, publishes) computed from a validated config, for kinds whose channels depend on it
ChannelsFn = Callable[[Any], tuple[tuple[str, ...], tuple[str, ...]]]


class PluginError(Exception):
    """A module named in ``FLYWHEEL_PLUGINS`` could not be imported."""


class ResumeConflict(Exception):
    """Raised by a section's ``on_resume`` hook: the run cannot follow what changed; the message says what (naming
    the key) and why, and the framework refuses the resume before anything starts."""


@dataclass(frozen=True)
class ActorKind:
    """Everything the spec loader and the runtime need to know about one kind of actor."""

    name: str  # "generator"
    config: type[pydantic.BaseModel]  # kind-specific fields (frozen, extra="forbid"); must not import torch
    factory: str  # "actors.generator._actor:GeneratorActor", imported lazily at run time
    consumes: tuple[str, ...] = ()  # default channels consumed
    publishes: tuple[str, ...] = ()  # default channels published
    summary: str = ""  # one line for `plan` and did-you-mean help
    # config field → spec section whose entry names it holds (one name or a list), e.g. {"domains": "domains"}
    references: Mapping[str, str] = field(default_factory=dict)
    # fields of `references` that must name at least one entry, for a kind that can do nothing without one (the
    # source kind and its domains): an empty list is an error, and so is null (every entry) when the section has none
    required_references: tuple[str, ...] = ()
    channels: ChannelsFn | None = None  # optional: default channels that depend on the config
    # optional: rules on an actor of this kind that its config model cannot see (its replicas, another section,
    # other actors, files it names), run on the whole spec once everything else in it is valid
    check: ActorCheck | None = None

    def default_channels(self, config: pydantic.BaseModel) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The (consumes, publishes) this kind uses when the spec does not override them."""
        if self.channels is not None:
            return self.channels(config)
        return self.consumes, self.publishes


class SectionCheck(Protocol):
    """What a section's hook may do while the spec is checked (implemented by the spec checker)."""

    def error(self, path: KeyPath, message: str, *, warning: bool = False, at_key: bool = False) -> None:
        """Report an issue at ``path`` (a full key path, e.g. ``("domains", "math", "source")``)."""

    def base_dir(self, path: KeyPath) -> Path:
        """The directory of the spec file that set ``path``: relative paths in a value resolve against it."""

    def where(self, path: KeyPath) -> str:
        """``file:line`` of the value at ``path``, for messages that point elsewhere."""

    def setting(self, path: KeyPath) -> str:
        """Where a user changes the value at ``path``, for messages that ask for another value: its key path
        (``actors.gateway.port``), or, when the value was read from ``${VAR}``, that variable and the key that reads it
        (``$FLYWHEEL_GATEWAY_PORT, which actors.gateway.port reads``)."""

    def unknown_key(self, path: KeyPath, allowed: Iterable[str]) -> None:
        """Report the last key of ``path`` as unknown, at the key, as every unknown key of a spec is reported (with a
        did-you-mean and the ``allowed`` keys): for keys of a mapping the section's model leaves free-form."""

    @property
    def thorough(self) -> bool:
        """False where a replica re-reads a spec its supervisor checked at start: hooks skip checks of what files
        hold (every row of a dataset, a checkpoint still there), which would only repeat that check at every start
        of every replica; paths still resolve."""

    @property
    def starting(self) -> bool:
        """Whether the spec is loaded to run here, now (``flywheel up``): hooks may check what must be free at the
        start, such as a port to listen on (`topology.bind_problem`); ``flywheel validate`` does not (a spec may be
        checked while its run is up)."""

    @property
    def local(self) -> bool:
        """Whether the spec runs on this machine (``runtime.kind: local``): a file it names that is not here is an
        error; on a cluster, where files may live on other nodes, a warning."""


# A section hook: (checker, key path of the section or entry, its validated model) → the model to keep (for
# instance with relative paths made absolute). Errors are reported through the checker, never raised.
SectionHook = Callable[[SectionCheck, "KeyPath", Any], Any]

# What a run writes down of a section (of one entry, when keyed) in its run.json at every start: (key path of the
# section or entry, its validated model) → JSON-able facts the spec's text does not hold (a model directory's config
# hash, paths resolved against the file that set them), which the section's resume hook compares with next time.
SectionRecord = Callable[["KeyPath", Any], Mapping[str, Any]]
# On `flywheel up --resume`: (key path, what the section's record hook wrote when the run last started, the validated
# model now) → warnings, one line each, logged before anything starts; raising ResumeConflict refuses the resume.
ResumeHook = Callable[["KeyPath", Mapping[str, Any], Any], Sequence[str]]
# What a section's value (of one entry, when keyed), as run.json's spec holds it, means to a resumed run → the value
# its `fixed_on_resume` keys are compared in, on both sides: two spellings of one thing read the same (a builtin
# model's preset and the sizes it stands for). Pure and total: a value it cannot read is given back as it is.
ResumeView = Callable[[Mapping[str, Any]], Mapping[str, Any]]

# A kind's check of one of its actors: (checker, key path of the actor block, the actor, the whole validated spec) →
# the config to keep (for instance with relative paths made absolute). Errors are reported through the checker.
ActorCheck = Callable[[SectionCheck, "KeyPath", "ActorSpec", "Spec"], pydantic.BaseModel]


@dataclass(frozen=True)
class SpecSection:
    """One application section of the spec: a top-level key, its model and its checks."""

    name: str  # the top-level key, e.g. "policy"
    model: type[pydantic.BaseModel]  # the section's model (of one entry, when keyed)
    keyed: bool = False  # a mapping of entry names (the spec's key pattern) → model, like domains
    required: bool = False  # the spec is incomplete without it
    entry_noun: str = ""  # keyed sections: what one entry is called in messages ("domain")
    summary: str = ""  # one line for help texts
    check: SectionHook | None = None  # runs on each validated value (each entry when keyed)
    # keys of the section a resumed run cannot change → why, as a clause ("the run's checkpoints hold this model's
    # weights"): `flywheel up --resume` with such a key changed is refused before anything starts. A key may be a
    # dotted path inside another ("config.n_layer"): the longest one that holds a changed key gives the reason
    fixed_on_resume: Mapping[str, str] = field(default_factory=dict)
    # dotted key paths inside those keys that may change all the same (how a model runs, not what its weights are)
    free_on_resume: tuple[str, ...] = ()
    record: SectionRecord | None = None  # what a run writes down of it at every start (see SectionRecord)
    on_resume: ResumeHook | None = None  # what a resume makes of that record and the section now (see ResumeHook)
    resume_view: ResumeView | None = None  # what its keys mean, for the fixed keys' comparison (see ResumeView)


@dataclass(frozen=True)
class Command:
    """``flywheel <name>``: a click command named by ``"module:attribute"``, imported when invoked."""

    name: str
    target: str
    summary: str = ""


_KINDS: dict[str, ActorKind] = {}
_SECTIONS: dict[str, SpecSection] = {}
_COMMANDS: dict[str, Command] = {}
_VIEW: list[str] = []
_LOADED = False


def _register(table: dict[str, Any], key: str, value: Any, what: str, same: Callable[[Any, Any], bool]) -> None:
    existing = table.get(key)
    if existing is not None and not same(existing, value):
        raise ValueError(f"{what} {key!r} is already registered ({existing!r}); refusing to replace it with {value!r}")
    table[key] = value


def register_actor_kind(kind: ActorKind) -> None:
    """Register (or re-register, e.g. on module reload) an actor kind under ``kind.name``."""
    _register(_KINDS, kind.name, kind, "actor kind", lambda a, b: a.factory == b.factory)


def register_spec_section(section: SpecSection) -> None:
    """Register an application section of the spec under its top-level key."""
    from topology._spec import FRAMEWORK_KEYS

    if section.name in FRAMEWORK_KEYS:
        raise ValueError(f"spec section {section.name!r} is the framework's own key")
    _register(_SECTIONS, section.name, section, "spec section", lambda a, b: a.model.__name__ == b.model.__name__)


def register_command(command: Command) -> None:
    """Register ``flywheel <command.name>``."""
    _register(_COMMANDS, command.name, command, "command", lambda a, b: a.target == b.target)


def register_live_view(target: str) -> None:
    """Name the live view of ``flywheel up`` (``"module:attribute"`` of a class built with no arguments, with
    ``renderable(records)`` → a rich renderable or None and ``line(records)`` → a str or None)."""
    _VIEW[:] = [target]


def import_plugins(value: str | None = None) -> list[str]:
    """Import the modules named in ``FLYWHEEL_PLUGINS`` (or ``value``); raises `PluginError` naming a bad one."""
    names = [n.strip() for n in (os.environ.get(PLUGINS_ENV, "") if value is None else value).split(",")]
    imported: list[str] = []
    for name in filter(None, names):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise PluginError(f"{PLUGINS_ENV}: cannot import {name!r}: {exc}") from exc
        imported.append(name)
    return imported


def load_plugins() -> None:
    """Import every installed application (entry points) and those named in ``FLYWHEEL_PLUGINS``, once; raises
    `PluginError` (and tries again on the next call) when a module named in ``FLYWHEEL_PLUGINS`` fails."""
    global _LOADED
    if _LOADED:
        return
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry.load()
        except Exception as exc:  # a broken plugin must not break validation of every spec
            warnings.warn(f"flywheel: plugin {entry.name!r} failed to load: {exc}", stacklevel=2)
            continue
        if isinstance(loaded, ActorKind):
            register_actor_kind(loaded)
    import_plugins()
    _LOADED = True


def actor_kinds() -> Mapping[str, ActorKind]:
    """All registered kinds, by name; read-only."""
    load_plugins()
    return MappingProxyType(_KINDS)


def spec_sections() -> Mapping[str, SpecSection]:
    """All registered application sections of the spec, by top-level key; read-only."""
    load_plugins()
    return MappingProxyType(_SECTIONS)


def commands() -> Mapping[str, Command]:
    """All registered application commands, by name; read-only."""
    load_plugins()
    return MappingProxyType(_COMMANDS)


def live_view() -> str | None:
    """The registered live view's ``"module:attribute"``, if any."""
    load_plugins()
    return _VIEW[0] if _VIEW else None


def resolve(target: str, what: str) -> Any:
    """Import ``"module:attribute"`` (attribute may be dotted)."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{what}: {target!r} is not 'module:attribute'")
    found: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


def resolve_factory(kind: ActorKind) -> type[Any]:
    """Import the actor class named by ``kind.factory`` (``"module:attribute"``)."""
    target = resolve(kind.factory, f"actor kind {kind.name!r}")
    if not isinstance(target, type):
        raise TypeError(f"actor kind {kind.name!r}: factory {kind.factory!r} is not a class")
    return target


__all__ = [
    "ENTRY_POINT_GROUP",
    "PLUGINS_ENV",
    "ActorCheck",
    "ActorKind",
    "ChannelsFn",
    "Command",
    "PluginError",
    "ResumeConflict",
    "ResumeHook",
    "ResumeView",
    "SectionCheck",
    "SectionHook",
    "SectionRecord",
    "SpecSection",
    "actor_kinds",
    "commands",
    "import_plugins",
    "live_view",
    "load_plugins",
    "register_actor_kind",
    "register_command",
    "register_live_view",
    "register_spec_section",
    "resolve",
    "resolve_factory",
    "spec_sections",
]
