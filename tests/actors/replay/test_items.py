"""What replay reads of the recordings: the newest samples, or those of the last hours, without reading weeks of
partitions for them (a partition no such read needs is made unreadable here, so reading it fails the test)."""

from __future__ import annotations

import calendar
from pathlib import Path

from actors.recorder import ChannelWriter
from actors.replay import RecordingsTail, ReplayItem, load_items

HOUR = calendar.timegm((2024, 5, 1, 0, 0, 0, 0, 0, 0))
HOURS = 6  # traffic and scored samples, 5 a partition, one partition an hour
NOW = HOUR + HOURS * 3600


def record(root: Path) -> None:
    """Each hour: 5 served requests (each rated in the hour after it, the last hour's in the same one) and 5 scored
    domain samples plus one of users' feedback, which replay skips."""
    traffic, scored, feedback = (ChannelWriter(root, channel) for channel in ("traffic", "scored", "feedback"))

    def write(writer: ChannelWriter, seq: int, at: float, **row: object) -> None:
        writer.write({seq: (at, [{"_seq": seq, "_id": f"{writer.channel}{seq}", "_ts": at, "_source": "x", **row}])})

    for hour in range(HOURS):
        for i in range(5):
            seq, ts, rid = hour * 10 + i + 1, HOUR + hour * 3600 + 60 * (i + 1), f"r{hour}-{i}"
            write(traffic, seq, ts, request_id=rid, ts=ts, prompt=f"{hour}+{i}=", text=str(hour + i))
            rated = ts + (3600 if hour < HOURS - 1 else 1)
            write(feedback, seq, rated, request_id=rid, score=i / 4, ts=rated)
            write(scored, seq, ts, task_id=f"t{hour}-{i}", domain="echo", origin="domain", completion_index=0)
        seq, ts = hour * 10 + 9, HOUR + hour * 3600 + 3000
        write(scored, seq, ts, task_id=f"j{hour}", domain="echo", origin="feedback", completion_index=0)


def spoil(root: Path, channel: str, hour: int) -> None:
    """Make every file of ``channel``'s partition of ``hour`` unreadable: a read of it fails."""
    for path in (root / channel / f"date=2024-05-01/hour={hour:02d}").glob("part-*.parquet"):
        path.write_bytes(b"not parquet")


def test_the_newest_samples_are_read_from_the_newest_partitions_alone(tmp_path: Path) -> None:
    record(tmp_path)
    everything = load_items(tmp_path)
    assert len(everything) == 2 * 5 * HOURS  # the joined feedback samples are not replayed
    for channel in ("traffic", "scored", "feedback"):
        spoil(tmp_path, channel, 0)
        spoil(tmp_path, channel, 1)
    newest = load_items(tmp_path, limit=7)
    assert [item.key for item in newest] == [item.key for item in everything[-7:]]
    traffic = load_items(tmp_path, limit=8, source="traffic")  # two partitions of requests, their feedback after
    assert [item.key for item in traffic] == [
        f"r{h}-{i}" for h, i in [(4, 2), (4, 3), (4, 4)] + [(5, i) for i in range(5)]
    ]
    assert [item.recorded_reward for item in traffic] == [0.5, 0.75, 1.0, 0.0, 0.25, 0.5, 0.75, 1.0]
    scored = load_items(tmp_path, limit=12, source="scored")  # three partitions, skipping the joined samples
    assert [item.key.split(".")[0] for item in scored] == [f"t{h}-{i}" for h in (3, 4, 5) for i in range(5)][-12:]


def test_samples_of_the_last_hours_are_read_from_their_partitions_alone(tmp_path: Path) -> None:
    record(tmp_path)
    for channel in ("traffic", "scored", "feedback"):
        for hour in range(HOURS - 2):
            spoil(tmp_path, channel, hour)
    recent = load_items(tmp_path, since_s=2 * 3600, now=NOW)
    assert sorted(item.key.split(".")[0] for item in recent) == sorted(
        [f"r{h}-{i}" for h in (4, 5) for i in range(5)] + [f"t{h}-{i}" for h in (4, 5) for i in range(5)]
    )


def seen(items: list[ReplayItem]) -> list[tuple[str, float, float | None]]:
    return [(item.key, item.ts, item.recorded_reward) for item in items]


