"""The spec reference: every key of a topology spec, generated from the models that validate it.

Contract: `reference_markdown()` documents the framework's sections (bus, runtime, channels, the fields every actor
block has), each registered application section and each registered actor kind's config: key path, type, default
and the field's comment as written beside it in the model's source (a comment on the line, comment lines right above
it, and ``#   …`` continuation lines below it). ``specs/REFERENCE.md`` is this output; a test checks that it is
current, so the reference cannot drift from the models.

Non-goals: documenting values a validator accepts beyond the type (the comments say that), free-form mappings
(``policy.config``, ``verifier_config``) beyond their own line.
"""

from __future__ import annotations

import inspect
import io
import re
import tokenize
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from topology._registry import actor_kinds, spec_sections
from topology._spec import ActorCommon, BusSpec, ChannelOverride, ResourcesSpec, RestartSpec, RuntimeSpec

__all__ = ["reference_markdown"]

_FIELD = re.compile(r"^\s{4}(\w+)\s*:")
_CONTINUATION = re.compile(r"^\s*#\s{2,}")  # a comment line that continues the one above it


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name → its comment in the class body (see the module docstring)."""
    try:
        source = inspect.getsource(model)
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comment_at: dict[int, str] = {}
    last_line: dict[int, int] = {}  # a statement's first line → its last (a field formatted over several lines)
    start: int | None = None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comment_at[token.start[0] - 1] = token.string.lstrip("#").strip()
        elif token.type == tokenize.NEWLINE and start is not None:
            last_line[start], start = token.start[0] - 1, None
        elif token.type not in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT) and start is None:
            start = token.start[0] - 1
    found: dict[str, str] = {}
    for index, line in enumerate(lines):
        match = _FIELD.match(line)
        if not match or line.strip().startswith(("def ", "@", "#", "model_config")):
            continue
        parts: list[str] = []
        above = index - 1
        while above >= 0 and lines[above].strip().startswith("#"):
            above -= 1
        # The comment lines above belong to this field from the first one that is not a continuation: leading
        # ``#   …`` lines continue the comment of the field above them.
        block = range(above + 1, index)
        first = next((i for i in block if not _CONTINUATION.match(lines[i])), index)
        parts += [comment_at.get(i, "") for i in range(first, index)]
        end = last_line.get(index, index)  # a field over several lines: its comment may sit on any of them
        parts += [comment_at[i] for i in range(index, end + 1) if i in comment_at]
        below = end + 1
        while below < len(lines) and _CONTINUATION.match(lines[below]):
            parts.append(comment_at.get(below, ""))
            below += 1
        found[match.group(1)] = " ".join(p for p in parts if p)
    return found


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " or ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        text = " or ".join(_type_name(a) for a in args)
        return text + (" or null" if len(args) < len(typing.get_args(annotation)) else "")
    if origin in (list, tuple):
        inner = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return f"list of {_type_name(inner[0])}" if inner else "list"
    if origin is dict:
        _key, value = typing.get_args(annotation) or (str, Any)
        return f"mapping of {_type_name(value)}"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "mapping"
        return {"int": "integer", "float": "number", "str": "string", "bool": "boolean", "Path": "path"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation).replace("typing.", "")


def _default(field: Any) -> str:
    if field.is_required():
        return "**required**"
    value = field.default
    if value is PydanticUndefined and field.default_factory is not None:
        value = field.default_factory()
    if isinstance(value, BaseModel):
        return "see below"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return f"`{value}`"
    if value in ({}, [], ()):
        return "empty"
    return f"`{value}`"


def _table(prefix: str, model: type[BaseModel], skip: tuple[str, ...] = ()) -> list[str]:
    comments = _comments(model)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        annotation = field.annotation
        kinds = [a for a in (typing.get_args(annotation) or (annotation,)) if isinstance(a, type)]
        sub = next((a for a in kinds if issubclass(a, BaseModel)), None)
        if sub is not None:
            nested.append((f"{prefix}.{name}", sub))
        meaning = comments.get(name, "").replace("|", "\\|")
        rows.append(f"| `{prefix}.{name}` | {_type_name(annotation)} | {_default(field)} | {meaning} |")
    out = [*rows, ""]
    for path, sub in nested:
        out += [f"`{path}` — {(sub.__doc__ or '').strip().splitlines()[0]}", "", *_table(path, sub)]
    return out


def reference_markdown() -> str:
    """The whole reference (see the module docstring)."""
    out = [
        "# Spec reference",
        "",
        "Every key of a topology spec, generated from the models that validate it (`flywheel reference`); a test",
        "keeps this file current. Types are YAML types: a *mapping* is a block of keys, a *list* a sequence. Besides",
        "the keys below a spec has `name` (the topology's name: lower-case letters, digits and `-`), an optional",
        "`description`, and `include:` (a base spec merged under this one, mapping by mapping; `key: null` removes",
        "a mapping the base set, e.g. `source_options: null` or an actor). Any value may be `${ENV}` or",
        "`${ENV:-default}`.",
        "",
        "## Framework sections",
        "",
        "### `bus` — " + (BusSpec.__doc__ or "").strip().splitlines()[0],
        "",
        *_table("bus", BusSpec),
        "### `runtime` — " + (RuntimeSpec.__doc__ or "").strip().splitlines()[0],
        "",
        *_table("runtime", RuntimeSpec, skip=("restart",)),
        "`runtime.restart` — " + (RestartSpec.__doc__ or "").strip().splitlines()[0],
        "",
        *_table("runtime.restart", RestartSpec),
        "### `channels.<name>` — " + (ChannelOverride.__doc__ or "").strip().splitlines()[0],
        "",
        *_table("channels.<name>", ChannelOverride),
        "### `actors.<name>` — the fields every actor block has, whatever its kind",
        "",
        *_table("actors.<name>", ActorCommon, skip=("resources",)),
        "`actors.<name>.resources` — " + (ResourcesSpec.__doc__ or "").strip().splitlines()[0],
        "",
        *_table("actors.<name>.resources", ResourcesSpec),
    ]
    sections = spec_sections()
    if sections:
        out += ["## Application sections", ""]
        for name, section in sorted(sections.items()):
            prefix = f"{name}.<name>" if section.keyed else name
            required = " (required)" if section.required else ""
            out += [f"### `{prefix}`{required} — {section.summary}", "", *_table(prefix, section.model)]
    out += ["## Actor kinds", "", "An actor block's `kind` (default: the actor's name) decides its other keys.", ""]
    for name, kind in sorted(actor_kinds().items()):
        channels = f"consumes `{', '.join(kind.consumes) or '—'}`, publishes `{', '.join(kind.publishes) or '—'}`"
        out += [f"### kind `{name}` — {kind.summary}", "", f"Default channels: {channels}.", ""]
        out += _table(f"actors.<{name}>", kind.config)
    return "\n".join(out).rstrip() + "\n"
