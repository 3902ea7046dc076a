"""Spec file → validated `Spec`, collecting every issue: sections, actor blocks, cross-references.

Contract: `check_spec(path)` never raises for a user mistake; it returns ``(spec or None, issues)``, where issues
hold all errors and warnings (sorted by file and line). `load_spec` raises `SpecError` when there is any error. Each
top-level section, each entry of a keyed section (an application's domains, say), each channel and each actor block
is validated on its own, so one bad block does not hide the errors of the others. Then each application section's
hook runs on its validated value (it may resolve paths and open files, reporting through the checker); one whose
model refused some of its fields gets its hook too, run on the rest, so that a bad field does not hide the hook's
errors about the others. Cross-reference checks: unknown actor kinds (with a did-you-mean), config fields a kind
declares as references to a keyed section that name no entry of it (or, for a required reference, none at all),
channels consumed with no producer (unless ``external: true``); warnings for channels nobody consumes, channel
settings no actor uses, and resources this machine cannot give (local runtime only: a Ray cluster is elsewhere).
Last, once the rest of the spec is valid, each kind's own check (`ActorKind.check`) runs on each of its actors in
the whole spec: replica counts, rules across sections and actors, files a config names (so those errors come after
the others are fixed).

Non-goals: importing heavy actor code or user modules (validation must stay fast and side-effect free; what a
section or kind hook imports is the application's business).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from topology._errors import SpecError, SpecIssue, format_path
from topology._machine import bind_problem, machine_issues
from topology._messages import did_you_mean, issues_from_validation, unknown_key_message
from topology._names import channel_subject
from topology._registry import ActorKind, SpecSection, actor_kinds, spec_sections
from topology._spec import (
    FRAMEWORK_KEYS,
    KEY_PATTERN,
    NAME_PATTERN,
    ActorCommon,
    ActorSpec,
    BusSpec,
    ChannelOverride,
    ChannelSpec,
    RuntimeSpec,
    Spec,
    show,
)
from topology._yaml import Document, KeyPath, load_document, parse_text

ModelT = TypeVar("ModelT", bound=BaseModel)
_REQUIRED = ("name", "actors")
# channels whose readers are people and their tools (flywheel review, dead-letter inspection), not actors
_READ_BY_PEOPLE = frozenset({"deadletter", "review"})


class _Checker:
    def __init__(self, doc: Document, *, thorough: bool = True, starting: bool = False) -> None:
        self.doc = doc
        self.thorough = thorough
        self.starting = starting
        self.local = True  # until runtime.kind says otherwise
        self.issues: list[SpecIssue] = list(doc.issues)
        # key paths that already carry an error from loading (e.g. an undefined ${VAR}): no second error there
        self.blocked = {i.path for i in doc.issues if i.path}
        self.wiring: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # actor → (consumes, publishes)
        self.channels_known = True  # false when an actor's channels cannot be known (unknown kind, bad block)

    def error(self, path: KeyPath, message: str, *, warning: bool = False, at_key: bool = False) -> None:
        loc = self.doc.key_loc(path) if at_key else self.doc.value_loc(path)
        self.issues.append(
            SpecIssue(loc.file, loc.line, loc.col, format_path(path), message, "warning" if warning else "error")
        )

    def base_dir(self, path: KeyPath) -> Path:
        return self.doc.base_dir(path)

    def where(self, path: KeyPath) -> str:
        loc = self.doc.value_loc(path)
        return f"{loc.file}:{loc.line}"

    def setting(self, path: KeyPath) -> str:
        return self.doc.setting(path)

    def unknown_key(self, path: KeyPath, allowed: Iterable[str]) -> None:
        self.error(path, unknown_key_message(str(path[-1]), allowed), at_key=True)

    def validate(
        self, model: type[ModelT], data: Any, path: KeyPath, allowed_extra: tuple[str, ...] = ()
    ) -> ModelT | None:
        try:
            return model.model_validate_json(orjson.dumps(data, default=str), strict=True)
        except ValidationError as exc:
            for issue in issues_from_validation(exc, model, data, path, self.doc, allowed_extra):
                if not any(issue.path == b or issue.path.startswith((f"{b}.", f"{b}[")) for b in self.blocked):
                    self.issues.append(issue)
            return None
        except orjson.JSONEncodeError as exc:
            self.error(path, f"expected plain YAML values, got something else ({exc})")
            return None

    def named(self, path: KeyPath, pattern: str, what: str) -> bool:
        name = path[-1]
        if isinstance(name, str) and re.match(pattern, name):
            return True
        self.error(path, f"expected {what} matching {pattern}, got {show(name)}", at_key=True)
        return False

    def mapping(self, data: Any, path: KeyPath, what: str) -> dict[str, Any]:
        if isinstance(data, dict):
            return data
        if data is not None:
            self.error(path, f"expected a mapping of {what}, got {show(data)}")
        return {}

    # -- the whole spec ------------------------------------------------------------------------------
    def run(self, source_path: Path) -> Spec | None:
        data = self.doc.data
        if not isinstance(data, dict):
            return None
        sections = spec_sections()
        top_level = (*FRAMEWORK_KEYS, *sections)
        for key in data:
            if key not in top_level:
                self.error((key,), unknown_key_message(key, top_level, "top-level key"), at_key=True)
        required = (*_REQUIRED, *(s.name for s in sections.values() if s.required))
        for key in required if not self.doc.incomplete else ():
            if key not in data:
                loc = self.doc.root
                self.issues.append(
                    SpecIssue(loc.file, loc.line, loc.col, key, f"required top-level key '{key}' is missing")
                )
        name = data.get("name")
        if "name" in data and not (isinstance(name, str) and re.match(NAME_PATTERN, name)):
            self.error(("name",), f"expected a topology name matching {NAME_PATTERN}, got {show(name)}")
            name = None
        description = data.get("description", "")
        if not isinstance(description, str):
            self.error(("description",), f"expected a string, got {show(description)}")
        bus = self.validate(BusSpec, data.get("bus") or {}, ("bus",))
        if bus is not None and bus.creds_file and self.thorough:
            self.check_creds_file(bus.creds_file)
        runtime = self.validate(RuntimeSpec, data.get("runtime") or {}, ("runtime",))
        self.local = runtime is None or runtime.kind == "local"
        values = {s.name: self.check_section(s, data[s.name]) for s in sections.values() if s.name in data}
        channels_raw = self.mapping(data.get("channels"), ("channels",), "channel name → settings")
        overrides: dict[str, ChannelOverride] = {}
        for cname, block in channels_raw.items():
            if self.named(("channels", cname), KEY_PATTERN, "a channel name"):
                override = self.validate(ChannelOverride, block or {}, ("channels", cname))
                if override is not None:
                    overrides[cname] = override
        actors = self.check_actors(data, sections)
        if runtime is not None:
            self.check_colocate(runtime, data)
        channels = self.check_channels(actors, overrides, channels_raw, name or "topology")
        if any(i.is_error for i in self.issues) or name is None or bus is None or runtime is None:
            return None
        run_dir = runtime.run_dir
        if not run_dir.is_absolute():
            run_dir = (
                self.doc.base_dir(("runtime", "run_dir"))
                if "run_dir" in (data.get("runtime") or {})
                else source_path.parent
            ) / run_dir
        runtime = runtime.model_copy(update={"run_dir": run_dir.resolve()})
        spec = Spec(
            name=name,
            bus=bus,
            runtime=runtime,
            actors={a.name: a for a in actors.values() if a is not None} if actors else {},
            channels=channels,
            source_path=source_path.resolve(),
            description=str(description),
            data=data,
            sections=values,
        )
        if self.starting and self.local and runtime.metrics_port:
            problem = bind_problem(runtime.metrics_host, runtime.metrics_port)
            if problem is not None:
                at = ("runtime", "metrics_port")
                self.error(
                    at,
                    f"expected a port free on this machine, but {problem} (stop it, or set another port in "
                    f"{self.setting(at)}; 0 picks a free one, null serves no metrics)",
                )
        checked = self.check_kinds(spec)  # None on any error, this one's too
        if checked is None:
            return None
        spec = checked
        if runtime.kind == "local":
            for where, message in machine_issues(spec):
                self.error(where, message, warning=True)
        warnings = tuple(sorted((i for i in self.issues if not i.is_error), key=lambda i: (i.file, i.line, i.col)))
        return dataclasses.replace(spec, warnings=warnings)

    def check_creds_file(self, creds_file: str) -> None:
        """``flywheel up`` connects with the creds file before anything starts (and stops when it is not there)."""
        path = Path(creds_file)
        if not path.is_file():
            where = "" if path.is_absolute() else f"; relative paths start in the current directory, {Path.cwd()}"
            self.error(("bus", "creds_file"), f"expected a NATS .creds file, got {show(creds_file)} (no file{where})")

    def check_kinds(self, spec: Spec) -> Spec | None:
        """Each kind's own check (`ActorKind.check`) on each of its actors, in the whole spec; None on an error."""
        kinds = actor_kinds()
        actors = dict(spec.actors)
        for name, actor in spec.actors.items():
            check = kinds[actor.kind].check
            if check is not None:
                config = check(self, ("actors", name), actor, spec)
                if config is not actor.config:
                    actors[name] = dataclasses.replace(actor, config=config)
        if any(i.is_error for i in self.issues):
            return None
        return dataclasses.replace(spec, actors=actors)

    def check_colocate(self, runtime: RuntimeSpec, data: dict[str, Any]) -> None:
        """Every name in ``runtime.colocate`` must be an actor of this spec."""
        names = [n for n in (data.get("actors") or {}) if isinstance(n, str)]
        for gi, group in enumerate(runtime.colocate):
            for ni, name in enumerate(group):
                if name not in names:
                    self.error(
                        ("runtime", "colocate", gi, ni),
                        f"expected an actor name ({', '.join(names) or 'none defined'}), got {show(name)}",
                    )

    def check_section(self, section: SpecSection, raw: Any) -> Any:
        """Validate one application section (each entry on its own, when keyed) and run its hook."""
        path: KeyPath = (section.name,)
        if not section.keyed:
            value = self.validate(section.model, raw, path)
            if value is None:
                self.check_the_rest(section, raw, path)
            return section.check(self, path, value) if value is not None and section.check else value
        entries: dict[str, Any] = {}
        noun = section.entry_noun or "entry"
        for key, block in self.mapping(raw, path, f"{noun} name → {noun}").items():
            entry_path: KeyPath = (section.name, key)
            if self.named(entry_path, KEY_PATTERN, f"a {noun} name"):
                entry = self.validate(section.model, block, entry_path)
                if entry is not None:
                    entries[key] = section.check(self, entry_path, entry) if section.check else entry
                else:
                    self.check_the_rest(section, block, entry_path)
        return entries

    def check_the_rest(self, section: SpecSection, block: Any, path: KeyPath) -> None:
        """Run the section's hook on a value its model refused, with the refused fields at their defaults, so that
        one mistake does not hide another in the same block (a ``group_size: 0`` beside a misspelt ``verifier``).
        What the hook says about a refused field (it saw the default, not what was written) is not reported: the
        model's error holds that key already. When a refused field has no default, or the model refused the value as
        a whole, the hook does not run."""
        if section.check is None or not isinstance(block, dict):
            return
        try:
            section.model.model_validate_json(orjson.dumps(block, default=str), strict=True)
            return
        except ValidationError as exc:
            refused = {str(error["loc"][0]) for error in exc.errors() if error["loc"]}
            if not refused or any(not error["loc"] for error in exc.errors()):
                return
        except orjson.JSONEncodeError:
            return
        rest = {key: value for key, value in block.items() if key not in refused}
        try:
            value = section.model.model_validate_json(orjson.dumps(rest, default=str), strict=True)
        except ValidationError:  # a refused field is required
            return
        section.check(self, path, value)  # its word on a refused field comes second there, and is dropped (_finish)

    # -- actors --------------------------------------------------------------------------------------
    def check_actors(self, data: dict[str, Any], sections: Mapping[str, SpecSection]) -> dict[str, ActorSpec | None]:
        raw = self.mapping(data.get("actors"), ("actors",), "actor name → actor")
        if "actors" in data and data["actors"] in (None, {}):
            self.error(("actors",), "expected at least one actor, got none")
        kinds = actor_kinds()
        actors: dict[str, ActorSpec | None] = {}
        for name, block in raw.items():
            path: KeyPath = ("actors", name)
            self.named(path, KEY_PATTERN, "an actor name")
            if block is None:
                block = {}
            if not isinstance(block, dict):
                self.error(
                    path, f"expected a mapping of actor settings (kind, replicas, resources, …), got {show(block)}"
                )
                self.channels_known = False
                continue
            actors[name] = self.check_actor(name, block, kinds, sections)
        return actors

    def check_actor(
        self, name: str, block: dict[str, Any], kinds: Any, sections: Mapping[str, SpecSection]
    ) -> ActorSpec | None:
        path: KeyPath = ("actors", name)
        kind_name = block.get("kind", name)
        common_fields = tuple(ActorCommon.model_fields)
        if not isinstance(kind_name, str):
            self.error((*path, "kind"), f"expected an actor kind name, got {show(kind_name)}")
            kind = None
        else:
            kind = kinds.get(kind_name)
            if kind is None:
                known = sorted(kinds)
                hint = "" if "kind" in block else f" (no kind: given, so the kind is the actor's name '{name}')"
                where = (*path, "kind") if "kind" in block else path
                self.error(
                    where,
                    f"unknown actor kind '{kind_name}'{did_you_mean(kind_name, known)}{hint} "
                    f"— known kinds: {', '.join(known)}",
                    at_key="kind" not in block,
                )
        config_fields = tuple(kind.config.model_fields) if kind is not None else ()
        allowed = (*common_fields, *config_fields)
        for key in block:
            if key not in allowed and kind is not None:
                self.error((*path, key), unknown_key_message(key, allowed) + f" (for kind {kind.name})", at_key=True)
        common = self.validate(ActorCommon, {k: v for k, v in block.items() if k in common_fields}, path, config_fields)
        if kind is None:
            self.channels_known = False
            return None
        config = self.validate(kind.config, {k: v for k, v in block.items() if k in config_fields}, path, common_fields)
        if config is not None:
            self.check_references(path, kind, config, sections)
        consumes, publishes = kind.default_channels(config) if config is not None else (kind.consumes, kind.publishes)
        if common is not None:
            consumes = common.consumes if common.consumes is not None else consumes
            publishes = common.publishes if common.publishes is not None else publishes
        elif "consumes" in block or "publishes" in block:
            self.channels_known = False  # an override we could not read: channel checks would guess
        self.wiring[name] = (tuple(consumes), tuple(publishes))
        if common is None or config is None:
            return None
        return ActorSpec(
            name=name,
            kind=kind.name,
            replicas=common.replicas,
            resources=common.resources,
            consumes=tuple(consumes),
            publishes=tuple(publishes),
            config=config,
        )

    def check_references(
        self, path: KeyPath, kind: ActorKind, config: BaseModel, sections: Mapping[str, SpecSection]
    ) -> None:
        """Each config field the kind declares as a reference must name an entry of its keyed section."""
        for field, section_name in kind.references.items():
            section = sections.get(section_name)
            noun = section.entry_noun if section is not None and section.entry_noun else section_name
            names = set(self.mapping_keys(section_name))
            defined = ", ".join(sorted(names)) or "none"
            value = getattr(config, field, None)
            if field in kind.required_references:
                if value is None and not names:
                    self.error(
                        path,
                        f"kind {kind.name} needs at least one {noun} ({field}: not given means every {noun}), "
                        f"but the spec declares no {section_name} — add a {section_name}: section",
                        at_key=True,
                    )
                elif isinstance(value, list | tuple) and not value:
                    self.error((*path, field), f"expected at least one {noun} name, got none")
            refs: list[tuple[KeyPath, Any]]
            if isinstance(value, list | tuple):
                refs = [((*path, field, i), v) for i, v in enumerate(value)]
            else:
                refs = [((*path, field), value)] if value is not None else []
            for ref_path, ref in refs:
                if ref not in names:
                    self.error(
                        ref_path,
                        f"unknown {noun} '{ref}'{did_you_mean(str(ref), names)} — defined {section_name}: {defined}",
                    )

    def mapping_keys(self, key: str) -> list[str]:
        """The entry names a keyed top-level section was written with (whether or not each entry is valid)."""
        raw = self.doc.data.get(key) if isinstance(self.doc.data, dict) else None
        return [k for k in raw if isinstance(k, str)] if isinstance(raw, dict) else []

    # -- channels ------------------------------------------------------------------------------------
    def check_channels(
        self,
        actors: dict[str, ActorSpec | None],
        overrides: dict[str, ChannelOverride],
        raw_overrides: dict[str, Any],
        topology: str,
    ) -> dict[str, ChannelSpec]:
        producers: dict[str, list[str]] = {}
        consumers: dict[str, list[str]] = {}
        for name, (consumes, publishes) in self.wiring.items():
            for channel in publishes:
                producers.setdefault(channel, []).append(name)
            for channel in consumes:
                consumers.setdefault(channel, []).append(name)
        for name, (consumes, _) in self.wiring.items() if self.channels_known else ():
            block = (self.doc.data.get("actors") or {}).get(name) or {}
            kind_name = block.get("kind", name)
            for index, channel in enumerate(consumes):
                external = channel in overrides and overrides[channel].external
                if channel in producers or external or (channel in raw_overrides and channel not in overrides):
                    continue
                where: KeyPath = ("actors", name, "consumes", index) if "consumes" in block else ("actors", name)
                source = "" if "consumes" in block else f" (a default of kind {kind_name})"
                self.error(
                    where,
                    f"consumes channel '{channel}'{source} but no actor publishes it — add a producer, "
                    f"or declare channels: {{{channel}: {{external: true}}}}",
                    at_key="consumes" not in block,
                )
        for channel, names in producers.items() if self.channels_known else ():
            if channel not in consumers and channel not in _READ_BY_PEOPLE:
                self.error(
                    ("actors", names[0]),
                    f"publishes channel '{channel}' but no actor consumes it (messages will pile up)",
                    at_key=True,
                    warning=True,
                )
        for channel in overrides:
            if channel not in producers and channel not in consumers:
                self.error(
                    ("channels", channel),
                    f"channel '{channel}' is configured but no actor uses it",
                    at_key=True,
                    warning=True,
                )
        resolved: dict[str, ChannelSpec] = {}
        for channel in sorted({*producers, *consumers, *overrides}):
            settings = overrides.get(channel, ChannelOverride())
            resolved[channel] = ChannelSpec(
                name=channel, subject=channel_subject(topology, channel), **settings.model_dump()
            )
        return resolved


