"""Fixtures for the runtime tests: the test kinds made visible to this process and to every child process."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
KINDS = "tests.topology.runtime._kinds"
if str(ROOT) not in sys.path:  # so `tests.topology.runtime._kinds` (the kinds' factory module) imports here too
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def kinds_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test kinds registered for one test, and taken out of the registry after it: left in, they leaked into
    whatever test the same worker ran next — `flywheel reference` then documented `ticker` (an order-dependent
    failure of tests/topology/test_reference.py under pytest-xdist)."""
    from topology import _registry

    monkeypatch.setenv("FLYWHEEL_PLUGINS", KINDS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if KINDS in sys.modules:
        importlib.reload(sys.modules[KINDS])  # registers the kinds again (a cached import would not)
    else:
        importlib.import_module(KINDS)
    yield
    for name, kind in list(_registry._KINDS.items()):
        if kind.factory.startswith("tests."):  # the test kinds only: the application's stay
            del _registry._KINDS[name]
