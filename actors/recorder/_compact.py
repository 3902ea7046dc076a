"""Merging a closed partition's files into few, and dropping partitions past their retention — crash-safe.

The recorder writes one small file per channel and partition every flush; a service running for weeks would keep
every one of them. A partition whose hour (or day) is over receives nothing more in the ordinary course, so its
files are merged (``merge``) into files of at most ``max_rows_per_file`` rows each (a file larger than that alone
stays as it is), and partitions older than the channel's retention are deleted whole (``expire``).

How a merge keeps every row exactly once for every reader, across a kill -9 at any point:

1. The merged file is written under a hidden temporary (``.part-….merge.tmp``, which no reader opens and
   ``ChannelWriter.recover`` deletes), fsynced, renamed to ``part-<first>-<last>.parquet`` (first and last
   sequence it holds) and the directory fsynced. From then on, each of its rows is in two visible files: the
   merged one and the original. Readers keep one copy of each ``_seq`` (``read_recordings``); the writer's
   exactly-once index is keyed by sequence, so a duplicate copy changes nothing there either.
2. The originals are deleted only ``SUPERSEDED_GRACE_S`` later (``delete_superseded``): a reader that is listing
   the directory meanwhile sees the merged file, which has been there for the whole listing, whatever it sees of
   the originals; a reader that listed an original and finds it gone lists again.
3. Which files are superseded is derived from the files themselves, not from memory: a file whose sequences all
   sit in one other file of the partition is a copy. A crash before step 2 leaves such copies; the next look at
   the partition finds them and schedules their deletion instead of merging again.

``expire`` deletes a partition's files one by one, then its directory: a crash in between leaves part of a partition
that is past its retention anyway and is deleted on the next look.

Non-goals: merging a partition that is still being written (its files are merged on the next look after the
writer's late files land, if any); bounding the memory of one merge below ``max_rows_per_file`` rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from actors.protocol import partition_end, partitions, schema
from actors.recorder._writer import ChannelWriter, finish_file, fsync_dir, parse_range

__all__ = [
    "SUPERSEDED_GRACE_S",
    "Expired",
    "Merge",
    "Upkeep",
    "UpkeepReport",
    "expire",
    "merge",
]

SUPERSEDED_GRACE_S = 60.0  # how long an original outlives the merged file that holds its rows (see point 2)


@dataclass
class Merge:
    """What ``merge`` did to one partition: files it wrote, and files now superseded (to delete after the grace)."""

    written: list[Path] = field(default_factory=list)
    superseded: list[Path] = field(default_factory=list)
    rows: int = 0


@dataclass
class Expired:
    partitions: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    bytes: int = 0


def merge(folder: Path, channel: str, *, max_rows: int, compression: str) -> Merge:
    """Merge the files of one partition folder (see the module docstring); returns what was written and what is
    superseded. Files already superseded by another (a merge cut short) are reported, not merged again."""
    files = sorted(
        (p for p in folder.glob("part-*.parquet") if parse_range(p.name) is not None),
        key=lambda p: parse_range(p.name) or (0, 0),
    )
    seqs = {file: set(pl.read_parquet(file, columns=["_seq"])["_seq"].to_list()) for file in files}
    superseded = [
        file
        for file in files
        if any(other is not file and seqs[file] <= seqs[other] and _wins(other, file, seqs) for other in files)
    ]
    result = Merge(superseded=superseded)
    if superseded:  # a merge was cut short: finish it first, merge the rest on the next look
        return result
    chunks: list[list[Path]] = []
    rows_in: list[int] = []
    for file in files:
        rows = pl.scan_parquet(file).select(pl.len()).collect().item()
        if chunks and rows_in[-1] + rows <= max_rows:
            chunks[-1].append(file)
            rows_in[-1] += rows
        else:
            chunks.append([file])
            rows_in.append(rows)
    for chunk in chunks:
        if len(chunk) < 2:
            continue
        frame = pl.concat([pl.read_parquet(f) for f in chunk], how="diagonal_relaxed").sort("_seq", maintain_order=True)
        columns = schema(channel)
        frame = frame.select(
            [c for c in columns if c in frame.columns] + [c for c in frame.columns if c not in columns]
        )
        first, last = int(frame["_seq"].min()), int(frame["_seq"].max())  # type: ignore[arg-type]
        name = f"part-{first:012d}-{last:012d}.parquet"
        temporary = folder / f".{name}.{os.getpid()}.merge.tmp"
        frame.write_parquet(temporary, compression=compression)  # type: ignore[arg-type]
        final = folder / name
        finish_file(temporary, final, replace=final in chunk)
        result.written.append(final)
        result.superseded += [f for f in chunk if f != final]
        result.rows += frame.height
    return result


def _wins(other: Path, file: Path, seqs: dict[Path, set[int]]) -> bool:
    """Of two files with the same sequences, the one sorted first is kept; otherwise the larger one."""
    if seqs[file] == seqs[other]:
        return other.name < file.name
    return True


def expire(directory: Path, older_than: float) -> Expired:
    """Delete every partition under ``directory`` that was over before ``older_than`` (unix time)."""
    out = Expired()
    for partition in partitions(directory):
        end = partition_end(partition)
        if end is None or end > older_than:
            continue
        folder = directory / partition
        for file in sorted(folder.iterdir()):
            if file.is_file():
                size = file.stat().st_size
                file.unlink(missing_ok=True)
                out.files.append(file)
                out.bytes += size
        folder.rmdir()
        if folder.parent != directory and not any(folder.parent.iterdir()):
            folder.parent.rmdir()
        _fsync_parent(folder)
        out.partitions.append(partition)
    return out


def _fsync_parent(folder: Path) -> None:
    fsync_dir(folder.parent if folder.parent.exists() else folder.parent.parent)


@dataclass
class UpkeepReport:
    merged_partitions: int = 0
    merged_files: int = 0
    merged_rows: int = 0
    superseded_deleted: int = 0
    expired: Expired = field(default_factory=Expired)


class Upkeep:
    """One channel's merges and retention, on behalf of its ``ChannelWriter`` (see the module docstring).

    Remembers which partitions may need a merge (every one found at start, then those the writer wrote into) and
    which superseded files to delete when; both shrink as partitions are merged or expire."""

    def __init__(
        self,
        writer: ChannelWriter,
        *,
        merge_after_s: float,
        retain_s: float | None,
        max_rows: int,
    ) -> None:
        self.writer = writer
        self.merge_after_s = merge_after_s
        self.retain_s = retain_s
        self.max_rows = max_rows
        self._dirty: set[str] = set(partitions(writer.directory))
        self._pending: dict[Path, float] = {}  # superseded file -> when it may be deleted

    def expire_and_delete(self, now: float) -> UpkeepReport:
        """The quick part (run while the writer is idle): drop expired partitions and superseded files whose grace
        is over, and forget them in the writer's index."""
        report = UpkeepReport()
        if self.retain_s is not None:
            report.expired = expire(self.writer.directory, now - self.retain_s)
            self.writer.forget(report.expired.files)
            gone = set(report.expired.partitions)
            self._dirty -= gone
            for path in [p for p in self._pending if str(p.parent.relative_to(self.writer.directory)) in gone]:
                del self._pending[path]
        due = [path for path, at in self._pending.items() if at <= now]
        for path in due:
            path.unlink(missing_ok=True)
            del self._pending[path]
        if due:
            for folder in {p.parent for p in due}:
                fsync_dir(folder)
            self.writer.forget(due)
        report.superseded_deleted = len(due)
        return report

    def merge_closed(self, now: float) -> tuple[UpkeepReport, list[Path]]:
        """The slow part (may run while the writer writes): merge the partitions that have been over for
        ``merge_after_s``. Returns the report and the files written, for ``ChannelWriter.adopt``."""
        self._dirty |= self.writer.take_touched()
        report = UpkeepReport()
        written: list[Path] = []
        for partition in sorted(self._dirty):
            end = partition_end(partition)
            if end is None or end + self.merge_after_s > now:
                continue
            folder = self.writer.directory / partition
            if not folder.is_dir():
                self._dirty.discard(partition)
                continue
            done = merge(folder, self.writer.channel, max_rows=self.max_rows, compression=self.writer.compression)
            for path in done.superseded:
                self._pending.setdefault(path, now + SUPERSEDED_GRACE_S)
            written += done.written
            if done.written:
                report.merged_partitions += 1
                report.merged_files += len(done.superseded)
                report.merged_rows += done.rows
            if not done.superseded:  # nothing left to merge or delete until the writer writes there again
                self._dirty.discard(partition)
        return report, written

    @property
    def pending(self) -> int:
        return len(self._pending)
