"""YAML → plain data with a position for every key and value; ``${ENV}`` interpolation; ``include:``.

Contract:
- `load_document(path)` reads a spec file and returns a `Document`: plain Python data (dicts, lists,
  scalars) plus two side maps from key path (``("actors", "gen", "replicas")``) to the `Loc`
  (file, line, col — 1-based) of that value and of its key. Problems become `SpecIssue`s in
  ``Document.issues``; nothing here raises for a user mistake.
- Duplicate keys are errors (at the second occurrence), at every nesting level.
- Scalars may use ``${VAR}`` and ``${VAR:-default}`` (default also when VAR is empty, as in sh);
  ``$${`` is a literal ``${``. An unquoted scalar is re-typed after interpolation, so
  ``replicas: ${N:-2}`` is the integer 2; a quoted one stays a string. An undefined variable without a
  default is an error at that scalar. ``Document.env`` keeps which variables each such value was read from, so a
  message about the value can say what to set (``$FLYWHEEL_GATEWAY_PORT``, not the key its file hard-codes).
- ``include: base.yaml`` (or a list) at the top level merges other spec files first, relative to the
  including file: mappings deep-merge, this file's values win, lists and scalars replace; ``null`` over an
  included mapping removes it (``source_options: null`` clears inherited options, ``gate: null`` drops an
  inherited actor). Cycles are
  reported with the chain. Every value keeps the file and line it came from, so errors in an included
  file point into that file.
- Mapping keys are taken as written (``on:`` is the key "on", not ``True``).

Non-goals: YAML tags beyond the core schema, multi-document files, preserving comments.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from topology._errors import SpecIssue, format_path
from topology._spec import show

KeyPath = tuple[str | int, ...]

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Loc:
    """A 1-based position in a named file."""

    file: str
    line: int
    col: int


@dataclass
class Document:
    """Plain data of a (merged) spec plus where each key and value was written."""

    data: Any
    root: Loc
    values: dict[KeyPath, Loc] = field(default_factory=dict)
    keys: dict[KeyPath, Loc] = field(default_factory=dict)
    sources: dict[str, Path] = field(default_factory=dict)  # display name → resolved file path
    env: dict[KeyPath, tuple[str, ...]] = field(default_factory=dict)  # value → the ${VAR}s it was read from
    issues: list[SpecIssue] = field(default_factory=list)
    incomplete: bool = False  # an included file could not be merged: missing keys may live there

    def value_loc(self, path: KeyPath) -> Loc:
        """Position of the value at `path`, else of its nearest ancestor, else the document."""
        for end in range(len(path), -1, -1):
            loc = self.values.get(path[:end])
            if loc is not None:
                return loc
        return self.root

    def key_loc(self, path: KeyPath) -> Loc:
        """Position of the key that names `path` (falls back to its value)."""
        return self.keys.get(path) or self.value_loc(path)

    def base_dir(self, path: KeyPath) -> Path:
        """Directory of the file that wrote the value at `path` (for relative paths in values)."""
        source = self.sources.get(self.value_loc(path).file)
        return source.parent if source is not None else Path.cwd()

    def setting(self, path: KeyPath) -> str:
        """Where a user changes the value at `path`: the environment variable(s) it was read from, else its key."""
        names = self.env.get(path)
        if not names:
            return format_path(path)
        variables = " or ".join(f"${name}" for name in names)
        return f"{variables}, which {format_path(path)} reads"

    def issue(self, loc: Loc, path: KeyPath, message: str, severity: str = "error") -> SpecIssue:
        made = SpecIssue(
            loc.file, loc.line, loc.col, format_path(path), message, "warning" if severity == "warning" else "error"
        )
        self.issues.append(made)
        return made


class _Loader(yaml.SafeLoader):
    """Safe loader used only to compose nodes and construct core-schema scalars."""


def _loc(file: str, mark: Any) -> Loc:
    return Loc(file, int(mark.line) + 1, int(mark.column) + 1)


def interpolate(text: str, environ: dict[str, str] | os._Environ[str]) -> tuple[str, list[str]]:
    """Expand ``${VAR}`` / ``${VAR:-default}`` / ``$${`` in `text`; returns (result, problems)."""
    expanded, problems, _ = _expand(text, environ)
    return expanded, problems


def _expand(text: str, environ: dict[str, str] | os._Environ[str]) -> tuple[str, list[str], tuple[str, ...]]:
    """:func:`interpolate`, and the names of the variables `text` refers to."""
    out: list[str] = []
    problems: list[str] = []
    names: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$${", i):
            out.append("${")
            i += 3
            continue
        if not text.startswith("${", i):
            out.append(text[i])
            i += 1
            continue
        end = text.find("}", i + 2)
        if end < 0:
            problems.append(
                f"unterminated '${{' in {text!r}; expected ${{NAME}} or ${{NAME:-default}} (write $${{ for a literal)"
            )
            return text, problems, tuple(names)
        inner = text[i + 2 : end]
        name, sep, default = inner.partition(":-")
        if not _ENV_NAME.fullmatch(name):
            problems.append(f"bad interpolation '${{{inner}}}': expected ${{NAME}} or ${{NAME:-default}}")
        else:
            names.append(name)
            value = environ.get(name)
            if sep and not value:
                out.append(default)
            elif value is None:
                problems.append(
                    f"environment variable {name} is not set (write ${{{name}:-default}} to give a default)"
                )
            else:
                out.append(value)
        i = end + 1
    return "".join(out), problems, tuple(dict.fromkeys(names))


class _Builder:
    """Turns a composed node tree into plain data, recording positions and issues."""

    def __init__(self, doc: Document, file: str, environ: dict[str, str] | os._Environ[str]) -> None:
        self.doc = doc
        self.file = file
        self.environ = environ
        self.constructor = _Loader("")

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        self.doc.values[path] = _loc(self.file, node.start_mark)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ_TAG:
                self._error(node, path, f"unsupported YAML tag {node.tag!r} on a list")
            return [self.build(child, (*path, i)) for i, child in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        return self._scalar(node, path)

    def _error(self, node: yaml.Node, path: KeyPath, message: str) -> None:
        self.doc.issue(_loc(self.file, node.start_mark), path, message)

    def _mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[str, Any]:
        if node.tag != _MAP_TAG:
            self._error(node, path, f"unsupported YAML tag {node.tag!r} on a mapping")
        result: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:  # YAML merge key `<<: *anchor`: explicit keys win
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for source in sources:
                    merged = self.build(source, path)
                    if not isinstance(merged, dict):
                        self._error(source, path, "expected a mapping after '<<'")
                        continue
                    for key, value in merged.items():
                        result.setdefault(key, value)
                self.doc.values[path] = _loc(self.file, node.start_mark)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self._error(key_node, path, "expected a plain key, got a mapping or list used as a key")
                continue
            key = str(key_node.value)
            key_path = (*path, key)
            if key in first_line:
                self._error(key_node, key_path, f"duplicate key '{key}' (first written at line {first_line[key]})")
            first_line.setdefault(key, int(key_node.start_mark.line) + 1)
            self.doc.keys[key_path] = _loc(self.file, key_node.start_mark)
            result[key] = self.build(value_node, key_path)
        return result

    def _scalar(self, node: yaml.ScalarNode, path: KeyPath) -> Any:
        value = self.constructor.construct_object(node, deep=True)
        if not isinstance(value, str) or "$" not in value:
            return value
        expanded, problems, names = _expand(value, self.environ)
        for problem in problems:
            self._error(node, path, problem)
        if names:
            self.doc.env[path] = names
        if problems or expanded == value:
            return expanded
        resolve: Any = self.constructor.resolve  # untyped in types-PyYAML
        if node.style is None and node.tag == resolve(yaml.ScalarNode, value, (True, False)):
            # plain scalar: type the expanded text as if it had been written there (`${N:-2}` → 2)
            tag = resolve(yaml.ScalarNode, expanded, (True, False))
            if tag != _STR_TAG and expanded:
                try:
                    return self.constructor.construct_object(yaml.ScalarNode(tag, expanded), deep=True)
                except yaml.YAMLError:
                    return expanded
        return expanded


def _read_text(path: Path) -> str:
    """The file's text; raises ValueError with a user-facing reason."""
    if path.is_dir():
        raise ValueError("is a directory, expected a YAML spec file")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ValueError("no such file") from None
    except OSError as exc:
        raise ValueError(f"cannot read file: {exc.strerror or exc}") from None
    if b"\x00" in raw:
        raise ValueError("looks like a binary file, expected YAML text")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None


def parse_text(text: str, file: str, environ: dict[str, str] | os._Environ[str] | None = None) -> Document:
    """Compose and build one YAML text (no include handling)."""
    doc = Document(data=None, root=Loc(file, 1, 1))
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        loc = _loc(file, mark) if mark is not None else doc.root
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        message = f"invalid YAML: {problem}"
        context = getattr(exc, "context", None)
        if context:
            message += f" ({context})"
        if "\\t" in message or "\t" in message:
            message += " — YAML does not allow tabs for indentation; use spaces"
        index = getattr(mark, "index", -1)
        if 0 < index < len(text) and text[index - 1 : index + 1] == "${":  # a flow mapping's `{` to YAML
            message += ' — inside {…} or […] quote a ${VAR} ("${VAR}"), or write the mapping one key a line'
        doc.issue(loc, (), message)
        return doc
    if node is None:
        doc.issue(doc.root, (), "the spec is empty; expected a mapping with name, actors, …")
        return doc
    builder = _Builder(doc, file, os.environ if environ is None else environ)
    try:
        doc.data = builder.build(node, ())
    except yaml.YAMLError as exc:  # a scalar that cannot be constructed (bad !!binary, unknown tag …)
        mark = getattr(exc, "problem_mark", None)
        doc.issue(
            _loc(file, mark) if mark is not None else doc.root, (), f"invalid YAML: {getattr(exc, 'problem', exc)}"
        )
    return doc


def _under(path: KeyPath, prefix: KeyPath) -> bool:
    return path[: len(prefix)] == prefix


def _copy_positions(dst: Document, src: Document, prefix: KeyPath) -> None:
    for table_dst, table_src in ((dst.values, src.values), (dst.keys, src.keys)):
        for stale in [p for p in table_dst if _under(p, prefix)]:
            del table_dst[stale]
        for p, loc in table_src.items():
            if _under(p, prefix):
                table_dst[p] = loc
    for stale in [p for p in dst.env if _under(p, prefix)]:  # a value written over is no longer read from its ${VAR}
        del dst.env[stale]
    dst.env.update((p, names) for p, names in src.env.items() if _under(p, prefix))


def _merge_into(base: Document, over: Document) -> None:
    """Deep-merge `over` into `base` (over wins; mappings merge; everything else replaces)."""

    def merge(b: Any, o: Any, path: KeyPath) -> Any:
        if isinstance(b, dict) and isinstance(o, dict):
            out = dict(b)
            for key, value in o.items():
                if value is None and isinstance(b.get(key), dict):  # null over an included mapping: remove it
                    out.pop(key)
                    _copy_positions(base, over, (*path, key))
                    continue
                out[key] = merge(b[key], value, (*path, key)) if key in b else value
                if key not in b:
                    _copy_positions(base, over, (*path, key))
                if (*path, key) in over.keys:
                    base.keys[(*path, key)] = over.keys[(*path, key)]
            if path in over.values:
                base.values[path] = over.values[path]
            return out
        _copy_positions(base, over, path)
        return o

    base.data = merge(base.data, over.data, ())
    base.root = over.root
    base.sources.update(over.sources)
    base.issues.extend(over.issues)


def _display(path: Path) -> str:
    return os.path.normpath(str(path))


def load_document(path: str | Path, environ: dict[str, str] | None = None) -> Document:
    """Load a spec file with its includes merged; problems are in ``.issues`` (never raised)."""
    return _load(Path(path), _display(Path(path)), (), None, None, environ)


def _load(
    path: Path,
    display: str,
    chain: tuple[Path, ...],
    parent: Document | None,
    include_at: KeyPath | None,
    environ: dict[str, str] | None,
) -> Document:
    resolved = path.resolve()
    here = Document(data=None, root=Loc(display, 1, 1), sources={display: resolved})
    where = parent.value_loc(include_at) if parent is not None and include_at is not None else here.root
    at: KeyPath = include_at if include_at is not None else ()
    if resolved in chain:
        names = " → ".join(p.name for p in (*chain[chain.index(resolved) :], resolved))
        here.issue(where, at, f"include cycle: {names}")
        return here
    try:
        text = _read_text(path)
    except ValueError as exc:
        label = f"cannot include '{display}': " if parent is not None else f"cannot read spec '{display}': "
        here.issue(where, at, label + str(exc))
        return here
    doc = parse_text(text, display, environ)
    doc.sources[display] = resolved
    if doc.issues and doc.data is None:
        return doc
    if not isinstance(doc.data, dict):
        kind = "a list" if isinstance(doc.data, list) else f"the scalar {show(doc.data)}"
        what = "an included spec" if parent is not None else "the spec"
        doc.issue(doc.value_loc(()), (), f"expected a mapping at the top of {what} (name:, actors:, …), got {kind}")
        doc.data = None
        return doc
    if "include" not in doc.data:
        return doc
    includes = doc.data.pop("include")
    doc.values.pop(("include",), None)
    include_loc = doc.keys.pop(("include",), None)
    items = includes if isinstance(includes, list) else [includes]
    merged: Document | None = None
    for index, item in enumerate(items):
        item_path: KeyPath = ("include", index) if isinstance(includes, list) else ("include",)
        item_loc = doc.values.pop(item_path, None) or include_loc or doc.root
        if not isinstance(item, str) or not item:
            doc.issue(item_loc, item_path, f"expected a relative file path, got {show(item)}")
            doc.incomplete = True
            continue
        # positions of the include line are needed for errors about it; keep them on a scratch doc
        scratch = Document(data=None, root=doc.root, values={item_path: item_loc})
        target = resolved.parent / os.path.expanduser(item)
        base = _load(target, _display(Path(display).parent / item), (*chain, resolved), scratch, item_path, environ)
        doc.issues.extend(scratch.issues)
        if not isinstance(base.data, dict):
            doc.issues.extend(base.issues)
            doc.incomplete = True
            continue
        if merged is None:
            merged = base
        else:
            _merge_into(merged, base)
    if merged is None:
        return doc
    _merge_into(merged, doc)
    merged.incomplete = merged.incomplete or doc.incomplete
    return merged


def iter_paths(data: Any, prefix: KeyPath = ()) -> Iterator[KeyPath]:
    """Every key path in `data` (mappings and lists), depth first."""
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from iter_paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from iter_paths(value, (*prefix, index))


__all__ = ["Document", "KeyPath", "Loc", "interpolate", "iter_paths", "load_document", "parse_text"]
