"""Merging closed partitions and retention: every reader sees each row once before, during and after a merge, and a
merge cut short at any step loses nothing and duplicates nothing."""

from __future__ import annotations

import calendar
import os
import time
from pathlib import Path

import polars as pl
import pytest

from actors.protocol import read_recordings
from actors.recorder import ChannelWriter
from actors.recorder._compact import SUPERSEDED_GRACE_S, Upkeep
from actors.replay import RecordingsTail

HOUR = calendar.timegm((2024, 5, 1, 10, 0, 0, 0, 0, 0))  # a long-closed hour
AFTER = HOUR + 3 * 3600  # a "now" at which that hour is over


def row(seq: int, ts: float) -> dict[str, object]:
    return {"_seq": seq, "_id": f"f{seq}", "_ts": ts, "_source": "x", "request_id": f"r{seq}", "score": 1.0, "ts": ts}


def write_one_file_each(writer: ChannelWriter, seqs: range, ts: float = HOUR + 60) -> None:
    for seq in seqs:
        writer.write({seq: (ts, [row(seq, ts)])})


def files(root: Path) -> list[Path]:
    return sorted((root / "feedback").rglob("part-*.parquet"))


def upkeep(writer: ChannelWriter, *, max_rows: int = 100_000, retain_s: float | None = None) -> Upkeep:
    return Upkeep(writer, merge_after_s=600, retain_s=retain_s, max_rows=max_rows)


def assert_once(root: Path, seqs: range) -> None:
    assert read_recordings(root, "feedback")["_seq"].to_list() == list(seqs)


def test_a_closed_partition_is_merged_into_files_of_at_most_max_rows(tmp_path: Path) -> None:
    writer = ChannelWriter(tmp_path, "feedback")
    write_one_file_each(writer, range(1, 31))
    keeper = upkeep(writer, max_rows=12)
    assert keeper.merge_closed(HOUR + 1800)[1] == []  # the hour is not over: nothing merged
    report, written = keeper.merge_closed(AFTER)
    writer.adopt(written)
    assert [pl.read_parquet(f).height for f in written] == [12, 12, 6] and report.merged_files == 30
    assert_once(tmp_path, range(1, 31))  # originals and merged files both visible: still once each
    assert keeper.expire_and_delete(AFTER).superseded_deleted == 0  # the grace is not over
    assert keeper.expire_and_delete(AFTER + SUPERSEDED_GRACE_S).superseded_deleted == 30
    assert files(tmp_path) == sorted(written)
    assert_once(tmp_path, range(1, 31))
    assert all(writer.written(seq) for seq in range(1, 31))  # the exactly-once index still knows them


def test_a_merge_cut_short_before_its_rename_leaves_the_originals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = ChannelWriter(tmp_path, "feedback")
    write_one_file_each(writer, range(1, 11))

    def killed(*_args: object) -> None:
        raise OSError("killed between writing the merged file and renaming it")

    monkeypatch.setattr(os, "rename", killed)
    with pytest.raises(OSError):
        upkeep(writer).merge_closed(AFTER)
    monkeypatch.undo()
    assert_once(tmp_path, range(1, 11))
    restarted = ChannelWriter(tmp_path, "feedback")
    restarted.recover(ack_floor=0)
    assert not list(tmp_path.rglob(".part-*"))  # the merge's temporary is gone
    keeper = upkeep(restarted)
    keeper.merge_closed(AFTER)
    keeper.expire_and_delete(AFTER + SUPERSEDED_GRACE_S)
    assert len(files(tmp_path)) == 1
    assert_once(tmp_path, range(1, 11))


def test_a_merge_cut_short_after_its_rename_is_finished_not_redone(tmp_path: Path) -> None:
    """Killed once the merged file is in place but before the originals were deleted: the restarted recorder
    finds the originals superseded and deletes them after the grace, without writing the rows a third time."""
    writer = ChannelWriter(tmp_path, "feedback")
    write_one_file_each(writer, range(1, 11))
    _report, written = upkeep(writer).merge_closed(AFTER)  # ...and the process dies here
    restarted = ChannelWriter(tmp_path, "feedback")
    assert restarted.recover(ack_floor=0) == 10
    keeper = upkeep(restarted)
    report, again = keeper.merge_closed(AFTER + 5)
    assert again == [] and report.merged_partitions == 0
    assert_once(tmp_path, range(1, 11))
    assert keeper.expire_and_delete(AFTER + 5 + SUPERSEDED_GRACE_S).superseded_deleted == 10
    assert files(tmp_path) == written
    assert_once(tmp_path, range(1, 11))


