"""HeapFreezer: the long-lived heap is frozen at start and again after a slow full collection."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from topology.bus import EmbeddedNats
from topology.runtime import ActorContext
from topology.runtime._gc import HeapFreezer


@pytest.fixture
def unfreeze_after() -> Iterator[None]:
    try:
        yield
    finally:
        gc.unfreeze()  # this pytest process must not keep the tests' objects out of the collector


def test_install_freezes_the_heap_and_uninstall_removes_the_hook(unfreeze_after: None) -> None:
    gc.unfreeze()
    freezer = HeapFreezer()
    freezer.install()
    try:
        assert freezer._on_gc in gc.callbacks
        assert gc.get_freeze_count() > 1000  # pytest's and the project's modules
        # the count at the freeze: frozen objects still die by reference counting (another thread of this process
        # ending, say), so the count now may be lower, never higher
        assert freezer.counters["gc_freezes"] == 1 and freezer.counters["gc_frozen"] >= gc.get_freeze_count() > 1000
    finally:
        freezer.uninstall()
    assert freezer._on_gc not in gc.callbacks


def test_a_slow_full_collection_makes_a_freeze_due_once_per_interval(unfreeze_after: None) -> None:
    freezer = HeapFreezer(slow_s=0.0, min_interval_s=0.0)  # every full collection counts as slow
    freezer.install()
    try:
        assert not freezer.freeze_due()
        gc.collect(1)  # not a full collection: ignored
        assert not freezer.freeze_due() and freezer.counters["gc_slow_full"] == 0
        gc.collect()
        assert freezer.counters["gc_slow_full"] == 1 and freezer.freeze_due()
        freezer.freeze()
        assert freezer.counters["gc_freezes"] == 2 and not freezer.freeze_due()
        freezer.min_interval_s = 3600.0
        gc.collect()
        assert freezer.counters["gc_slow_full"] == 2 and not freezer.freeze_due()  # frozen too recently
    finally:
        freezer.uninstall()


def test_fast_full_collections_do_not_refreeze(unfreeze_after: None) -> None:
    freezer = HeapFreezer(slow_s=60.0, min_interval_s=0.0)
    freezer.install()
    try:
        gc.collect()
        assert freezer.counters["gc_slow_full"] == 0 and not freezer.freeze_due()
    finally:
        freezer.uninstall()


@pytest.mark.anyio
async def test_watch_refreezes_and_reports(unfreeze_after: None) -> None:
    freezer = HeapFreezer(slow_s=0.0, min_interval_s=0.0, poll_s=0.01)
    freezer.install()
    reports: list[dict[str, int]] = []
    refrozen = anyio.Event()

    def report(counters: dict[str, int]) -> None:
        reports.append(dict(counters))
        if counters["gc_freezes"] >= 2:
            refrozen.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(freezer.watch, report)
            await anyio.sleep(0.05)
            gc.collect()
            with anyio.fail_after(5):
                await refrozen.wait()
            tg.cancel_scope.cancel()
    finally:
        freezer.uninstall()
    assert reports[0]["gc_freezes"] == 1  # reported right away, before the first poll
    assert reports[-1]["gc_freezes"] >= 2 and reports[-1]["gc_slow_full"] >= 1


@pytest.mark.anyio
async def test_a_replica_run_in_process_leaves_no_hook_behind(
    unfreeze_after: None, embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """The Ray runtime runs a restarted replica in the same process: each run must take its gc hook away."""
    from actors.learner._actor import LearnerActor
    from tests.actors.learner._helpers import wait_until, write_spec
    from topology.runtime._child import run_replica

    spec = write_spec(tmp_path, "    eval_every_steps: 0\n")
    hooks_before = len(gc.callbacks)
    contexts: list[ActorContext] = []
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            assert (
                await run_replica(
                    spec,
                    LearnerActor,
                    "learner",
                    0,
                    run_dir=tmp_path / "run",
                    bus_url=embedded_nats.url,
                    handle_signals=False,
                    on_context=contexts.append,
                    freeze_heap=True,
                )
                == 0
            )

        tg.start_soon(run)
        await wait_until(lambda: bool(contexts) and contexts[0].counters.get("gc_freezes") == 1, timeout_s=60.0)
        assert len(gc.callbacks) == hooks_before + 1
        contexts[0].stopping.set()
    assert len(gc.callbacks) == hooks_before
