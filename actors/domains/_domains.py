"""Task domains: the `DomainSource` protocol, the source registry, and weighted sampling over domains.

Contract:
- `open_source("builtin:<name>[?opt=value&…]" | "jsonl:<path>", domain=…, heldout=n | "jsonl:<path>",
  options={…})` returns a `DomainSource`. Relative paths resolve against `base_dir` (the spec's folder).
  Builtin options may come from the query string or `options` (both at once for one name is an error);
  `heldout_fraction` (default 0.1) is accepted by every builtin. Every mistake raises a one-line
  `SourceError` saying what was expected.
- `DomainSource.sample(rng)` never returns a task for which `is_heldout` is true, and `heldout()` returns
  only such tasks: the held-out split is disjoint from training (see `_builtin.py`, `_jsonl.py`).
- Everything is deterministic given the RNG passed to `sample`; `heldout()` does not depend on any seed.
- `find(prompt)` returns the task whose prompt is exactly that text (None otherwise); `find_task` tries a served
  request's texts in turn (the prompt as the policy saw it, then what the user typed).
- `Domain` bundles a source with what the spec says about it (verifier, weight, group size);
  `DomainSampler` draws (domain, task) pairs with probability proportional to the domains' weights.

Non-goals: curricula that change options while running (open a new source instead).
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import unquote

from actors.domains._arithmetic import ArithmeticGenerator, ArithmeticOptions
from actors.domains._builtin import DEFAULT_HELDOUT_FRACTION, BuiltinSource, TaskGenerator, parse_options
from actors.domains._extract import ExtractGenerator, ExtractOptions
from actors.domains._jsonl import JsonlSource, read_jsonl_tasks
from actors.domains._pyexpr import PyExprGenerator, PyExprOptions
from actors.domains._task import SourceError, Task
from actors.protocol import domains_of

__all__ = [
    "BUILTIN_SOURCES",
    "Domain",
    "DomainSampler",
    "DomainSource",
    "domains_from_spec",
    "find_task",
    "open_source",
]


@runtime_checkable
class DomainSource(Protocol):
    domain: str  # the spec's domain name stamped on every task
    source: str  # "builtin:arithmetic", "jsonl:/abs/path.jsonl"

    def sample(self, rng: random.Random) -> Task:
        """One training task (never a held-out one), drawn deterministically from `rng`."""
        ...

    def heldout(self) -> list[Task]:
        """The fixed held-out tasks (same list on every call, every run)."""
        ...

    def is_heldout(self, task: Task) -> bool: ...

    def find(self, prompt: str) -> Task | None:
        """The task (training or held-out) whose prompt is exactly ``prompt``, or None: how a served request
        that asked a domain's prompt gets its verifier fields (builtins rebuild it from the text, files look
        it up)."""
        ...


def _arithmetic(options: Mapping[str, Any]) -> TaskGenerator:
    return ArithmeticGenerator(parse_options("builtin:arithmetic", ArithmeticOptions, options))


def _pyexpr(options: Mapping[str, Any]) -> TaskGenerator:
    return PyExprGenerator(parse_options("builtin:pyexpr", PyExprOptions, options))


def _extract(options: Mapping[str, Any]) -> TaskGenerator:
    return ExtractGenerator(parse_options("builtin:extract", ExtractOptions, options))


# name → factory(options) ; the suggested verifier of each is in the module docstrings
BUILTIN_SOURCES: Mapping[str, Callable[[Mapping[str, Any]], TaskGenerator]] = {
    "arithmetic": _arithmetic,  # verifier: math
    "pyexpr": _pyexpr,  # verifier: python-expr
    "extract": _extract,  # verifier: json-fields
}


def open_source(
    source: str,
    *,
    domain: str,
    heldout: int | str = 0,
    options: Mapping[str, Any] | None = None,
    base_dir: Path | None = None,
) -> DomainSource:
    """Open the task source named by `source` for the domain `domain`."""
    given = dict(options or {})
    scheme, sep, rest = source.partition(":")
    if not sep or not rest:
        raise SourceError(f"source {source!r}: expected builtin:<name> or jsonl:<path>")
    heldout_spec = _heldout_spec(heldout, base_dir)
    if scheme == "jsonl":
        return JsonlSource(domain, _path(rest, base_dir), heldout=heldout_spec, options=given)
    if scheme != "builtin":
        raise SourceError(f"source {source!r}: unknown scheme {scheme!r}; expected builtin:<name> or jsonl:<path>")
    name, _, query = rest.partition("?")
    factory = BUILTIN_SOURCES.get(name)
    if factory is None:
        close = difflib.get_close_matches(name, list(BUILTIN_SOURCES), n=1)
        hint = f" (did you mean builtin:{close[0]}?)" if close else ""
        known = ", ".join(f"builtin:{n}" for n in sorted(BUILTIN_SOURCES))
        raise SourceError(f"source {source!r}: unknown builtin{hint}; expected one of {known}")
    for key, value in _query_options(source, query):
        if key in given:
            raise SourceError(
                f"source {source!r}: option {key!r} given both in the source string and in source_options: set it "
                "in one place (source_options set by an included spec are cleared with source_options: null)",
                option=key,
            )
        given[key] = value
    fraction = given.pop("heldout_fraction", DEFAULT_HELDOUT_FRACTION)
    try:
        fraction = float(fraction)
    except (TypeError, ValueError):
        raise SourceError(
            f"builtin:{name}: option 'heldout_fraction': expected a number, got {fraction!r}", option="heldout_fraction"
        ) from None
    generator = factory(given)
    held: int | Sequence[Task] = (
        heldout_spec if isinstance(heldout_spec, int) else read_jsonl_tasks(heldout_spec, domain, key="heldout")
    )
    return BuiltinSource(domain, generator, heldout=held, heldout_fraction=fraction)


def _query_options(source: str, query: str) -> list[tuple[str, str]]:
    # Not parse_qsl: it turns "+" into a space, and `operators=+-*` must mean what it says.
    pairs: list[tuple[str, str]] = []
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise SourceError(f"source {source!r}: expected option=value after '?', got {part!r}")
        pairs.append((unquote(key), unquote(value)))
    return pairs


def _path(text: str, base_dir: Path | None) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() or base_dir is None else base_dir / path


def _heldout_spec(heldout: int | str, base_dir: Path | None) -> int | Path:
    if isinstance(heldout, bool):
        raise SourceError(f"heldout: expected an integer >= 0 or jsonl:<path>, got {heldout!r}", key="heldout")
    if isinstance(heldout, int):
        return heldout
    if heldout.startswith("jsonl:") and len(heldout) > len("jsonl:"):
        return _path(heldout[len("jsonl:") :], base_dir)
    raise SourceError(f"heldout: expected an integer >= 0 or jsonl:<path>, got {heldout!r}", key="heldout")


@dataclass(frozen=True)
class Domain:
    name: str
    source: DomainSource
    verifier: str = "math"  # math | python-tests | python-expr | json-fields | <module>:<function>
    weight: float = 1.0  # sampling weight > 0
    group_size: int = 1  # completions per prompt (GRPO group)
    verifier_config: Mapping[str, Any] = field(default_factory=dict)


class _DomainSpecLike(Protocol):
    source: str
    verifier: str
    weight: float
    group_size: int
    heldout: int | str


def domains_from_spec(spec: Any, names: Iterable[str] | None = None) -> dict[str, Domain]:
    """Open the domains `names` (default: all) of a validated spec, resolving paths against its folder.

    Reads `source, verifier, verifier_config, weight, group_size, heldout` and, when the spec model has them,
    `source_options` (a mapping of builtin options) from each domain entry.
    """
    source_path = getattr(spec, "source_path", None)
    base_dir = Path(source_path).parent if source_path is not None else None
    out: dict[str, Domain] = {}
    wanted = list(domains_of(spec)) if names is None else list(names)
    for name in wanted:
        if name not in domains_of(spec):
            known = ", ".join(domains_of(spec)) or "none"
            raise SourceError(f"unknown domain {name!r}; the spec declares: {known}")
        entry = domains_of(spec)[name]
        d: _DomainSpecLike = entry
        try:
            src = open_source(
                d.source,
                domain=name,
                heldout=d.heldout,
                options=getattr(entry, "source_options", None),
                base_dir=base_dir,
            )
        except SourceError as err:
            raise SourceError(f"domains.{name}: {err}", option=err.option, key=err.key) from None
        out[name] = Domain(
            name=name,
            source=src,
            verifier=d.verifier,
            weight=float(d.weight),
            group_size=int(d.group_size),
            verifier_config=dict(getattr(entry, "verifier_config", None) or {}),
        )
    return out


def find_task(domains: Mapping[str, Domain], domain: str | None, texts: Iterable[str]) -> Task | None:
    """The task of ``domain`` whose prompt is the first of ``texts`` the domain's source knows (None: none is,
    or the domain is not one of ``domains``)."""
    found = domains.get(domain or "")
    if found is None:
        return None
    for text in texts:
        if text:
            task = found.source.find(text)
            if task is not None:
                return task
    return None


class DomainSampler:
    """Draws (domain, task) pairs: domain by weight, then a training task from its source."""

    def __init__(self, domains: Mapping[str, Domain], rng: random.Random) -> None:
        if not domains:
            raise SourceError("no domains to sample from; declare at least one under `domains:`")
        for d in domains.values():
            if not d.weight > 0:
                raise SourceError(f"domains.{d.name}.weight: expected a number > 0, got {d.weight!r}")
        self.domains = dict(domains)
        self.rng = rng
        self._names = list(self.domains)
        self._cum_weights = list(_accumulate([self.domains[n].weight for n in self._names]))

    def next(self) -> tuple[Domain, Task]:
        (name,) = self.rng.choices(self._names, cum_weights=self._cum_weights)
        domain = self.domains[name]
        return domain, domain.source.sample(self.rng)


def _accumulate(values: Sequence[float]) -> list[float]:
    total, out = 0.0, []
    for v in values:
        total += v
        out.append(total)
    return out
