from pathlib import Path
from typing import Any

import pytest
import structlog

from topology.runtime import Actor, ActorContext, Counters


def test_counters_inc_set_snapshot() -> None:
    c = Counters()
    c.inc("acked")
    c.inc("acked", 2)
    c.set("queue_depth", 7.5)
    snap = c.snapshot()
    assert snap == {"acked": 3, "queue_depth": 7.5}
    c.inc("acked")
    assert snap["acked"] == 3, "a snapshot is a copy"


class _Minimal(Actor[None]):
    async def run(self) -> None:
        await self.ctx.stopping.wait()


def test_context_binds_logger_and_state_dir(tmp_path: Path) -> None:
    bus: Any = object()  # never used by this test: no bus call is made
    structlog.reset_defaults()  # another test in this worker may have configured a level filter
    with structlog.testing.capture_logs() as logs:
        ctx = ActorContext(
            topology="t",
            actor="gen",
            replica=1,
            kind="generator",
            spec=None,  # type: ignore[arg-type]
            bus=bus,
            run_dir=tmp_path,
        )
        ctx.log.info("hello")
    assert ctx.state_dir == tmp_path / "state" / "gen" / "1" and ctx.state_dir.is_dir()
    assert logs[0]["actor"] == "gen" and logs[0]["replica"] == 1 and logs[0]["topology"] == "t"
    actor = _Minimal(ctx, None)
    ctx.counters.inc("x")
    assert actor.report() == {"x": 1}


def test_run_is_abstract() -> None:
    class NoRun(Actor[None]):
        pass

    with pytest.raises(TypeError):
        NoRun(None, None)  # type: ignore[abstract, arg-type]
