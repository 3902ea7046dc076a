"""Fixtures every test folder may use: one real embedded nats-server per session, a fresh Bus per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from topology import BusSpec
from topology.bus import Bus, EmbeddedNats

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def embedded_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path_factory.mktemp("nats")) as server:
        yield server


def fresh_topology() -> str:
    """A topology name no other test uses, so streams, consumers and buckets never collide."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def bus_settings() -> BusSpec:
    return BusSpec(ack_wait_s=1.0, max_deliver=3)


@pytest.fixture
async def bus(embedded_nats: EmbeddedNats, bus_settings: BusSpec) -> AsyncIterator[Bus]:
    async with await Bus.connect(
        embedded_nats.url, topology=fresh_topology(), name="test", settings=bus_settings
    ) as connected:
        yield connected


@pytest.fixture
def repo_root() -> Path:
    return ROOT