def record_switching(root: Path) -> list[int]:
    """Two days of 3 requests an hour, each rated 20 minutes later, by a recorder whose ``partition`` setting changed
    at 06:00 each day (daily, then hourly on the first day; hourly, then daily on the second), the way a restart with
    an edited spec does it: new writers on the same directory, recovering what is there. Returns the hours' starts."""
    hours = [HOUR + day * 86_400 + hour * 3600 for day in (0, 1) for hour in range(12)]
    events: list[tuple[float, str, dict[str, object]]] = []
    for start in hours:
        for i in range(3):
            ts, rid = start + 600 * (i + 1), f"r{int(start)}-{i}"
            events.append((ts, "traffic", {"request_id": rid, "ts": ts, "prompt": rid, "text": "x"}))
            events.append((ts + 1200, "feedback", {"request_id": rid, "score": i / 2, "ts": ts + 1200}))
    events.sort(key=lambda event: event[0])
    setting, writers, seqs = "", {}, {"traffic": 0, "feedback": 0}
    for ts, channel, row in events:
        since = ts - HOUR
        wanted = "day" if since < 6 * 3600 or since >= 86_400 + 6 * 3600 else "hour"
        if wanted != setting:
            setting = wanted
            writers = {name: ChannelWriter(root, name, partition=wanted) for name in seqs}  # type: ignore[arg-type]
            for writer in writers.values():
                writer.recover(0)
        seqs[channel] += 1
        seq = seqs[channel]
        writers[channel].write({seq: (ts, [{"_seq": seq, "_id": f"{channel}{seq}", "_ts": ts, "_source": "x", **row}])})
    return hours


def test_a_day_recorded_partly_daily_and_partly_hourly_is_read_whole(tmp_path: Path) -> None:
    hours = record_switching(tmp_path)
    for day in ("2024-05-01", "2024-05-02"):  # the layout this is about: a day's own files beside its hours
        folder = tmp_path / "traffic" / f"date={day}"
        assert any(folder.glob("part-*.parquet")) and any(folder.glob("hour=*/part-*.parquet"))
    everything = load_items(tmp_path, source="traffic")
    assert len(everything) == 3 * len(hours) and all(item.recorded_reward is not None for item in everything)

    for limit in (1, 3, 10, 17, 18, 19, 30, 40, 53, 54, 55, 71, 72, 100):
        assert seen(load_items(tmp_path, limit=limit, source="traffic")) == seen(everything[-limit:]), limit
    end = hours[-1] + 3600
    for since_h in (1, 5, 6, 7, 12, 17, 18, 19, 30, 36):
        recent = load_items(tmp_path, since_s=since_h * 3600, now=end, source="traffic")
        assert seen(recent) == seen([i for i in everything if i.ts >= end - since_h * 3600]), since_h
    tail = RecordingsTail(tmp_path, "traffic")  # the gate's reader
    assert sorted(tail.new_rows()["_seq"].to_list()) == list(range(1, 3 * len(hours) + 1))


def test_a_request_recorded_twice_counts_once_towards_the_limit(tmp_path: Path) -> None:
    """Each hour's first row re-records the previous hour's last request (published again once the bus's dedupe
    window was over: a new sequence and publish time, in the next partition). The newest N are N distinct
    requests, the same as reading everything and keeping the newest N."""
    writer = ChannelWriter(tmp_path, "traffic")
    seq = 0
    for hour in range(HOURS):
        start = HOUR + hour * 3600
        requests = [(start + 60 * (i + 1), f"r{hour}-{i}") for i in range(5)]
        again = [(start + 30, f"r{hour - 1}-4")] if hour else []
        for at, rid in again + requests:
            seq += 1
            row = {"_seq": seq, "_id": rid, "_ts": at, "_source": "x", "request_id": rid, "prompt": rid, "text": "x"}
            writer.write({seq: (at, [row])})
    everything = load_items(tmp_path, source="traffic")
    assert len(everything) == 5 * HOURS
    for limit in range(1, 5 * HOURS + 2):
        assert seen(load_items(tmp_path, limit=limit, source="traffic")) == seen(everything[-limit:]), limit
