"""Pydantic validation errors → located, user-facing `SpecIssue`s ("expected …, got …").

Contract: `issues_from_validation` turns each pydantic error of a section validated from
``data`` (at key path ``prefix`` of a `Document`) into one issue at the line of the offending value — or
of the offending *key* for unknown keys, with a did-you-mean and the list of allowed keys. Union-member
tags in pydantic's ``loc`` are dropped so paths are real key paths; a path is reported once.

Non-goals: localisation; listing every union member's expectation.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from typing import Any, Union

from pydantic import BaseModel, ValidationError

from topology._errors import SpecIssue, format_path
from topology._spec import show
from topology._yaml import Document, KeyPath, Loc

_EXPECTED = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "finite_number": "expected a finite number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "list_type": "expected a list",
    "tuple_type": "expected a list",
    "set_type": "expected a list",
    "none_required": "expected null",
}
_BOUNDS = {
    "greater_than_equal": ("ge", ">="),
    "greater_than": ("gt", ">"),
    "less_than_equal": ("le", "<="),
    "less_than": ("lt", "<"),
}


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown_key_message(key: str, allowed: Iterable[str], what: str = "key") -> str:
    allowed = list(allowed)
    return f"unknown {what} '{key}'{did_you_mean(key, allowed)} — allowed: {', '.join(allowed)}"


def _unwrap(annotation: Any) -> list[Any]:
    """The concrete types inside Optional/Union/Annotated."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [t for arg in typing.get_args(annotation) for t in _unwrap(arg) if t is not type(None)]
    return [annotation]


def model_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model that holds the last element of `loc` (walking fields, dict values and list items)."""
    current: Any = model
    steps = list(loc)
    while steps:
        step = steps.pop(0)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(step))
            if field is None:
                return None
            current = field.annotation
        candidates = _unwrap(current)
        nxt = None
        for candidate in candidates:
            origin = typing.get_origin(candidate)
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                nxt = candidate
            elif origin in (dict, typing.get_origin(typing.Mapping[str, Any])) and steps:
                steps.pop(0)
                nxt = typing.get_args(candidate)[1]
            elif origin in (list, tuple) and steps and isinstance(steps[0], int):
                steps.pop(0)
                nxt = typing.get_args(candidate)[0]
            if nxt is not None:
                break
        if nxt is None:
            return None
        current = nxt
        if not steps:
            break
    for candidate in _unwrap(current):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _real_path(data: Any, loc: tuple[str | int, ...], keep_last: bool) -> tuple[KeyPath, bool]:
    """Key path of `loc` inside `data`, dropping pydantic's union tags; (path, last-was-dict-key)."""
    path: list[str | int] = []
    current = data
    is_key = False
    for index, step in enumerate(loc):
        last = index == len(loc) - 1
        if step == "[key]":
            is_key = True
            continue
        if isinstance(current, dict) and str(step) in current:
            current = current[str(step)]
            path.append(str(step))
        elif isinstance(current, list) and isinstance(step, int) and 0 <= step < len(current):
            current = current[step]
            path.append(step)
        elif last and keep_last:
            path.append(step)
    return tuple(path), is_key


def _value_at(data: Any, path: KeyPath) -> Any:
    for step in path:
        if isinstance(data, dict) and isinstance(step, str):
            data = data.get(step)
        elif isinstance(data, list) and isinstance(step, int) and 0 <= step < len(data):
            data = data[step]
        else:
            return None
    return data


def describe(error: Any) -> str:
    """The message for one pydantic error dict."""
    kind = error["type"]
    value = error.get("input")
    ctx = error.get("ctx") or {}
    if kind in ("value_error", "assertion_error"):
        message = str(error["msg"])
        for prefix in ("Value error, ", "Assertion failed, "):
            message = message.removeprefix(prefix)
        return message
    if kind in _BOUNDS:
        key, sign = _BOUNDS[kind]
        bound = ctx.get(key)
        noun = "an integer" if isinstance(bound, int) and not isinstance(bound, bool) else "a number"
        shown = f"{bound:g}" if isinstance(bound, float) else str(bound)
        return f"expected {noun} {sign} {shown}, got {show(value)}"
    if kind == "literal_error":
        expected = str(ctx.get("expected", ""))
        hint = did_you_mean(value, _literal_options(error)) if isinstance(value, str) else ""
        return f"expected one of {expected}, got {show(value)}{hint}"
    if kind == "string_pattern_mismatch":
        return f"expected a name matching {ctx.get('pattern')}, got {show(value)}"
    if kind in ("string_too_short", "too_short"):
        if kind == "string_too_short":
            return f"expected a non-empty string, got {show(value)}"
        return f"expected at least {ctx.get('min_length')} item(s), got {show(value)}"
    if kind in ("string_too_long", "too_long"):
        unit = "characters" if kind == "string_too_long" else "item(s)"
        return f"expected at most {ctx.get('max_length')} {unit}, got {show(value)}"
    if kind in _EXPECTED:
        got = show(value)
        if isinstance(value, str) and kind.startswith("bool"):
            got += " (a string; write true or false without quotes)"
        elif isinstance(value, str) and kind.startswith(("int", "float")):
            got += " (a string)"
        return f"{_EXPECTED[kind]}, got {got}"
    msg = str(error.get("msg", kind))
    return f"{msg[:1].lower()}{msg[1:]}, got {show(value)}"


