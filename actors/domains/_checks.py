"""The check of each entry of a spec's ``domains`` section, run by the framework's spec checker (pure Python).

Contract: ``jsonl:`` paths (source and held-out file) become absolute against the spec file that set them, and
must exist; a builtin source or verifier must be one this library has, and a builtin verifier's ``verifier_config``
may hold only the keyword arguments it takes; a ``module:function`` verifier whose package is not importable here
is a warning (it may be installed where the verify actor runs) — but where the spec is about to run on this machine
(``flywheel up``, local runtime: ``check.starting and check.local``) it is an error, and the function is imported and
must take ``(completion_text, task)`` (and ``config=`` when the domain has a ``verifier_config``), or the verify
actor would crash-loop on it at start. Then the task
source is opened as the source actor opens it at start — builtin options, every JSONL row, the held-out split — so
a bad option or row is reported at its spec line now, not as a traceback at ``flywheel up``. Last, the tasks must carry
what the domain's builtin verifier reads (math an answer, python-expr a target, …): every row of a JSONL file (source
or held-out file), and a task drawn from a builtin; otherwise every answer would score ``internal_error`` (an error
when no row carries it, a warning naming the count when only some lack it). That last check is skipped where a
replica re-reads the spec (``check.thorough`` is false): it read the file once at start already.

Non-goals: importing users' verifier modules in ``flywheel validate`` (it must stay side-effect free), and checking
the fields their functions read.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import random
import sys
import threading
from pathlib import Path
from typing import Any

from actors.domains._domains import BUILTIN_SOURCES, DomainSource, open_source
from actors.domains._jsonl import read_numbered_tasks
from actors.domains._task import SourceError, Task
from actors.domains._verifiers._registry import config_keys, function_problem, task_problem, verifier_names
from actors.protocol import DomainSpec
from topology import KeyPath, SectionCheck, show

__all__ = ["check_domain"]

_SLOW_IMPORT_S = 3.0  # up says so when a user's verifier module takes longer than this to import


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_domain(check: SectionCheck, path: KeyPath, domain: DomainSpec) -> DomainSpec:
    """Check one domain; returns it with its ``jsonl:`` paths made absolute."""
    name = str(path[-1])
    ok = True
    resolved: dict[str, str] = {}
    for field in ("source", "heldout"):
        value = getattr(domain, field)
        if isinstance(value, str) and value.startswith("jsonl:"):
            at: KeyPath = (*path, field)
            target = (check.base_dir(at) / os.path.expanduser(value.removeprefix("jsonl:"))).resolve()
            resolved[field] = f"jsonl:{target}"
            if not target.is_file():
                check.error(at, f"expected an existing JSONL file, got {show(value)} ({target} does not exist)")
                ok = False
    scheme, _, rest = domain.source.partition(":")
    builtin = rest.partition("?")[0]
    if scheme == "builtin" and builtin not in BUILTIN_SOURCES:
        known = sorted(BUILTIN_SOURCES)
        check.error(
            (*path, "source"),
            f"expected a builtin source ({', '.join(known)}), got {show(domain.source)}{_did_you_mean(builtin, known)}",
        )
        ok = False
    module, sep, _ = domain.verifier.partition(":")
    if not sep and domain.verifier not in verifier_names():
        known = verifier_names()
        check.error(
            (*path, "verifier"),
            f"expected one of {', '.join(known)} or module:function, got {show(domain.verifier)}"
            f"{_did_you_mean(domain.verifier, known)}",
        )
    elif not sep:  # a builtin takes only its own keyword arguments (the verify actor would crash-loop at start)
        allowed = config_keys(domain.verifier) or ()
        for key in domain.verifier_config:
            if key not in allowed:
                check.unknown_key((*path, "verifier_config", key), allowed)
        if domain.verifier_timeout_s is not None:
            instead = (
                f"set verifier_config: {{timeout_s: {domain.verifier_timeout_s:g}}}"
                if "timeout_s" in allowed
                else f"{domain.verifier} has no time limit to set"
            )
            check.error(
                (*path, "verifier_timeout_s"),
                f"applies to a module:function verifier, not the builtin {domain.verifier!r} ({instead})",
            )
        if "verifier_processes" in domain.model_fields_set:
            check.error(
                (*path, "verifier_processes"),
                f"applies to a module:function verifier, not the builtin {domain.verifier!r}",
            )
    elif importlib.util.find_spec(module.split(".")[0]) is None:
        check.error(
            (*path, "verifier"),
            f"module '{module}' is not importable here (is it installed / on PYTHONPATH?)",
            warning=not (check.starting and check.local),  # on this machine, now: the verify actor would crash-loop
        )
    elif check.starting and check.local:  # the verify actor imports it here in a moment: say now what it would say
        problem = _imported_with_notice(name, domain.verifier, domain.verifier_config)
        if problem is not None:
            check.error((*path, "verifier"), problem)
    domain = domain.model_copy(update=resolved) if resolved else domain
    if ok:  # a missing file or an unknown builtin: said already
        source = _check_opens(check, path, name, domain)
        if source is not None and check.thorough:
            _check_verifier_fields(check, path, name, domain, source)
    return domain


def _imported_with_notice(domain: str, verifier: str, config: dict[str, Any]) -> str | None:
    """``function_problem``, saying on stderr when the import takes a while (``up`` printed nothing while a module
    that loads a model, or hangs, was imported before anything started)."""
    module = verifier.partition(":")[0]
    notice = threading.Timer(
        _SLOW_IMPORT_S,
        lambda: print(
            f"flywheel: importing {module} (domain {domain}'s verifier) has taken {_SLOW_IMPORT_S:g} s so far; "
            "up checks it once before anything starts",
            file=sys.stderr,
            flush=True,
        ),
    )
    notice.daemon = True
    notice.start()
    try:
        return function_problem(verifier, config)
    finally:
        notice.cancel()


def _check_opens(check: SectionCheck, path: KeyPath, name: str, domain: DomainSpec) -> DomainSource | None:
    try:
        return open_source(domain.source, domain=name, heldout=domain.heldout, options=domain.source_options)
    except SourceError as err:
        message = str(err)
        if err.option is not None and err.option in domain.source_options:
            at: KeyPath = ("source_options", err.option)
            query = domain.source.partition("?")[2].split("&")
            if any(part.partition("=")[0] == err.option for part in query):  # given twice: the other half may sit
                # in another file (include: merges source_options key by key)
                message += f" (the source string is at {check.where((*path, 'source'))})"
        else:
            at = ("source",) if err.option is not None else (err.key or "source",)
        if err.key == "heldout" and "heldout" not in domain.model_fields_set:  # the user wrote no `heldout` to lower
            message += f" (this domain gives none: the default is {DomainSpec.model_fields['heldout'].default})"
        check.error((*path, *at), message)
        return None


def _check_verifier_fields(
    check: SectionCheck, path: KeyPath, name: str, domain: DomainSpec, source: DomainSource
) -> None:
    """Each task must carry the fields the domain's builtin verifier reads: every row of a JSONL file, one draw of a
    builtin (its tasks all have the same fields)."""

    def problem(task: Task) -> str | None:
        try:
            return task_problem(domain.verifier, domain.verifier_config, task.verifier_fields)
        except TypeError:  # verifier_config names a field that cannot be a key (a list, say): not this check's matter
            return None

    for field in ("source", "heldout"):
        value = getattr(domain, field)
        if not (isinstance(value, str) and value.startswith("jsonl:")):
            continue
        file = Path(value.removeprefix("jsonl:"))  # absolute, and it opened: check_domain saw to both
        rows = read_numbered_tasks(file, name)
        bad = [(line, found) for line, task in rows if (found := problem(task))]
        if bad:
            line, first = bad[0]
            shorthand = ', or its answer as "answer"' if domain.verifier == "math" else ""
            some = len(bad) < len(rows)  # a few bad rows score internal_error; the rest still train
            listed = ", ".join(str(at) for at, _ in bad[:6]) + (", …" if len(bad) > 6 else "")
            lines = f" (lines {listed})" if len(bad) > 1 else ""  # each bad row's line, not only the first's
            lack = f"{len(bad)} of {len(rows)} rows lack it{lines}{', and score no reward' if some else ''}"
            check.error(
                (*path, field),
                f"{file}:{line}: {first} ({lack}; a row gives the verifier its inputs under "
                f'"verifier_fields"{shorthand})',
                warning=some,
            )
    if domain.source.startswith("builtin:"):
        try:
            task = source.sample(random.Random(0))
        except SourceError as err:  # e.g. a held-out fraction that leaves no training task: the source fails too
            check.error((*path, "source"), str(err))
            return
        found = problem(task)
        if found:
            carried = ", ".join(sorted(task.verifier_fields)) or "none"
            source_name = domain.source.partition("?")[0]
            check.error(
                (*path, "verifier"),
                f"expected a verifier that reads what {source_name}'s tasks carry ({carried}), "
                f"got {show(domain.verifier)} ({found})",
            )
