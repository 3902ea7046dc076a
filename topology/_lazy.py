"""Lazy package exports: an actor package's public names are imported on first use.

``import actors`` registers every kind by importing each ``<kind>._config`` module, which imports the kind's
package ``__init__`` first; if that imported the implementation (torch, polars, FastAPI …), ``flywheel validate``
would pay seconds for nothing. Packages therefore map each public name to its private module here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving ``name`` from ``package.<exports[name]>``."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