def issues_from_validation(
    exc: ValidationError,
    model: type[BaseModel],
    data: Any,
    prefix: KeyPath,
    doc: Document,
    allowed_extra: Iterable[str] = (),
) -> list[SpecIssue]:
    """One issue per distinct key path in `exc` (errors of a section validated at `prefix`). A value that fails
    every member of a union gets one issue naming what each member expected ("expected a number or 'auto'"); a
    member whose type did not match at all gives way to one that got further into the value (a list written for
    ``float | list[float]`` is reported at its bad item, not as "expected a number")."""
    located: list[tuple[KeyPath, bool, Any]] = []
    for error in exc.errors():
        kind = error["type"]
        rel, is_key = _real_path(data, tuple(error["loc"]), keep_last=kind in ("missing", "extra_forbidden"))
        located.append((rel, is_key, error))
    deeper = {rel[:n] for rel, _, _ in located for n in range(len(rel))}
    by_path: dict[KeyPath, list[tuple[bool, Any]]] = {}
    for rel, is_key, error in located:
        if error["type"] in _EXPECTED and rel in deeper:
            continue  # another member of the union matched this value's type and failed inside it
        by_path.setdefault(rel, []).append((is_key, error))
    issues: list[SpecIssue] = []
    for rel, errors in by_path.items():
        is_key, error = errors[0]
        kind = error["type"]
        path = (*prefix, *rel)
        loc_at: Loc
        if kind == "extra_forbidden":
            holder_model = model_at(model, tuple(rel[:-1])) or model
            allowed = [*holder_model.model_fields, *(allowed_extra if len(rel) == 1 else ())]
            message = unknown_key_message(str(rel[-1]), allowed)
            loc_at = doc.key_loc(path)
        elif kind == "missing":
            holder = model_at(model, tuple(rel[:-1]))
            message = f"required key '{rel[-1]}' is missing"
            if holder is not None and holder.__doc__:
                message += f" ({holder.__doc__.strip().splitlines()[0].rstrip('.')})"
            loc_at = doc.key_loc(path[:-1]) if path[:-1] else doc.root
        else:
            message = _union_message([e for _, e in errors]) if len(errors) > 1 else describe(error)
            # a whole-section check (model validator) reads best at the section's key line
            whole = kind in ("value_error", "assertion_error") and isinstance(_value_at(data, rel), dict)
            loc_at = doc.key_loc(path) if is_key or whole else doc.value_loc(path)
        issues.append(SpecIssue(loc_at.file, loc_at.line, loc_at.col, format_path(path), message))
    return issues


def _literal_options(error: Any) -> list[str]:
    """The values a ``literal_error`` accepts, from pydantic's ``'a', 'b' or 'c'``."""
    expected = str((error.get("ctx") or {}).get("expected", ""))
    return [part.strip().strip("'") for part in expected.replace(" or ", ", ").split(",")]


def _union_message(errors: list[Any]) -> str:
    """One message for a value every member of a union refused: each member's expectation, then what was given."""
    expected: list[str] = []
    for error in errors:
        if error["type"] == "literal_error":
            wanted = str((error.get("ctx") or {}).get("expected", ""))
        elif error["type"] in _EXPECTED:
            wanted = _EXPECTED[error["type"]].removeprefix("expected ")
        else:
            return describe(errors[0])  # a member's own check failed (a bound, a validator): its message says more
        if wanted not in expected:
            expected.append(wanted)
    value = errors[0].get("input")
    words = [word for e in errors if e["type"] == "literal_error" for word in _literal_options(e)]
    hint = did_you_mean(value, words) if isinstance(value, str) and words else ""
    return f"expected {' or '.join(expected)}, got {show(value)}{hint}"


__all__ = ["describe", "did_you_mean", "issues_from_validation", "model_at", "unknown_key_message"]
