"""Malformed messages are counted where they were refused: a replica's heartbeat carries ``dead_lettered`` and
``dead_lettered.<channel>`` for what its consumers sent to the dead-letter channel, so ``flywheel status``, the
``/metrics`` endpoint and ``flywheel up``'s own line show them. Real processes: the ``flywheel up`` CLI, its replicas
(test kinds ``ticker`` → ``tally``) and nats-server; the poison is published from outside with the run's token."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.topology.runtime._helpers import live_rows, status_json, wait_for, write_spec
from tests.topology.runtime.test_durable_run import start, stop, the_run
from topology.bus import Bus
from topology.runtime import bus_token, read_run_info

pytestmark = [pytest.mark.usefixtures("kinds_env"), pytest.mark.timeout(120)]

POISON = [
    b"\xff\xfe not json",
    b"[1, 2, 3]",
    b'{"id": "x", "type": "tick", "v": 1, "ts": 0, "source": "", "payload": 7}',
]


def _counters(run_dir: Path, actor: str) -> dict[str, Any]:
    rows = [row for row in status_json(run_dir)["replicas"] if row["actor"] == actor]
    return dict(rows[0]["counters"]) if rows else {}


def test_a_replicas_dead_letters_are_in_its_heartbeat_and_the_live_line(tmp_path: Path) -> None:
    up = start(write_spec(tmp_path), "--duration", "60")
    try:
        run_dir = the_run(tmp_path)
        wait_for("replicas running", lambda: live_rows(run_dir))
        assert "dead_lettered" not in _counters(run_dir, "tally")  # nothing refused yet: nothing shown
        info = read_run_info(run_dir)

        async def publish() -> None:
            async with await Bus.connect(
                info.bus_url, topology="rt-test", name="hostile", token=bus_token(info)
            ) as bus:
                js = bus.nc.jetstream()
                for data in POISON:
                    await js.publish(bus.subject("ticks"), data)

        anyio.run(publish, backend="asyncio")
        counters = wait_for(
            "the tally's dead letters in its heartbeat",
            lambda: (c := _counters(run_dir, "tally")).get("dead_lettered") == len(POISON) and c,
        )
        assert counters["dead_lettered.ticks"] == len(POISON)
        assert "dead_lettered" not in _counters(run_dir, "ticker")  # a replica counts its own consumers' only
        time.sleep(1.5)  # up prints its line every 0.5 s (start's --every): a few of them after that heartbeat
    finally:
        out = stop(up)
    assert f"tally[0]=running {len(POISON)} dead-lettered" in out
