"""The pool's own waits: a wedged worker and a close never hold a slot (or the caller) beyond their deadlines."""

from __future__ import annotations

import asyncio
import time

import psutil
import pytest

from actors.sandbox import SandboxLimits, SandboxPool

pytestmark = pytest.mark.timeout(120)


def test_a_stopped_worker_costs_one_job_even_when_the_job_outgrows_its_pipe() -> None:
    """A worker that stops reading (wedged; here SIGSTOPped from outside) cannot hold a slot: a job larger than the
    pipe's buffer cannot even be written to it, and that write is under the job's deadline too."""

    async def scenario() -> tuple[str, str, str, float]:
        async with SandboxPool(workers=1, limits=SandboxLimits(timeout_s=1.0)) as pool:
            for pid in pool.worker_pids():  # the worker proper is the isolation wrapper's child (or the process)
                for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                    proc.suspend()
            code = "x = 1\n" + "#" * (1 << 20) + "\n"  # far beyond a pipe's 64 KiB
            started = time.monotonic()
            wedged = await asyncio.wait_for(pool.run(code, tests="assert x == 1"), 30)
            elapsed = time.monotonic() - started
            after = await asyncio.wait_for(pool.run("x = 1", tests="assert x == 1"), 30)
            return str(wedged.verdict), wedged.detail, str(after.verdict), elapsed

    verdict, detail, after, elapsed = asyncio.run(scenario())
    assert verdict == "timeout" and "did not take the job" in detail, detail
    assert elapsed < 1.0 + 2.0 + 2.0, elapsed  # the job's timeout plus the pool's grace, not the test's deadline
    assert after == "pass"


def _one_iteration(loop: asyncio.AbstractEventLoop) -> None:
    loop.call_soon(loop.stop)
    loop.run_forever()


@pytest.mark.parametrize("iterations", range(8))
def test_a_close_landing_as_a_replaced_worker_exits_still_ends(iterations: int) -> None:
    """A slot replacing its worker waits for the old one to exit; a close whose cancel lands in the same loop
    iteration as that exit must still end the slot. (`asyncio.wait_for` on Python 3.11 dropped such a cancel: the
    slot went back to waiting for jobs, and the close waited on it forever — a stress run's hung teardown.)

    The loop is driven by hand, as the sandbox fixtures do: a job that ends in a timeout leaves its slot killing
    the worker when the loop stops; the worker has exited by the time the loop is stepped ``iterations`` times and
    the close begins — one of those steps is the iteration in which the slot's wait completes."""
    loop = asyncio.new_event_loop()
    try:
        pool = SandboxPool(workers=1, limits=SandboxLimits(timeout_s=0.3))
        loop.run_until_complete(pool.start())
        result = loop.run_until_complete(pool.run("while True:\n    pass", tests="assert True"))
        assert result.verdict == "timeout", result  # replaced after it: the slot now waits for the old worker
        time.sleep(0.3)  # the killed worker exits while the loop stands still
        for _ in range(iterations):
            _one_iteration(loop)
        closing = loop.create_task(pool.aclose())
        loop.run_until_complete(asyncio.wait({closing}, timeout=10))
        stuck = [task for task in asyncio.all_tasks(loop) if task is not closing]
        assert closing.done(), f"the close did not end; pending: {stuck}"
        closing.result()
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
