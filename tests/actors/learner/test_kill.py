"""SIGKILL the learner process mid-run: it resumes from its checkpoint and no sample is lost or applied twice.

The proof, from what the learner leaves on disk (nothing here trusts the learner's own counters):

1. Every optimizer step appends one ``applied`` row per message it applied (``step``, ``message_id``) tagged with
   the process's ``incarnation``; the rows of steps up to a checkpoint are fsynced *before* that checkpoint is
   written, so the trail is complete up to every checkpoint a later incarnation can resume from.
2. A resumed incarnation writes a ``resume`` row with the step of the checkpoint it restored: weights, optimizer and
   ledger are exactly those of that step, so the effect of the previous incarnation's later steps is gone.
3. Hence the messages whose effect is in the final weights are: for each incarnation, its rows with step ≤ the
   step the *next* incarnation resumed from, plus all rows of the last incarnation. The test asserts this multiset
   equals the set of published ids — each exactly once — and that the steps of that lineage are 1..N without gaps.
4. Independently, the final checkpoint's ledger holds every id, and the bus has nothing pending or un-acked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from actors.learner import read_metrics
from actors.learner._parts import live_parts
from tests.actors.learner._helpers import effective_applied, scored, write_spec
from topology import BusSpec, Spec
from topology.bus import Bus, EmbeddedNats
from topology.runtime._status import read_status

pytestmark = pytest.mark.anyio

LEARNER = (
    "    batch_size: 8\n    checkpoint_every_steps: 3\n    eval_every_steps: 0\n    fill_wait_s: 0\n"
    "    metrics_flush_s: 0.2\n    metrics_compact_parts: 2\n    max_staleness: 100\n"
)  # metrics parts are merged as they come: the audit trail is read back through merges a kill may cut short


def spawn(
    spec: Spec, run_dir: Path, url: str, restarts: int, *, module: tuple[str, ...] = ("topology.runtime._child",)
) -> subprocess.Popen[bytes]:
    log = open(run_dir / f"learner-{restarts}.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            *module,
            "--spec",
            str(spec.source_path),
            "--actor",
            "learner",
            "--replica",
            "0",
            "--run-dir",
            str(run_dir),
            "--bus-url",
            url,
            "--restarts",
            str(restarts),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).resolve().parents[3],
    )


async def counters_of(bus: Bus, spec: Spec, pid: int) -> dict[str, float]:
    records = await read_status(bus, spec.name, [("learner", 0)])
    return records[0].counters if records and records[0].pid == pid and records[0].state == "running" else {}


async def wait_counters(bus: Bus, spec: Spec, proc: subprocess.Popen[bytes], ok: object, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"learner exited with {proc.returncode}"
        counters = await counters_of(bus, spec, proc.pid)
        if counters and ok(counters):  # type: ignore[operator]
            return
        await anyio.sleep(0.1)
    raise AssertionError("timed out waiting for the learner's heartbeat")


@pytest.mark.timeout(180)
async def test_sigkill_mid_run_loses_and_doubles_nothing(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, LEARNER, ack_wait_s=1.0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ids = [f"m{i:02d}" for i in range(20)]  # 2 groups of 4 completions per step: 10 steps in all
    settings = BusSpec(ack_wait_s=1.0, max_deliver=spec.bus.max_deliver)
    async with await Bus.connect(embedded_nats.url, topology=spec.name, name="test", settings=settings) as bus:
        await bus.ensure_channel("scored")
        first = spawn(spec, run_dir, embedded_nats.url, 0)
        try:
            await wait_counters(bus, spec, first, lambda c: c.get("phase") == "rl")
            for mid in ids[:10]:  # 5 steps: the checkpoint at step 3 covers m00..m05; steps 4, 5 are not covered
                await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.5, 1.0]), id=mid)
            await wait_counters(bus, spec, first, lambda c: c.get("step") == 5 and c.get("last_checkpoint_step") == 3)
        finally:
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
        second = spawn(spec, run_dir, embedded_nats.url, 1)
        try:
            await wait_counters(bus, spec, second, lambda c: c.get("phase") == "rl")
            for mid in ids[10:]:
                await bus.publish("scored", "scored", scored("arithmetic", [1.0, 0.0, 0.0, 0.5]), id=mid)
            # resumed at 3; m06..m09 come back (never acked) with the 10 new ones: 7 more steps
            await wait_counters(bus, spec, second, lambda c: c.get("step") == 10)
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0
        consumer = await bus.nc.jetstream().consumer_info(bus.stream("scored"), "learner")
    assert consumer.num_pending == 0 and consumer.num_ack_pending == 0

    resumes = read_metrics(run_dir, "lifecycle").filter(event="resume")
    assert resumes["step"].to_list() == [3]
    assert sorted(effective_applied(run_dir)) == ids  # none lost, none doubled
    applied = read_metrics(run_dir, "applied")
    second_life = resumes["incarnation"].item()
    lineage = applied.filter((applied["incarnation"] == second_life) | (applied["step"] <= 3))
    assert sorted(set(lineage["step"].to_list())) == list(range(1, 11))
    rolled_back = applied.filter((applied["incarnation"] != second_life) & (applied["step"] > 3))
    reapplied = set(applied.filter(incarnation=second_life)["message_id"].to_list())
    assert set(rolled_back["message_id"].to_list()) <= reapplied
    kinds = ("applied", "lifecycle", "step")
    assert any(part.level > 0 for kind in kinds for part in live_parts(run_dir / "metrics", kind))  # it compacts

    from torchsnapshot import Snapshot

    final = sorted((run_dir / "state" / "learner" / "0" / "checkpoints").glob("ckpt-*"))[-1]
    ledger: object = await anyio.to_thread.run_sync(lambda: Snapshot(str(final)).read_object("0/extra/ledger"))
    assert final.name == "ckpt-000000010" and sorted(str(ledger).split("\n")) == ids


@pytest.mark.timeout(180)
async def test_sigkill_while_a_checkpoint_is_written_resumes_from_the_one_before(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """The checkpoint at step 6 is written in the background and the process is killed before it is in place (its
    snapshot complete in the temporary directory, not yet renamed), after steps 7 and 8 were taken meanwhile. What it
    covers (m06..m11) and what came after it must not have been acked; the next incarnation resumes from step 3,
    gets them all again and applies each once — and the half-done directory is never taken for a checkpoint."""
    spec = write_spec(tmp_path, LEARNER, ack_wait_s=1.0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    marker = tmp_path / "writing"
    ids = [f"m{i:02d}" for i in range(20)]
    settings = BusSpec(ack_wait_s=1.0, max_deliver=spec.bus.max_deliver)
    held = ("tests.actors.learner._held_write_child", "6", str(marker))
    async with await Bus.connect(embedded_nats.url, topology=spec.name, name="test", settings=settings) as bus:
        await bus.ensure_channel("scored")
        js = bus.nc.jetstream()
        first = spawn(spec, run_dir, embedded_nats.url, 0, module=held)
        try:
            await wait_counters(bus, spec, first, lambda c: c.get("phase") == "rl")
            for mid in ids[:16]:  # steps 1..8: checkpoint 3 is written, checkpoint 6 is held, 7 and 8 go on
                await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.5, 1.0]), id=mid)
            # training went on while checkpoint 6 was being written
            await wait_counters(bus, spec, first, lambda c: c.get("step") == 8 and c.get("last_checkpoint_step") == 3)
            assert marker.exists(), "step 8 was reached without the checkpoint at step 6 being written"
            consumer = await js.consumer_info(bus.stream("scored"), "learner")
            assert consumer.num_ack_pending == 10  # m06..m15: only what checkpoint 3 covers was acked
        finally:
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
        unfinished = Path(marker.read_text())
        assert unfinished.parent.name == "checkpoints" and unfinished.is_dir()
        second = spawn(spec, run_dir, embedded_nats.url, 1)
        try:
            await wait_counters(bus, spec, second, lambda c: c.get("phase") == "rl")
            for mid in ids[16:]:
                await bus.publish("scored", "scored", scored("arithmetic", [1.0, 0.0, 0.0, 0.5]), id=mid)
            await wait_counters(bus, spec, second, lambda c: c.get("step") == 10)  # resumed at 3: 7 more steps
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0
        consumer = await js.consumer_info(bus.stream("scored"), "learner")
    assert consumer.num_pending == 0 and consumer.num_ack_pending == 0

    resumes = read_metrics(run_dir, "lifecycle").filter(event="resume")
    assert resumes["step"].to_list() == [3]
    assert sorted(effective_applied(run_dir)) == ids  # none lost, none doubled
    checkpoints = run_dir / "state" / "learner" / "0" / "checkpoints"
    assert not unfinished.exists() and not list(checkpoints.glob(".tmp-*"))  # cleared by the next write
