"""Extra actor-kind modules named by ``FLYWHEEL_ACTOR_MODULES`` (comma-separated), imported before a spec loads.

Contract: each named module is imported once; it registers its kinds with ``register_actor_kind`` on import.
This is how kinds that are not installed as entry points (a project's own, or test fixtures) reach every
process of a run: replica processes inherit the supervisor's environment. A module that fails to import is
a one-line error naming it.
"""

from __future__ import annotations

import importlib
import os

ENV_VAR = "FLYWHEEL_ACTOR_MODULES"


class ActorModuleError(Exception):
    """A module named in FLYWHEEL_ACTOR_MODULES could not be imported."""


def import_actor_modules(value: str | None = None) -> list[str]:
    names = [n.strip() for n in (os.environ.get(ENV_VAR, "") if value is None else value).split(",")]
    imported: list[str] = []
    for name in filter(None, names):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ActorModuleError(f"{ENV_VAR}: cannot import {name!r}: {exc}") from exc
        imported.append(name)
    return imported