def _finish(
    doc: Document, source_path: Path, *, thorough: bool = True, starting: bool = False
) -> tuple[Spec | None, list[SpecIssue]]:
    checker = _Checker(doc, thorough=thorough, starting=starting)
    spec = checker.run(source_path)
    unique: dict[tuple[str, str, int], SpecIssue] = {}
    for issue in checker.issues:  # two checks may flag the same key (e.g. a kind that is not a string)
        unique.setdefault((issue.path, issue.file, issue.line), issue)
    issues = sorted(unique.values(), key=lambda i: (i.file != doc.root.file, i.file, i.line, i.col))
    return (spec if not any(i.is_error for i in issues) else None), issues


def check_spec(
    path: str | Path, environ: dict[str, str] | None = None, *, thorough: bool = True, starting: bool = False
) -> tuple[Spec | None, list[SpecIssue]]:
    """Validate a spec file: ``(spec, issues)``; spec is None when any issue is an error. ``thorough=False``: a
    replica re-reading the spec its supervisor checked (see ``SectionCheck.thorough``); ``starting``: the spec is
    about to run here (``flywheel up``; see ``SectionCheck.starting``).

    Never raises for user mistakes."""
    doc = load_document(path, environ)
    return _finish(doc, Path(path), thorough=thorough, starting=starting)