def test_rows_recorded_late_into_a_merged_partition_are_merged_next_time(tmp_path: Path) -> None:
    writer = ChannelWriter(tmp_path, "feedback")
    write_one_file_each(writer, range(1, 6))
    keeper = upkeep(writer)
    writer.adopt(keeper.merge_closed(AFTER)[1])
    keeper.expire_and_delete(AFTER + SUPERSEDED_GRACE_S)
    write_one_file_each(writer, range(6, 9))  # published in that hour, recorded after a recorder outage
    writer.adopt(keeper.merge_closed(AFTER + SUPERSEDED_GRACE_S)[1])
    keeper.expire_and_delete(AFTER + 2 * SUPERSEDED_GRACE_S)
    assert len(files(tmp_path)) == 1
    assert_once(tmp_path, range(1, 9))


def test_retention_deletes_whole_partitions_past_their_age(tmp_path: Path) -> None:
    writer = ChannelWriter(tmp_path, "feedback")
    now = HOUR + 10 * 86_400
    write_one_file_each(writer, range(1, 4), ts=HOUR + 60)  # ten days old
    write_one_file_each(writer, range(4, 6), ts=now - 86_400)  # a day old
    report = upkeep(writer, retain_s=7 * 86_400).expire_and_delete(now)
    assert report.expired.partitions == ["date=2024-05-01/hour=10"] and len(report.expired.files) == 3
    assert report.expired.bytes > 0
    assert not (tmp_path / "feedback" / "date=2024-05-01").exists()
    assert_once(tmp_path, range(4, 6))


def test_a_day_recorded_partly_daily_and_partly_hourly_is_merged_and_expired_whole(tmp_path: Path) -> None:
    """The ``partition`` setting changed from day to hour mid-day and the recorder restarted: the day's own files
    beside its hour folders are merged once the day is over and deleted with it."""
    daily = ChannelWriter(tmp_path, "feedback", partition="day")
    write_one_file_each(daily, range(1, 6))  # 10:01, daily
    hourly = ChannelWriter(tmp_path, "feedback")
    hourly.recover(ack_floor=0)
    write_one_file_each(hourly, range(6, 9), ts=HOUR + 3600 + 60)  # 11:01, hourly
    day = tmp_path / "feedback" / "date=2024-05-01"
    keeper = upkeep(hourly, retain_s=7 * 86_400)
    hourly.adopt(keeper.merge_closed(HOUR + 86_400)[1])
    keeper.expire_and_delete(HOUR + 86_400 + SUPERSEDED_GRACE_S)
    assert len(list(day.glob("part-*.parquet"))) == 1 and len(list(day.glob("hour=*/part-*.parquet"))) == 1
    assert_once(tmp_path, range(1, 9))
    report = keeper.expire_and_delete(HOUR + 8 * 86_400)
    assert report.expired.partitions == ["date=2024-05-01/hour=11", "date=2024-05-01"]
    assert not day.exists()


def test_the_tail_returns_each_row_once_while_files_it_read_are_merged(tmp_path: Path) -> None:
    writer = ChannelWriter(tmp_path, "feedback")
    tail = RecordingsTail(tmp_path, "feedback")
    write_one_file_each(writer, range(1, 21))
    assert tail.new_rows()["_seq"].to_list() == list(range(1, 21))
    write_one_file_each(writer, range(21, 26))  # not read yet when the merge takes them in
    keeper = upkeep(writer)
    writer.adopt(keeper.merge_closed(AFTER)[1])
    assert tail.new_rows()["_seq"].to_list() == list(range(21, 26))
    keeper.expire_and_delete(AFTER + SUPERSEDED_GRACE_S)
    assert tail.new_rows().height == 0
    assert len(tail.returned) == 1  # what it remembers: one range, not one entry per file or row


def test_the_tail_does_not_list_folders_that_did_not_change(tmp_path: Path) -> None:
    writer = ChannelWriter(tmp_path, "feedback")
    for hour in range(24):
        write_one_file_each(writer, range(hour * 10 + 1, hour * 10 + 11), ts=HOUR + hour * 3600 + 60)
    tail = RecordingsTail(tmp_path, "feedback")
    assert tail.new_rows().height == 240
    settled = time.time() - 60
    for folder in (tmp_path / "feedback").glob("date=*/hour=*"):
        os.utime(folder, (settled, settled))
    tail.new_rows()
    listed = tail.files_listed
    assert tail.new_rows().height == 0 and tail.files_listed == listed
    write_one_file_each(writer, range(241, 243), ts=HOUR + 5 * 3600 + 60)
    assert tail.new_rows()["_seq"].to_list() == [241, 242]
    assert tail.files_listed - listed == 12  # only the folder written into was listed
