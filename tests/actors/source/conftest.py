"""Fixtures for the source actor tests: one real embedded nats-server per session (as in tests/topology/bus)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from topology.bus import EmbeddedNats


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def embedded_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path_factory.mktemp("nats")) as server:
        yield server