def load_spec(
    path: str | Path, environ: dict[str, str] | None = None, *, thorough: bool = True, starting: bool = False
) -> Spec:
    """Load and validate a spec file; raises `SpecError` with every issue when any is an error."""
    spec, issues = check_spec(path, environ, thorough=thorough, starting=starting)
    if spec is None:
        raise SpecError(issues)
    return spec


def load_spec_text(
    text: str, filename: str = "<spec>", environ: dict[str, str] | None = None, *, source: Path | None = None
) -> Spec:
    """Validate spec text (no ``include:``). Relative paths resolve against the current directory, or against the
    folder of ``source``: the spec file the text is a copy of (it need not exist any more; a run's ``run.json``)."""
    doc = parse_text(text, filename, os.environ.copy() if environ is None else environ)
    if source is not None:
        doc.sources[filename] = source.resolve()
    if isinstance(doc.data, dict) and "include" in doc.data:
        doc.issue(doc.key_loc(("include",)), ("include",), "include: needs a spec file (use load_spec with a path)")
    elif doc.data is not None and not isinstance(doc.data, dict):
        got = show(doc.data)
        doc.issue(doc.root, (), f"expected a mapping at the top of the spec (name:, actors:, …), got {got}")
    spec, issues = _finish(doc, source if source is not None else Path(filename))
    if spec is None:
        raise SpecError(issues)
    return spec


__all__ = ["check_spec", "load_spec", "load_spec_text"]
