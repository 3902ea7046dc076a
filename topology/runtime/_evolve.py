"""What a resumed run's spec may change: the changes are named in the log once, and a change the run's state cannot
follow refuses the resume before anything starts.

Contract: :func:`spec_changes` compares the spec a run last started with (``run.json``'s ``spec``) with the one it
resumes with, key path by key path (a mapping entry added or removed whole is one change; lists compare whole).
:func:`check_resumable` raises :class:`ResumeRefused` — one line naming the key, its old and new value, why the run
cannot follow and what to do — when a change touches a key an application section declared fixed for the life of
a run (`SpecSection.fixed_on_resume`, e.g. the policy's model: the run's checkpoints hold its weights; a dotted key
inside another gives the reason for its own changes; less the paths the section leaves free, `free_on_resume`), or
the topology's name (the run's channels, consumers and buckets are named after it). A section with a
`SpecSection.resume_view` has its fixed keys compared in that view of both specs — what the keys mean, not how they
are spelled (a builtin model's ``preset: tiny`` or the three sizes it stands for: one model) — and a refusal then
also says how the spec wrote the change; the changes returned (and logged) are the spec's text's.

:func:`section_records` is what the sections' ``record`` hooks write down of a spec (``run.json``'s ``records``:
facts its text does not hold, such as a model directory's config hash); :func:`check_records` hands each section's
``on_resume`` hook what was recorded when the run last started, and returns the warnings they give — a
``ResumeConflict`` they raise refuses the resume like a fixed key's change. Runs recorded before records were kept
(or a section or entry with none) are not checked.

Non-goals: judging what a change means to an actor (an actor that must say "this starts a new series" does so
itself, from its own state); runs whose ``run.json`` has no spec (written before it kept one) are not checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from topology._registry import ResumeConflict, SpecSection, spec_sections
from topology._spec import Spec
from topology.runtime._rundir import RunNotFound

__all__ = [
    "ResumeRefused",
    "SpecChange",
    "check_records",
    "check_resumable",
    "describe_changes",
    "section_records",
    "spec_changes",
]

_SHOWN = 60  # characters of a value shown in a message

SpecChange = tuple[tuple[str, ...], Any, Any]  # (key path, before, after); a side that is absent is _ABSENT
_ABSENT: Any = type("_Absent", (), {"__repr__": lambda self: "(absent)"})()


class ResumeRefused(RunNotFound):
    """The spec changed in a way the run being resumed cannot follow; the message says which key and what to do."""


def _plain(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` as JSON would give it back (as ``run.json`` holds it): tuples become lists, mappings dicts."""
    loaded: dict[str, Any] = orjson.loads(orjson.dumps(data, default=str))
    return loaded


def spec_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[SpecChange]:
    """Every key path whose value differs between ``before`` and ``after`` (see the module docstring)."""
    changes: list[SpecChange] = []

    def walk(path: tuple[str, ...], old: Any, new: Any) -> None:
        if isinstance(old, dict) and isinstance(new, dict):
            for key in [*old, *(k for k in new if k not in old)]:
                walk((*path, str(key)), old.get(key, _ABSENT), new.get(key, _ABSENT))
        elif old != new:
            changes.append((path, old, new))

    walk((), _plain(before), _plain(after))
    return changes


def _show(value: Any) -> str:
    text = "(absent)" if value is _ABSENT else orjson.dumps(value, default=str).decode()
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def describe_changes(changes: Sequence[SpecChange], within: str = "") -> str:
    """``key: old → new; …`` (``key: added`` / ``key: removed`` for an entry added or removed whole, ``key: old →
    unset (the default)`` for a value no longer written); ``within``: the section the key paths are inside of, put
    before each."""
    parts = []
    for path, old, new in changes:
        key = ".".join((within, *path) if within else path)
        if old is _ABSENT:
            parts.append(f"{key}: added" + ("" if isinstance(new, dict) else f" ({_show(new)})"))
        elif new is _ABSENT:
            # a value no longer written is its default again ("replicas: removed" read as if the replicas were)
            parts.append(f"{key}: removed" if isinstance(old, dict) else f"{key}: {_show(old)} → unset (the default)")
        else:
            parts.append(f"{key}: {_show(old)} → {_show(new)}")
    return "; ".join(parts)


