"""Spec file → validated `Spec`, collecting every issue: sections, actor blocks, cross-references.

Contract: `check_spec(path)` never raises for a user mistake; it returns ``(spec or None, issues)``, where
issues hold all errors and warnings (sorted by file and line). `load_spec` raises `SpecError` when there is
any error. Each top-level section, each domain, each channel and each actor block is validated on its own,
so one bad block does not hide the errors of the others. Cross-reference checks: unknown actor kinds (with
a did-you-mean), domains referenced by actors but not defined, channels consumed with no producer (unless
``external: true``), missing ``jsonl:`` files; warnings for channels nobody consumes, channel settings no
actor uses, and resources this machine cannot give (local runtime only: a Ray cluster is elsewhere).

The domains' task sources are opened as the source actor opens them (pure Python: builtin options, JSONL
rows, held-out splits), so their mistakes carry a line too.

Non-goals: importing heavy actor code or user verifier modules (validation must stay fast and side-effect free).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from pathlib import Path
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from topology._errors import SpecError, SpecIssue, format_path
from topology._machine import machine_issues
from topology._messages import did_you_mean, issues_from_validation, unknown_key_message
from topology._registry import ActorKind, actor_kinds
from topology._spec import (
    KEY_PATTERN,
    NAME_PATTERN,
    ActorCommon,
    ActorSpec,
    BusSpec,
    ChannelOverride,
    ChannelSpec,
    DomainSpec,
    PolicySpec,
    RuntimeSpec,
    Spec,
    show,
    subject_for,
)
from topology._yaml import Document, KeyPath, load_document, parse_text

ModelT = TypeVar("ModelT", bound=BaseModel)
TOP_LEVEL_KEYS = ("name", "description", "include", "bus", "runtime", "policy", "domains", "actors", "channels")
_REQUIRED = ("name", "policy", "actors")
# channels whose readers are people and their tools (flywheel review, dead-letter inspection), not actors
_READ_BY_PEOPLE = frozenset({"deadletter", "review"})


class _Checker:
    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.issues: list[SpecIssue] = list(doc.issues)
        # key paths that already carry an error from loading (e.g. an undefined ${VAR}): no second error there
        self.blocked = {i.path for i in doc.issues if i.path}
        self.wiring: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # actor → (consumes, publishes)
        self.channels_known = True  # false when an actor's channels cannot be known (unknown kind, bad block)

    def error(self, path: KeyPath, message: str, *, at_key: bool = False, severity: str = "error") -> None:
        loc = self.doc.key_loc(path) if at_key else self.doc.value_loc(path)
        self.issues.append(
            SpecIssue(
                loc.file, loc.line, loc.col, format_path(path), message, "warning" if severity == "warning" else "error"
            )
        )

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
    def check_hf_model(self, model: str) -> str:
        """``hf:<dir>`` with a relative dir that exists beside the file that set it resolves to that dir, like every
        other path in a spec; anything else stays as written (a hub id, or a path on the machines that run the
        model) with a warning when it is not a model directory here."""
        given = Path(model[3:]).expanduser()
        candidate = given if given.is_absolute() else (self.doc.base_dir(("policy", "model")) / given).resolve()
        if (candidate / "config.json").is_file():
            return f"hf:{candidate}"
        self.error(
            ("policy", "model"),
            f"expected a Hugging Face model directory with a config.json, but {candidate} "
            "is none on this machine: fine for a hub id or a path that exists where the model is served "
            "(an HTTP engine's server), an error for the builtin torch engine and the learner",
            severity="warning",
        )
        return model

    def run(self, source_path: Path) -> Spec | None:
        data = self.doc.data
        if not isinstance(data, dict):
            return None
        for key in data:
            if key not in TOP_LEVEL_KEYS:
                self.error((key,), unknown_key_message(key, TOP_LEVEL_KEYS, "top-level key"), at_key=True)
        for key in _REQUIRED if not self.doc.incomplete else ():
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
        runtime = self.validate(RuntimeSpec, data.get("runtime") or {}, ("runtime",))
        policy = self.validate(PolicySpec, data["policy"], ("policy",)) if "policy" in data else None
        domains_raw = self.mapping(data.get("domains"), ("domains",), "domain name → domain")
        domains: dict[str, DomainSpec] = {}
        for dname, block in domains_raw.items():
            path: KeyPath = ("domains", dname)
            if self.named(path, KEY_PATTERN, "a domain name"):
                domain = self.validate(DomainSpec, block, path)
                if domain is not None:
                    domains[dname] = self.check_domain_files(dname, domain)
        channels_raw = self.mapping(data.get("channels"), ("channels",), "channel name → settings")
        overrides: dict[str, ChannelOverride] = {}
        for cname, block in channels_raw.items():
            if self.named(("channels", cname), KEY_PATTERN, "a channel name"):
                override = self.validate(ChannelOverride, block or {}, ("channels", cname))
                if override is not None:
                    overrides[cname] = override
        actors = self.check_actors(data, set(domains_raw))
        if runtime is not None:
            self.check_colocate(runtime, data)
        channels = self.check_channels(actors, overrides, channels_raw, name or "topology")
        if any(i.is_error for i in self.issues) or name is None or None in (bus, runtime, policy):
            return None
        assert bus is not None and runtime is not None and policy is not None
        run_dir = runtime.run_dir
        if not run_dir.is_absolute():
            run_dir = (
                self.doc.base_dir(("runtime", "run_dir"))
                if "run_dir" in (data.get("runtime") or {})
                else source_path.parent
            ) / run_dir
        runtime = runtime.model_copy(update={"run_dir": run_dir.resolve()})
        if policy.model.startswith("hf:"):
            policy = policy.model_copy(update={"model": self.check_hf_model(policy.model)})
        if policy.checkpoint and not Path(policy.checkpoint).is_absolute():
            checkpoint = (self.doc.base_dir(("policy", "checkpoint")) / policy.checkpoint).resolve()
            policy = policy.model_copy(update={"checkpoint": str(checkpoint)})
        spec = Spec(
            name=name,
            bus=bus,
            runtime=runtime,
            policy=policy,
            domains=domains,
            actors={a.name: a for a in actors.values() if a is not None} if actors else {},
            channels=channels,
            source_path=source_path.resolve(),
            description=str(description),
            data=data,
        )
        if runtime.kind == "local":
            for where, message in machine_issues(spec):
                self.error(where, message, severity="warning")
        warnings = tuple(sorted((i for i in self.issues if not i.is_error), key=lambda i: (i.file, i.line, i.col)))
        return dataclasses.replace(spec, warnings=warnings)

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

    def check_domain_files(self, name: str, domain: DomainSpec) -> DomainSpec:
        """Check ``jsonl:`` files exist and the source opens; returns the domain with those paths made absolute."""
        before = len(self.issues)
        resolved: dict[str, str] = {}
        for field in ("source", "heldout"):
            value = getattr(domain, field)
            if isinstance(value, str) and value.startswith("jsonl:"):
                path: KeyPath = ("domains", name, field)
                target = (self.doc.base_dir(path) / os.path.expanduser(value.removeprefix("jsonl:"))).resolve()
                resolved[field] = f"jsonl:{target}"
                if not target.is_file():
                    self.error(path, f"expected an existing JSONL file, got {show(value)} ({target} does not exist)")
        module, sep, _ = domain.verifier.partition(":")
        if sep and importlib.util.find_spec(module.split(".")[0]) is None:
            self.error(
                ("domains", name, "verifier"),
                f"module '{module}' is not importable here (is it installed / on PYTHONPATH?)",
                severity="warning",
            )
        domain = domain.model_copy(update=resolved) if resolved else domain
        if not any(issue.severity == "error" for issue in self.issues[before:]):  # a missing file: said already
            self.check_domain_opens(name, domain)
        return domain

    def check_domain_opens(self, name: str, domain: DomainSpec) -> None:
        """Open the domain's task source as the source actor does at start (builtin options, every JSONL row,
        the held-out split), so a bad option or row is reported at its line now, not as a traceback at `up`."""
        from actors.domains import SourceError, open_source

        path: KeyPath = ("domains", name)
        try:
            open_source(domain.source, domain=name, heldout=domain.heldout, options=domain.source_options)
        except SourceError as err:
            message = str(err)
            if err.option is not None and err.option in domain.source_options:
                at: KeyPath = ("source_options", err.option)
                query = domain.source.partition("?")[2].split("&")
                if any(part.partition("=")[0] == err.option for part in query):  # given twice: the other half may
                    # sit in another file (include: merges source_options key by key)
                    loc = self.doc.value_loc((*path, "source"))
                    message += f" (the source string is at {loc.file}:{loc.line})"
            else:
                at = ("source",) if err.option is not None else (err.key or "source",)
            self.error(path + at, message)

    # -- actors --------------------------------------------------------------------------------------
    def check_actors(self, data: dict[str, Any], domain_names: set[str]) -> dict[str, ActorSpec | None]:
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
            actors[name] = self.check_actor(name, block, kinds, domain_names)
        return actors

    def check_actor(self, name: str, block: dict[str, Any], kinds: Any, domain_names: set[str]) -> ActorSpec | None:
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
            self.check_domain_refs(path, kind, config, domain_names)
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

    def check_domain_refs(self, path: KeyPath, kind: ActorKind, config: BaseModel, domain_names: set[str]) -> None:
        defined = ", ".join(sorted(domain_names)) or "none"
        for field in kind.domain_fields:
            value = getattr(config, field, None)
            refs: list[tuple[KeyPath, Any]]
            if isinstance(value, list | tuple):
                refs = [((*path, field, i), v) for i, v in enumerate(value)]
            else:
                refs = [((*path, field), value)] if value is not None else []
            for ref_path, ref in refs:
                if ref not in domain_names:
                    self.error(
                        ref_path,
                        f"unknown domain '{ref}'{did_you_mean(str(ref), domain_names)} — defined domains: {defined}",
                    )

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
                    severity="warning",
                )
        for channel in overrides:
            if channel not in producers and channel not in consumers:
                self.error(
                    ("channels", channel),
                    f"channel '{channel}' is configured but no actor uses it",
                    at_key=True,
                    severity="warning",
                )
        resolved: dict[str, ChannelSpec] = {}
        for channel in sorted({*producers, *consumers, *overrides}):
            settings = overrides.get(channel, ChannelOverride())
            resolved[channel] = ChannelSpec(
                name=channel, subject=subject_for(topology, channel), **settings.model_dump()
            )
        return resolved


def _finish(doc: Document, source_path: Path) -> tuple[Spec | None, list[SpecIssue]]:
    checker = _Checker(doc)
    spec = checker.run(source_path)
    unique: dict[tuple[str, str, int], SpecIssue] = {}
    for issue in checker.issues:  # two checks may flag the same key (e.g. a kind that is not a string)
        unique.setdefault((issue.path, issue.file, issue.line), issue)
    issues = sorted(unique.values(), key=lambda i: (i.file != doc.root.file, i.file, i.line, i.col))
    return (spec if not any(i.is_error for i in issues) else None), issues


def check_spec(path: str | Path, environ: dict[str, str] | None = None) -> tuple[Spec | None, list[SpecIssue]]:
    """Validate a spec file: ``(spec, issues)``; spec is None when any issue is an error.

    Never raises for user mistakes."""
    doc = load_document(path, environ)
    return _finish(doc, Path(path))


def load_spec(path: str | Path, environ: dict[str, str] | None = None) -> Spec:
    """Load and validate a spec file; raises `SpecError` with every issue when any is an error."""
    spec, issues = check_spec(path, environ)
    if spec is None:
        raise SpecError(issues)
    return spec


def load_spec_text(text: str, filename: str = "<spec>", environ: dict[str, str] | None = None) -> Spec:
    """Validate spec text (no ``include:``; relative paths resolve against the current directory)."""
    doc = parse_text(text, filename, os.environ.copy() if environ is None else environ)
    if isinstance(doc.data, dict) and "include" in doc.data:
        doc.issue(doc.key_loc(("include",)), ("include",), "include: needs a spec file (use load_spec with a path)")
    elif doc.data is not None and not isinstance(doc.data, dict):
        got = show(doc.data)
        doc.issue(doc.root, (), f"expected a mapping at the top of the spec (name:, actors:, …), got {got}")
    spec, issues = _finish(doc, Path(filename))
    if spec is None:
        raise SpecError(issues)
    return spec


__all__ = ["TOP_LEVEL_KEYS", "check_spec", "load_spec", "load_spec_text"]
