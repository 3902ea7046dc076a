"""Crash-safe parquet files for one channel, named by the stream sequences they hold.

Contract:
- ``write(messages)`` takes ``{stream_seq: rows}`` and makes them durable: per partition one file written under
  a hidden temporary name (``.part-….tmp``), fsynced, renamed to ``part-<first seq>-<last seq>.parquet`` and
  the directory fsynced. A reader therefore sees a whole file or none of it, and ``read_recordings`` never
  opens temporaries. Only after ``write`` returned may the caller acknowledge those messages.
- ``written(seq)`` says whether a message already sits in a visible file. The index behind it is rebuilt by
  ``recover(ack_floor)`` from the files on disk: every file whose last sequence is above the consumer's ack
  floor (messages at or below the floor are acknowledged and never come back) has its ``_seq`` column read.
  So a message redelivered after a crash between rename and ack — or after an ack the server lost — is
  recognised and not written twice. ``prune(ack_floor)`` keeps the index as small as the un-acked window;
  a message at or below a pruned floor that still comes back (nats-server killed before it persisted its
  consumer state, so its floor went backwards) is looked up in the files whose name ranges cover it.
- Temporaries left by a crash are deleted by ``recover``; they never held anything acknowledged.
- A directory belongs to one stream: ``claim(stream)`` writes ``.stream.json`` (the stream's name and creation
  time) into a fresh directory and refuses, with ``RecordingsMismatch``, a directory that holds another stream's
  recordings — another run's, or those of a stream deleted and created again. Sequences restart with a new
  stream, so its messages would look "already written" to the index and be acknowledged without being recorded.
  A directory of recordings from before the claim file existed is adopted when its sequences fit in the stream.

- Merges of closed partitions and retention (``actors.recorder._compact``) replace and delete files behind the
  writer; they tell it through ``adopt`` and ``forget`` (the index is keyed by sequence, so a row briefly held by
  both a merged file and its original is still one written message).

Non-goals: several writers on one channel directory (one recorder replica per directory), merging the recordings
of two streams in one directory.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl

from actors.protocol import frame

__all__ = [
    "ChannelWriter",
    "RecordingsMismatch",
    "StreamIdentity",
    "finish_file",
    "fsync_dir",
    "parse_range",
    "partition_of",
]

_SEQ_DIGITS = 12
CLAIM = ".stream.json"


@dataclass(frozen=True)
class StreamIdentity:
    """Which stream a channel directory records: JetStream's name and creation time tell one stream's life from
    the next (a deleted and re-created stream has the same name, a new creation time and sequences from 1)."""

    name: str
    created: str  # ISO time the server created the stream
    last_seq: int = 0  # the stream's last sequence now (not part of the identity: it only grows)

    def same_stream(self, other: StreamIdentity) -> bool:
        return (self.name, self.created) == (other.name, other.created)


class RecordingsMismatch(ValueError):
    """A recordings directory that belongs to another stream (see the module docstring)."""


def partition_of(ts: float, granularity: Literal["hour", "day"]) -> str:
    """``date=YYYY-MM-DD/hour=HH`` (UTC) of a unix time; ``date=…`` alone for daily partitions."""
    moment = time.gmtime(ts)
    day = time.strftime("date=%Y-%m-%d", moment)
    return day if granularity == "day" else f"{day}/hour={moment.tm_hour:02d}"


def parse_range(name: str) -> tuple[int, int] | None:
    """``(first, last)`` of a ``part-<first>-<last>.parquet`` name; None for anything else."""
    if not (name.startswith("part-") and name.endswith(".parquet")):
        return None
    first, sep, last = name[len("part-") : -len(".parquet")].partition("-")
    if not sep or not first.isdigit() or not last.isdigit():
        return None
    return int(first), int(last)


class ChannelWriter:
    """Files of one channel under ``root/<channel>``; see the module docstring."""

    def __init__(
        self,
        root: Path,
        channel: str,
        *,
        partition: Literal["hour", "day"] = "hour",
        compression: Literal["zstd", "snappy", "lz4", "none"] = "zstd",
    ) -> None:
        self.channel = channel
        self.directory = root / channel
        self.partition: Literal["hour", "day"] = partition
        self.compression: Literal["zstd", "snappy", "lz4", "uncompressed"] = (
            "uncompressed" if compression == "none" else compression
        )
        self._index: set[int] = set()  # sequences above the pruned floor that are in a visible file
        self._pruned_below = 0
        self._ranges: list[tuple[int, int, Path]] = []  # (first, last, file) of every visible file
        self._looked_up: set[Path] = set()
        self._touched: set[str] = set()  # partitions written into since ``take_touched``
        self.files_written = 0
        self.rows_written = 0

    # -- whose directory --------------------------------------------------------------------------------
    def claim(self, stream: StreamIdentity) -> None:
        """Bind the directory to ``stream``, or raise ``RecordingsMismatch`` (see the module docstring)."""
        path = self.directory / CLAIM
        try:
            raw = json.loads(path.read_text())
            owner = StreamIdentity(name=str(raw["name"]), created=str(raw["created"]))
        except FileNotFoundError:
            owner = None
        except (ValueError, KeyError, TypeError) as exc:
            raise RecordingsMismatch(f"{path} is unreadable ({exc}); move the directory away") from None
        if owner is not None:
            if not owner.same_stream(stream):
                raise RecordingsMismatch(
                    f"{self.directory} holds the recordings of stream {owner.name} created {owner.created}, not of "
                    f"this run's stream {stream.name} created {stream.created} (another run's directory, or the "
                    "stream was deleted and created again, so its sequences restarted): record into a fresh "
                    "directory (the recorder's `directory`) or move the old recordings away"
                )
            return
        ranges = [bounds for file in self._visible_files() if (bounds := parse_range(file.name)) is not None]
        highest = max((last for _first, last in ranges), default=0)
        if highest > stream.last_seq:
            raise RecordingsMismatch(
                f"{self.directory} holds recordings up to sequence {highest}, beyond the last message of this run's "
                f"stream {stream.name} ({stream.last_seq}): they are another stream's; record into a fresh directory "
                "(the recorder's `directory`) or move them away"
            )
        _make_dirs(self.directory)
        temporary = self.directory / f".{CLAIM}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps({"name": stream.name, "created": stream.created}))
        os.rename(temporary, path)
        fsync_dir(self.directory)

    def _visible_files(self) -> list[Path]:
        return list(self.directory.rglob("part-*.parquet")) if self.directory.is_dir() else []

    # -- exactly-once index ---------------------------------------------------------------------------
    def recover(self, ack_floor: int) -> int:
        """Delete temporaries and index every message above ``ack_floor`` already in a file; returns how many."""
        self._index.clear()
        self._ranges.clear()
        self._looked_up.clear()
        self._pruned_below = ack_floor
        if not self.directory.is_dir():
            return 0
        for stale in self.directory.rglob(".part-*.tmp"):
            stale.unlink(missing_ok=True)
        for file in self.directory.rglob("part-*.parquet"):
            bounds = parse_range(file.name)
            if bounds is None:
                continue
            self._ranges.append((bounds[0], bounds[1], file))
            if bounds[1] > ack_floor:
                self._index.update(seq for seq in _seqs(file) if seq > ack_floor)
        return len(self._index)

    def written(self, seq: int) -> bool:
        if seq in self._index:
            return True
        if seq > self._pruned_below:
            return False
        for first, last, file in self._ranges:  # below the floor: only a server that lost its state asks
            if first <= seq <= last and file not in self._looked_up:
                self._looked_up.add(file)
                self._index.update(_seqs(file))
        return seq in self._index

    def prune(self, ack_floor: int) -> None:
        if ack_floor > self._pruned_below:
            self._pruned_below = ack_floor
            self._looked_up.clear()
            self._index = {seq for seq in self._index if seq > ack_floor}

    def forget(self, files: list[Path]) -> None:
        """Files deleted by a merge or by retention: no longer where a sequence below the floor is looked up."""
        gone = set(files)
        if gone:
            self._ranges = [entry for entry in self._ranges if entry[2] not in gone]
            self._looked_up -= gone

    def adopt(self, files: list[Path]) -> None:
        """Files written by a merge: where the sequences they hold are looked up from now on."""
        known = {entry[2] for entry in self._ranges}
        for file in files:
            bounds = parse_range(file.name)
            if bounds is not None and file not in known:
                self._ranges.append((bounds[0], bounds[1], file))

    def take_touched(self) -> set[str]:
        """The partitions written into since the last call."""
        touched, self._touched = self._touched, set()
        return touched

    @property
    def indexed(self) -> int:
        return len(self._index)

    # -- writing --------------------------------------------------------------------------------------
    def write(self, messages: Mapping[int, tuple[float, list[dict[str, Any]]]]) -> list[Path]:
        """Make ``{seq: (publish ts, rows)}`` durable (see the module docstring); returns the new files."""
        by_partition: dict[str, list[int]] = {}
        for seq, (ts, _rows) in messages.items():
            if seq in self._index:
                raise ValueError(f"{self.channel}: message {seq} is already recorded")
            by_partition.setdefault(partition_of(ts, self.partition), []).append(seq)
        files: list[Path] = []
        for partition, seqs in sorted(by_partition.items()):
            seqs.sort()
            rows = [row for seq in seqs for row in messages[seq][1]]
            file = self._write_file(self.directory / partition, seqs, rows)
            files.append(file)
            self._ranges.append((seqs[0], seqs[-1], file))
            self._index.update(seqs)
        return files

    def _write_file(self, folder: Path, seqs: list[int], rows: list[dict[str, Any]]) -> Path:
        _make_dirs(folder)
        name = f"part-{seqs[0]:0{_SEQ_DIGITS}d}-{seqs[-1]:0{_SEQ_DIGITS}d}.parquet"
        final = folder / name
        if final.exists():  # cannot happen while the index is right; refuse rather than overwrite history
            raise FileExistsError(f"{final} exists already")
        temporary = folder / f".{name}.{os.getpid()}.tmp"
        frame(self.channel, rows).write_parquet(temporary, compression=self.compression)
        finish_file(temporary, final)
        self._touched.add(str(folder.relative_to(self.directory)))
        self.files_written += 1
        self.rows_written += len(rows)
        return final


def finish_file(temporary: Path, final: Path, *, replace: bool = False) -> None:
    """Make a written temporary visible as ``final``: fsync it, rename it into place, fsync the directory. Refuses
    to overwrite an existing ``final`` unless ``replace`` (a merge whose output holds every row of that file)."""
    fd = os.open(temporary, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if final.exists() and not replace:
        temporary.unlink(missing_ok=True)
        raise FileExistsError(f"{final} exists already")
    os.rename(temporary, final)
    fsync_dir(final.parent)


def _seqs(file: Path) -> list[int]:
    try:
        return [int(seq) for seq in pl.read_parquet(file, columns=["_seq"])["_seq"]]
    except FileNotFoundError:  # merged or expired meanwhile; its rows are in the merged file, or gone for good
        return []


def _make_dirs(folder: Path) -> None:
    missing: list[Path] = []
    probe = folder
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    folder.mkdir(parents=True, exist_ok=True)
    for created in reversed(missing):  # a new directory entry is durable once its parent is fsynced
        fsync_dir(created.parent)


def fsync_dir(folder: Path) -> None:
    """Make the entries created, renamed or removed in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
