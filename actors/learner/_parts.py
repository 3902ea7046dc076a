"""The learner's metrics parts on disk: their names, which of them hold the rows, and their compaction.

Contract:
- A writer's part is ``<kind>-<incarnation>-<n:05d>.parquet`` (``n`` grows within an incarnation and is never
  reused). A merged part is ``<kind>-<incarnation>-<first:05d>-<last:05d>-L<level>.parquet``: every row of the
  parts of that kind and incarnation numbered ``first`` to ``last``, in their order. Its name is its manifest.
- :func:`read_parts` reads the *live* parts of a kind: those no merged part of a higher level covers (a kill between
  a merge's rename and the deletion of its sources leaves both on disk; the sources are then skipped), ordered by
  incarnation and number — every row once, in the order the parts were written.
- :func:`compact` merges, per kind and incarnation, the oldest ``fan_in`` live parts of a level into one part of the
  next level once that level has ``fan_in`` of them (level 0: the parts as written). A kind thus keeps fewer than
  ``fan_in`` parts per level and incarnation, and the levels grow with the logarithm of the parts written. A merge
  is written under a hidden temporary name, fsynced, renamed, the directory fsynced, then its sources are deleted: a
  kill at any point neither loses nor repeats a row. Temporaries left by a killed writer or compaction are deleted
  by the next compaction (except the running writer's own, ``keep``).
- Readers and compaction share ``.lock`` in the directory (``flock``): a reader holds it shared while it lists and
  reads, compaction holds it exclusively while it renames and deletes, so a reader never sees a merge's rows twice
  or not at all. A compaction waiting for the lock holds ``.lock-turn``, which readers pass before they take
  ``.lock``: new readers wait behind it, so a stream of readers cannot starve it. It waits at most ``lock_wait_s``
  for the readers under way and otherwise leaves the merge for its next call. A directory without the lock files
  (written before compaction existed, and never compacted) is read unlocked.

Non-goals: merging parts of different incarnations (a run keeps fewer than ``fan_in`` parts per level for each life
of its learner), several compactions of one directory at once (one learner per run), power loss during a writer's
flush (its parts are fsynced, its directory is not).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from actors.learner._checkpoint import fsync_dir

__all__ = ["LOCK", "TURN", "Part", "compact", "live_parts", "read_parts"]

LOCK = ".lock"
TURN = ".lock-turn"
_MERGED = re.compile(r"(?P<incarnation>.+)-(?P<first>\d+)-(?P<last>\d+)-L(?P<level>\d+)\.parquet")
_WRITTEN = re.compile(r"(?P<incarnation>.+)-(?P<first>\d+)\.parquet")


@dataclass(frozen=True)
class Part:
    path: Path
    kind: str
    incarnation: str
    first: int
    last: int
    level: int  # 0: as the writer wrote it

    def covers(self, other: Part) -> bool:
        return (
            self.incarnation == other.incarnation
            and self.level > other.level
            and self.first <= other.first
            and other.last <= self.last
        )


def parse(path: Path, kind: str) -> Part | None:
    """The part ``path`` names when it is one of ``kind``, else None."""
    name = path.name
    if not name.startswith(f"{kind}-"):
        return None
    rest = name[len(kind) + 1 :]
    if found := _MERGED.fullmatch(rest):
        first, last, level = int(found["first"]), int(found["last"]), int(found["level"])
        return Part(path, kind, found["incarnation"], first, last, level)
    if found := _WRITTEN.fullmatch(rest):
        return Part(path, kind, found["incarnation"], int(found["first"]), int(found["first"]), 0)
    return None


def live_parts(directory: Path, kind: str) -> list[Part]:
    """The parts of ``kind`` that hold its rows (see the module docstring), in the order they were written. Call it
    under :func:`_shared` when the files are read afterwards."""
    return _split(directory, kind)[0]


def _split(directory: Path, kind: str) -> tuple[list[Part], list[Part]]:
    """(live, covered) parts of ``kind``."""
    if not directory.is_dir():
        return [], []
    parts = [part for path in directory.iterdir() if (part := parse(path, kind)) is not None]
    # a covering part starts at or before the parts it covers: a sweep in (incarnation, first, -level) order meets
    # it first
    parts.sort(key=lambda part: (part.incarnation, part.first, -part.level))
    live: list[Part] = []
    covered: list[Part] = []
    for part in parts:
        (covered if live and live[-1].covers(part) else live).append(part)
    return live, covered


def read_parts(directory: Path, kind: str) -> pl.DataFrame:
    """Every row of ``kind`` under ``directory`` (columns missing in a part are null); an empty frame when none."""
    with _shared(directory):
        frames = [pl.read_parquet(part.path) for part in live_parts(directory, kind)]
    if not frames:
        return pl.DataFrame()
    return pl.concat(frames, how="diagonal_relaxed")


def compact(directory: Path, *, fan_in: int, keep: str | None = None, lock_wait_s: float = 10.0) -> list[Path]:
    """Merge what is due (see the module docstring); returns the merged parts written. ``keep``: the incarnation
    whose writer is running, whose temporaries are left alone."""
    if fan_in < 2:
        raise ValueError(f"fan_in: expected an integer >= 2, got {fan_in}")
    _remove_temporaries(directory, keep)
    written: list[Path] = []
    for kind in sorted({name.split("-", 1)[0] for name in os.listdir(directory) if name.endswith(".parquet")}):
        leftovers = _split(directory, kind)[1]  # the sources of a merge that a kill kept from deleting them
        if leftovers:
            with _exclusive(directory, lock_wait_s) as held:
                for part in leftovers if held else ():
                    part.path.unlink(missing_ok=True)
        while due := _due(live_parts(directory, kind), fan_in):
            merged = _merge(directory, due, lock_wait_s)
            if merged is None:
                return written  # readers held the lock all along: next time
            written.append(merged)
    return written


def _due(live: list[Part], fan_in: int) -> list[Part]:
    """The oldest ``fan_in`` live parts of the lowest level of one incarnation that has ``fan_in`` of them."""
    by_level: dict[tuple[str, int], list[Part]] = {}
    for part in live:
        by_level.setdefault((part.incarnation, part.level), []).append(part)
    for (_, _), parts in sorted(by_level.items(), key=lambda item: (item[0][1], item[0][0])):
        if len(parts) >= fan_in:
            return parts[:fan_in]
    return []


def _merge(directory: Path, sources: list[Part], lock_wait_s: float) -> Path | None:
    head = sources[0]
    level = max(part.level for part in sources) + 1
    name = f"{head.kind}-{head.incarnation}-{head.first:05d}-{sources[-1].last:05d}-L{level}.parquet"
    final = directory / name
    tmp = directory / f".{name}.tmp"
    frame = pl.concat([pl.read_parquet(part.path) for part in sources], how="diagonal_relaxed")
    frame.write_parquet(tmp)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    with _exclusive(directory, lock_wait_s) as held:
        if not held:
            tmp.unlink(missing_ok=True)
            return None
        os.replace(tmp, final)
        fsync_dir(directory)  # the merge is on disk before any of its sources leaves it
        for part in sources:
            part.path.unlink(missing_ok=True)
    return final


def _remove_temporaries(directory: Path, keep: str | None) -> None:
    for path in directory.glob(".*.parquet.tmp"):
        named = path.with_name(path.name[1 : -len(".tmp")])
        part = parse(named, named.name.split("-", 1)[0])
        if part is not None and part.level == 0 and part.incarnation == keep:
            continue  # the running writer's flush under way
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def _shared(directory: Path) -> Iterator[None]:
    try:
        turn = os.open(directory / TURN, os.O_RDONLY)
        lock = os.open(directory / LOCK, os.O_RDONLY)
    except FileNotFoundError:
        yield  # never compacted: nothing is renamed or deleted under a reader
        return
    try:
        fcntl.flock(turn, fcntl.LOCK_EX)  # wait behind a compaction waiting for the lock: readers never starve it
        fcntl.flock(turn, fcntl.LOCK_UN)
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield
    finally:
        os.close(lock)
        os.close(turn)


@contextlib.contextmanager
def _exclusive(directory: Path, wait_s: float) -> Iterator[bool]:
    turn = os.open(directory / TURN, os.O_RDONLY | os.O_CREAT, 0o644)
    lock = os.open(directory / LOCK, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(turn, fcntl.LOCK_EX)  # new readers wait from here on; those reading now finish first
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.01)
        yield True
    finally:
        os.close(lock)
        os.close(turn)
