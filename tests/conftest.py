"""Fixtures every test folder may use: one real embedded nats-server per session, a fresh Bus per test, loggers that
pass every level."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import structlog

from topology import BusSpec
from topology.bus import Bus, EmbeddedNats

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _logging_at_every_level() -> None:
    """Let every test's loggers pass every level. A command run in-process configures logging for the whole worker
    (`flywheel status` filters below warning): a later test's `capture_logs` on the same worker then missed every info
    event (tests/actors/generator/test_server_start.py failed after tests/actors/commands, one order in many). Only
    the level filter is reset, and caching turned off: the processors stay the list that loggers bound by wider-scoped
    fixtures already hold, which `capture_logs` changes in place."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET), cache_logger_on_first_use=False
    )


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


@pytest.fixture
def live_run() -> Iterator[Callable[[Path], Path]]:
    """``live_run(run_dir)``: take the run dir's lock as its supervisor does, so that commands read the run whose
    run.json a test wrote as live (a pid alone does not say so); released after the test."""
    from topology.runtime._rundir import lock_run_dir

    held: list[int] = []

    def hold(run_dir: Path) -> Path:
        held.append(lock_run_dir(run_dir))
        return run_dir

    yield hold
    for fd in held:
        os.close(fd)
