"""Fixtures for the runtime tests: the test kinds made visible to this process and to every child process."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
KINDS = "tests.topology.runtime._kinds"
if str(ROOT) not in sys.path:  # so `tests.topology.runtime._kinds` (the kinds' factory module) imports here too
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def kinds_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_PLUGINS", KINDS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    importlib.import_module(KINDS)
