"""The recorder actor against a real nats-server: partitions, atomic files, no duplicates after redelivery."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import polars as pl
import pytest

from actors.protocol import read_recordings, schema
from actors.recorder import ChannelWriter
from actors.recorder._actor import RecorderActor
from actors.recorder._writer import RecordingsMismatch, StreamIdentity
from actors.testing import running_actor
from tests.actors.recorder._support import feedback, recorder_spec, scored, traffic
from topology import BusSpec, Spec
from topology.bus import Bus, Delivery, EmbeddedNats

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def running_recorder(
    spec: Spec, server: EmbeddedNats, run_dir: Path, *, ack_wait_s: float = 1.0
) -> AsyncIterator[RecorderActor]:
    settings = BusSpec(ack_wait_s=ack_wait_s, max_deliver=50)
    async with (
        await Bus.connect(server.url, topology=spec.name, name="recorder", settings=settings) as bus,
        running_actor(RecorderActor, spec, "recorder", bus, run_dir) as actor,
    ):
        yield actor


async def wait_rows(run_dir: Path, channel: str, n: int, timeout_s: float = 10.0) -> pl.DataFrame:
    with anyio.fail_after(timeout_s):
        while True:
            frame = read_recordings(run_dir / "recordings", channel)
            if frame.height >= n:
                return frame
            await anyio.sleep(0.05)


@pytest.mark.timeout(60)
async def test_traffic_faster_than_one_window_per_interval_is_written_as_it_comes(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """The server hands the recorder at most its in-flight window of un-acked messages; a channel is flushed when
    half of it is buffered, so with a 60-s interval 5,000 messages are written within seconds, not one window a
    minute (the bus's default window is 256: the recorder used to fall behind ~100 requests/s)."""
    spec = recorder_spec(tmp_path, flush=60.0)
    async with (
        await Bus.connect(embedded_nats.url, topology=spec.name, name="producer") as producer,
        running_recorder(spec, embedded_nats, tmp_path, ack_wait_s=600.0) as actor,
    ):
        assert actor.flush_every_s == 60.0
        for start in range(0, 5000, 500):
            await producer.publish_many(
                "traffic", [("traffic", traffic(f"r{i}"), f"t{i}") for i in range(start, start + 500)]
            )
        frame = await wait_rows(tmp_path, "traffic", 2 * (actor.in_flight // 2), timeout_s=20.0)
    assert frame["request_id"].n_unique() == frame.height


async def test_every_channel_lands_in_its_hour_partition_with_the_documented_schema(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    spec = recorder_spec(tmp_path)
    async with (
        await Bus.connect(embedded_nats.url, topology=spec.name, name="producer") as producer,
        running_recorder(spec, embedded_nats, tmp_path),
    ):
        for i in range(5):
            await producer.publish("traffic", "traffic", traffic(f"r{i}"), id=f"t{i}")
            await producer.publish("feedback", "feedback", feedback(f"r{i}"), id=f"f{i}")
        await producer.publish("scored", "scored", scored("task-1", rewards=(1.0, 0.0, 1.0)), id="s1")
        traffic_rows = await wait_rows(tmp_path, "traffic", 5)
        await wait_rows(tmp_path, "feedback", 5)
        scored_rows = await wait_rows(tmp_path, "scored", 3)
    assert traffic_rows["request_id"].to_list() == [f"r{i}" for i in range(5)]
    assert traffic_rows["text"].to_list() == ["42"] * 5 and traffic_rows["version"].to_list() == [1] * 5
    assert dict(traffic_rows.schema) == schema("traffic")
    assert scored_rows["reward"].to_list() == [1.0, 0.0, 1.0]
    assert scored_rows["completion_index"].to_list() == [0, 1, 2]
    assert scored_rows["verifier_fields"].to_list() == ['{"answer":"2"}'] * 3
    hour = time.strftime("date=%Y-%m-%d/hour=%H", time.gmtime())
    files = list((tmp_path / "recordings" / "traffic").rglob("*.parquet"))
    assert files and all(hour in str(f.relative_to(tmp_path / "recordings" / "traffic")) for f in files)


def test_hourly_partitions_and_ranges_in_file_names(tmp_path: Path) -> None:
    writer = ChannelWriter(tmp_path, "feedback")
    base = time.mktime((2024, 5, 1, 10, 59, 0, 0, 0, 0)) - time.timezone  # 10:59 UTC
    rows = {
        seq: (
            base + 60 * (seq - 1),
            [
                {
                    "_seq": seq,
                    "_id": f"f{seq}",
                    "_ts": base,
                    "_source": "x",
                    "request_id": f"r{seq}",
                    "score": 1.0,
                    "ts": base,
                }
            ],
        )
        for seq in (1, 2, 3)
    }
    files = writer.write(rows)
    names = sorted(str(f.relative_to(tmp_path / "feedback")) for f in files)
    assert names == [
        "date=2024-05-01/hour=10/part-000000000001-000000000001.parquet",
        "date=2024-05-01/hour=11/part-000000000002-000000000003.parquet",
    ]
    assert read_recordings(tmp_path, "feedback")["request_id"].to_list() == ["r1", "r2", "r3"]


def test_within_one_life_a_written_message_is_known_above_and_below_the_ack_floor(tmp_path: Path) -> None:
    """What a redelivery asks (``written``) without a restart: above the ack floor the index answers, below it the
    files are looked up (a nats-server that died before it persisted the acks hands those messages out again). The
    crash tests restart the recorder, which rebuilds the index from disk, so neither path ran: answering False below
    the floor, or forgetting the index at a prune, passed the suite."""
    writer = ChannelWriter(tmp_path, "feedback")

    def row(seq: int) -> tuple[float, list[dict[str, object]]]:
        fields = {"_id": f"f{seq}", "_ts": 0.0, "_source": "x", "request_id": f"r{seq}", "score": 1.0, "ts": 0.0}
        return 0.0, [{"_seq": seq, **fields}]

    writer.write({seq: row(seq) for seq in range(1, 6)})
    writer.write({seq: row(seq) for seq in range(6, 11)})
    writer.prune(7)  # acked up to 7; 8-10 written, their acks not yet confirmed
    # above the floor, the index answers (asked first: a lookup below the floor reads a whole file back into it)
    assert [writer.written(seq) for seq in (8, 9, 10, 11)] == [True, True, True, False]
    with pytest.raises(ValueError, match="already recorded"):
        writer.write({9: row(9)})
    assert all(writer.written(seq) for seq in range(1, 8))  # below the floor: read back from the files


def test_a_failure_between_write_and_rename_leaves_no_visible_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = ChannelWriter(tmp_path, "feedback")
    row = {"_seq": 7, "_id": "f7", "_ts": 0.0, "_source": "x", "request_id": "r7", "score": 1.0, "ts": 0.0}

    def crash(*_args: object) -> None:
        raise OSError("simulated crash between write and rename")

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(OSError):
        writer.write({7: (0.0, [row])})
    monkeypatch.undo()
    assert read_recordings(tmp_path, "feedback").height == 0  # the temporary is never read
    assert list(tmp_path.rglob(".part-*.tmp"))
    fresh = ChannelWriter(tmp_path, "feedback")
    assert fresh.recover(ack_floor=0) == 0 and not fresh.written(7)
    assert not list(tmp_path.rglob(".part-*.tmp"))  # recovery removed it
    fresh.write({7: (0.0, [row])})
    assert read_recordings(tmp_path, "feedback")["_seq"].to_list() == [7]


async def test_messages_written_but_never_acked_are_not_written_again(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recorder dies between rename and ack (here: its acks are lost); the redelivered copies are skipped."""
    spec = recorder_spec(tmp_path)

    async def lost(self: Delivery[object]) -> None:
        return None

    async with await Bus.connect(embedded_nats.url, topology=spec.name, name="producer") as producer:
        with monkeypatch.context() as patch:
            patch.setattr(Delivery, "ack", lost)
            async with running_recorder(spec, embedded_nats, tmp_path):
                for i in range(20):
                    await producer.publish("traffic", "traffic", traffic(f"r{i}"), id=f"t{i}")
                await wait_rows(tmp_path, "traffic", 20)
        async with running_recorder(spec, embedded_nats, tmp_path) as second:
            with anyio.fail_after(15):
                while True:
                    if second.ctx.counters.get("traffic.duplicates_skipped") >= 20:
                        break
                    await anyio.sleep(0.05)
            await producer.publish("traffic", "traffic", traffic("r-new"), id="t-new")
            frame = await wait_rows(tmp_path, "traffic", 21)
    counts = Counter(frame["request_id"].to_list())
    assert set(counts.values()) == {1} and len(counts) == 21


async def test_a_directory_of_another_runs_stream_is_refused(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    first = recorder_spec(tmp_path)
    async with (
        await Bus.connect(embedded_nats.url, topology=first.name, name="producer") as producer,
        running_recorder(first, embedded_nats, tmp_path),
    ):
        for i in range(3):
            await producer.publish("traffic", "traffic", traffic(f"r{i}"), id=f"t{i}")
        await wait_rows(tmp_path, "traffic", 3)
    second = recorder_spec(tmp_path)  # another topology (another run) pointed at the same recordings
    with pytest.raises(RecordingsMismatch, match=r"holds the recordings of stream .* not of this run's stream"):
        async with running_recorder(second, embedded_nats, tmp_path):
            pass


async def test_a_recreated_stream_is_refused_instead_of_its_messages_acked_unwritten(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """The stream is deleted and created again: its sequences restart at 1, where the directory already has files.
    Without the claim, the index would call every new message "already written" and ack it unrecorded."""
    spec = recorder_spec(tmp_path)
    async with await Bus.connect(embedded_nats.url, topology=spec.name, name="producer") as producer:
        async with running_recorder(spec, embedded_nats, tmp_path):
            for i in range(5):
                await producer.publish("traffic", "traffic", traffic(f"old{i}"), id=f"old{i}")
            await wait_rows(tmp_path, "traffic", 5)
        await producer.nc.jetstream().delete_stream(producer.stream("traffic"))
        await producer.ensure_channel("traffic")
        for i in range(5):
            await producer.publish("traffic", "traffic", traffic(f"new{i}"), id=f"new{i}")
        with pytest.raises(RecordingsMismatch, match="deleted and created again"):
            async with running_recorder(spec, embedded_nats, tmp_path):
                pass
    assert read_recordings(tmp_path / "recordings", "traffic")["request_id"].to_list() == [f"old{i}" for i in range(5)]


def test_recordings_from_before_the_claim_are_adopted_when_they_fit_the_stream(tmp_path: Path) -> None:
    writer = ChannelWriter(tmp_path, "feedback")
    row = {"_seq": 7, "_id": "f7", "_ts": 0.0, "_source": "x", "request_id": "r7", "score": 1.0, "ts": 0.0}
    writer.write({7: (0.0, [row])})
    with pytest.raises(RecordingsMismatch, match="up to sequence 7, beyond the last message"):
        writer.claim(StreamIdentity("FW_T_FEEDBACK", "2026-01-01T00:00:00", last_seq=3))
    writer.claim(StreamIdentity("FW_T_FEEDBACK", "2026-01-01T00:00:00", last_seq=9))
    writer.claim(StreamIdentity("FW_T_FEEDBACK", "2026-01-01T00:00:00", last_seq=12))  # the same stream, later
    with pytest.raises(RecordingsMismatch):
        writer.claim(StreamIdentity("FW_T_FEEDBACK", "2026-02-02T00:00:00", last_seq=12))
