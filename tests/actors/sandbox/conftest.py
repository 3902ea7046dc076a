from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from actors.sandbox import SandboxLimits, SandboxPool
from tests.actors.sandbox._pool_runner import PoolRunner


@pytest.fixture(scope="module")
def sandbox() -> Iterator[PoolRunner]:
    loop = asyncio.new_event_loop()
    limits = SandboxLimits(timeout_s=2.0, memory_mb=256, cpu_s=3, max_file_mb=1.0)
    pool = SandboxPool(workers=2, limits=limits)
    loop.run_until_complete(pool.start())
    try:
        yield PoolRunner(pool, loop)
    finally:
        loop.run_until_complete(pool.aclose())
        loop.close()
