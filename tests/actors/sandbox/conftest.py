"""The sandbox tests' pools. ``FLYWHEEL_TEST_ISOLATION=unshare`` (or ``rlimits``) runs them at a weaker level."""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Iterator
from typing import Any

import pytest

from actors.sandbox import SandboxLimits, SandboxPool
from tests.actors.sandbox._pool_runner import PoolRunner


def _runner(workers: int) -> Iterator[PoolRunner]:
    loop = asyncio.new_event_loop()
    limits = SandboxLimits(timeout_s=2.0, memory_mb=256, cpu_s=3, max_file_mb=1.0)
    level = os.environ.get("FLYWHEEL_TEST_ISOLATION", "")
    weaker: dict[str, Any] = {"isolation": level, "min_isolation": level} if level else {}
    pool = SandboxPool(workers=workers, limits=limits, **weaker)
    loop.run_until_complete(pool.start())
    try:
        yield PoolRunner(pool, loop)
    finally:
        _close(pool, loop)


def _close(pool: SandboxPool, loop: asyncio.AbstractEventLoop) -> None:
    """Close the pool; a close that does not end names every await still pending, instead of a bare timeout."""
    closing = loop.create_task(pool.aclose())
    loop.run_until_complete(asyncio.wait({closing}, timeout=12))
    if not closing.done():
        stacks = io.StringIO()
        for task in asyncio.all_tasks(loop):
            task.print_stack(file=stacks)
        pytest.fail(f"the pool's close did not end within 12 s; its pending tasks:\n{stacks.getvalue()}")
    closing.result()
    loop.close()


@pytest.fixture(scope="module")
def sandbox() -> Iterator[PoolRunner]:
    """A real pool of two workers at the default (bubblewrap) isolation, shared by a module's tests."""
    yield from _runner(2)


@pytest.fixture(scope="module")
def sandbox_one() -> Iterator[PoolRunner]:
    """A real pool of one worker: consecutive jobs run on the same worker (until it is replaced)."""
    yield from _runner(1)
