"""A real sandbox pool on its own event loop, shared by a module's tests."""

from __future__ import annotations

import asyncio
from typing import Any

from actors.sandbox import SandboxPool, SandboxResult


class PoolRunner:
    """A real pool on its own event loop, shared by a module's tests (starting workers costs ~50 ms each)."""

    def __init__(self, pool: SandboxPool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool, self.loop = pool, loop

    def run(self, code: str, **kwargs: Any) -> SandboxResult:
        return self.loop.run_until_complete(self.pool.run(code, **kwargs))

    def call(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def still_serves(self) -> None:
        result = self.run("def f():\n    return 7", tests="assert f() == 7")
        assert result.verdict == "pass", result