def check_resumable(
    run_dir: Path,
    run_name: str,
    before: Mapping[str, Any] | None,
    *,
    spec_path: Path | None,
    name: str,
    after: Mapping[str, Any] | None,
) -> list[SpecChange]:
    """The changes from the spec the run at ``run_dir`` last started with (``before``, its name ``run_name``) to
    the one it resumes with (``after``, named ``name``, read from ``spec_path``); ``ResumeRefused`` when one of them
    cannot be followed (see the module docstring)."""
    fresh = _fresh(spec_path)
    if run_name != name:
        raise ResumeRefused(
            f"cannot resume {run_dir} with spec {spec_path}: the run is topology {run_name!r}, the spec is {name!r} "
            f"(the run's channels, consumers and checkpoints are named after it); to continue the run, keep "
            f"`name: {run_name}`; to start a new run under the new name: {fresh}"
        )
    if before is None or after is None:
        return []
    before, after = _plain(before), _plain(after)
    for section in spec_sections().values():
        old, new = before.get(section.name) or {}, after.get(section.name) or {}
        refused = _fixed_changes(section, _viewed(section, old), _viewed(section, new))
        for key, inside in refused.items():
            said = describe_changes(inside, section.name)
            written = describe_changes(_flat(_fixed_changes(section, old, new)), section.name)
            if section.resume_view is not None and written != describe_changes(_flat(refused), section.name):
                said += f"; as the spec writes it: {written or 'unchanged'}"  # what the view's keys came from
            raise ResumeRefused(
                f"cannot resume {run_dir}: {section.name}.{key} changed since the run last started ({said}); "
                f"{section.fixed_on_resume[key]}. Put it back to continue this run, or start a new run: {fresh}"
            )
    return spec_changes(before, after)


def _viewed(section: SpecSection, value: Any) -> Any:
    """``value`` (the section's, from a plain spec) as its ``resume_view`` reads it, entry by entry when keyed."""
    view = section.resume_view
    if view is None or not isinstance(value, dict):
        return value
    if section.keyed:
        return {name: _plain(view(entry)) if isinstance(entry, dict) else entry for name, entry in value.items()}
    return _plain(view(value))


def _fixed_changes(section: SpecSection, before: Any, after: Any) -> dict[str, list[SpecChange]]:
    """The changes from ``before`` to ``after`` (the section's values) that a fixed key refuses, by that key."""
    refused: dict[str, list[SpecChange]] = {}
    for change in _leaf_changes(before if isinstance(before, dict) else {}, after if isinstance(after, dict) else {}):
        key = _fixed_key(section.fixed_on_resume, section.free_on_resume, ".".join(change[0]))
        if key is not None:
            refused.setdefault(key, []).append(change)
    return refused


def _flat(changes: Mapping[str, list[SpecChange]]) -> list[SpecChange]:
    return [change for inside in changes.values() for change in inside]


def _fresh(spec_path: Path | None) -> str:
    return f"flywheel up {spec_path or 'SPEC'} (without --resume)"


def section_records(spec: Spec) -> dict[str, Any]:
    """What each section's ``record`` hook writes down of ``spec`` (of each entry, by name, when keyed)."""
    records: dict[str, Any] = {}
    for section in spec_sections().values():
        value = spec.sections.get(section.name)
        if section.record is None or value is None:
            continue
        if section.keyed:
            records[section.name] = {
                name: _plain(section.record((section.name, name), entry)) for name, entry in value.items()
            }
        else:
            records[section.name] = _plain(section.record((section.name,), value))
    return records


def check_records(run_dir: Path, before: Mapping[str, Any] | None, spec: Spec) -> list[str]:
    """The warnings of the sections' ``on_resume`` hooks, each handed what its ``record`` hook wrote when the run at
    ``run_dir`` last started (``before``) and its value in ``spec``; ``ResumeRefused`` when one of them refuses."""
    warnings: list[str] = []
    for section in spec_sections().values():
        value, was = spec.sections.get(section.name), (before or {}).get(section.name)
        if section.on_resume is None or value is None or not was:
            continue
        pairs = (
            [((section.name, name), was[name], entry) for name, entry in value.items() if was.get(name)]
            if section.keyed
            else [((section.name,), was, value)]
        )
        for path, recorded, now in pairs:
            try:
                warnings += section.on_resume(path, recorded, now)
            except ResumeConflict as conflict:
                raise ResumeRefused(
                    f"cannot resume {run_dir}: {conflict}. Put it back to continue this run, or start a new run: "
                    f"{_fresh(spec.source_path)}"
                ) from None
    return warnings


def _leaf_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[SpecChange]:
    """`spec_changes`, a mapping added or removed whole taken key by key (as if the absent side were empty): each
    change names the key it is of, so that each is judged by what that key means to the run."""
    changes: list[SpecChange] = []
    for path, old, new in spec_changes(before, after):
        if isinstance(old, dict) and new is _ABSENT:
            changes += [((*path, *sub), o, n) for sub, o, n in _leaf_changes(old, {})]
        elif isinstance(new, dict) and old is _ABSENT:
            changes += [((*path, *sub), o, n) for sub, o, n in _leaf_changes({}, new)]
        else:
            changes.append((path, old, new))
    return changes


def _fixed_key(fixed: Mapping[str, str], free: Sequence[str], key: str) -> str | None:
    """The key of ``fixed`` that refuses a change of ``key`` (a dotted path): the longest that is ``key`` or holds it,
    unless a path of ``free`` is or holds it; None when the change may be followed."""

    def holds(outer: str) -> bool:
        return key == outer or key.startswith(outer + ".")

    if any(holds(path) for path in free):
        return None
    return max((outer for outer in fixed if holds(outer)), key=len, default=None)
