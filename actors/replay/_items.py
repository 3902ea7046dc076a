"""What replay re-issues: recorded prompts with their recorded outcome, read from the recorder's parquet files.

Sources:
- ``scored`` rows of origin ``domain`` (one per completion): prompt ids, domain, verifier fields, temperature
  and the verifier's recorded reward/verdict — these can be re-scored by the domain verifier;
- ``traffic`` rows (one per served request): prompt ids, domain (if the request named one), temperature, the
  served text, what the user asked (``asked``: a chat request's last user message, else the prompt) and — when
  feedback was recorded for it — the first feedback score as the recorded reward. They carry no verifier fields:
  the replayer finds them by the domain's task of that prompt (``DomainSource.find``); without one they are
  compared by text only.

Scored rows of origin ``feedback``/``review`` are skipped: they are traffic already counted once.

``RecordingsTail`` reads the same files incrementally, for a reader that looks again and again — the gate; it copes
with the recorder merging the files of closed partitions and deleting expired ones (see its docstring).

Non-goals: filtering by anything but age and count; de-duplicating identical prompts (each recorded
sample is one replayed sample, so the figures weigh prompts as production did).
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
import polars as pl

from actors.protocol import channel_dir, one_copy_per_seq, partition_end, partitions, read_recordings, schema

__all__ = ["RecordingsTail", "ReplayItem", "items_from_scored", "items_from_traffic", "load_items"]


@dataclass(frozen=True)
class ReplayItem:
    key: str  # unique per recorded sample: request id, or "<task id>.<completion index>"
    source: str  # "scored" | "traffic"
    domain: str  # "" when the request named none
    prompt: str
    prompt_ids: tuple[int, ...]
    temperature: float
    verifier_fields: dict[str, Any] = field(default_factory=dict)
    recorded_text: str = ""
    recorded_reward: float | None = None
    recorded_verdict: str = ""
    recorded_version: int = -1
    ts: float = 0.0
    asked: str = ""  # traffic: what the user typed (a chat request's last user message), else the prompt


def load_items(
    recordings: str | Path,
    *,
    limit: int | None = None,
    since_s: float | None = None,
    now: float | None = None,
    source: Literal["traffic", "scored", "both"] = "both",
) -> list[ReplayItem]:
    """Recorded samples under ``recordings``, oldest first; the newest ``limit`` of those younger than
    ``since_s`` seconds when given. ``source``: users' requests (``traffic``), the task domains' samples
    (``scored``) or both; ``limit`` counts the chosen ones only.

    Only the partitions that can hold them are read: with ``since_s``, none over before the horizon; with ``limit``,
    each channel's newest partitions until they hold ``limit`` samples (a partition is an hour or a day of one
    channel, and ``scored`` keeps a week of every training sample by default: reading it all for the newest few
    hundred would take minutes and gigabytes). Feedback is read from the partitions not over before the oldest
    request read (feedback comes after the answer it rates)."""
    horizon = None if since_s is None else (time.time() if now is None else now) - since_s
    items: list[ReplayItem] = []
    if source != "traffic":
        items += items_from_scored(_newest_rows(recordings, "scored", horizon, limit, _domain_rows))
    if source != "scored":
        traffic = _newest_rows(recordings, "traffic", horizon, limit, _requests)
        if traffic.height:
            oldest = float(traffic["_ts"].min())  # type: ignore[arg-type]
            later = [  # feedback comes after the answer it rates: none in a partition over before the oldest read
                name
                for name in partitions(channel_dir(recordings, "feedback"))
                if (partition_end(name) or math.inf) > oldest
            ]
            items += items_from_traffic(traffic, read_recordings(recordings, "feedback", partitions=later))
    if horizon is not None:
        items = [item for item in items if item.ts >= horizon]
    items.sort(key=lambda item: (item.ts, item.key))
    if limit is not None:
        items = items[-limit:] if limit > 0 else []
    return items


def _domain_rows(frame: pl.DataFrame) -> int:
    return frame.filter(pl.col("origin") == "domain").height


def _requests(frame: pl.DataFrame) -> int:
    return frame["request_id"].n_unique()


def _newest_rows(
    recordings: str | Path, channel: str, horizon: float | None, limit: int | None, count: Callable[[pl.DataFrame], int]
) -> pl.DataFrame:
    """``channel``'s rows (``_seq`` order) in the partitions not over before ``horizon``; with ``limit``, only those
    of the newest partitions, read newest first until ``count`` of the rows newer than every partition not read
    reaches it (a day's own files end with the day, so rows read there count once the partitions left are older;
    ``count`` sees all those rows at once, so a request recorded in two partitions is counted once)."""
    names = partitions(channel_dir(recordings, channel))  # ordered by their ends
    if horizon is not None:
        names = [name for name in names if (partition_end(name) or math.inf) > horizon]
    if limit is None:
        return read_recordings(recordings, channel, partitions=names)
    if limit <= 0:
        return pl.DataFrame(schema=schema(channel))
    ceiling = [-math.inf]  # ceiling[i]: no row of names[:i] is as new as this
    for name in names:
        ceiling.append(max(ceiling[-1], partition_end(name) or math.inf))
    frames: list[pl.DataFrame] = []
    for i in reversed(range(len(names))):
        frames.append(read_recordings(recordings, channel, partitions=[names[i]]))
        newer = pl.concat([frame.filter(pl.col("_ts") >= ceiling[i]) for frame in frames], how="diagonal_relaxed")
        if newer.height and count(newer) >= limit:  # counted together: a request in two partitions is one
            break
    if not frames:
        return pl.DataFrame(schema=schema(channel))
    return pl.concat(frames, how="diagonal_relaxed").sort("_seq", maintain_order=True)


def items_from_scored(frame: pl.DataFrame) -> list[ReplayItem]:
    """Items of recorded ``scored`` rows (origin ``domain`` only), in the frame's order."""
    if frame.height == 0:
        return []
    frame = frame.filter(pl.col("origin") == "domain")
    out: list[ReplayItem] = []
    for row in frame.iter_rows(named=True):
        out.append(
            ReplayItem(
                key=f"{row['task_id']}.{row['_seq']}.{row['completion_index']}",
                source="scored",
                domain=row["domain"] or "",
                prompt=row["prompt"] or "",
                prompt_ids=tuple(row["prompt_ids"] or ()),
                temperature=float(row["temperature"] or 0.0),
                verifier_fields=orjson.loads(row["verifier_fields"] or "{}"),
                recorded_text=row["text"] or "",
                recorded_reward=row["reward"],
                recorded_verdict=row["verdict"] or "",
                recorded_version=int(row["version"] if row["version"] is not None else -1),
                ts=float(row["_ts"]),
            )
        )
    return out


def items_from_traffic(traffic: pl.DataFrame, feedback: pl.DataFrame) -> list[ReplayItem]:
    """Items of recorded ``traffic`` rows, one per request id (in the order of its first row), with the first
    feedback score in ``feedback`` as the recorded reward. A request recorded twice (published again once the
    bus's dedupe window was over) is taken from its newest row: a reader of the newest partitions only, which
    holds some copy of a request newer than what it left unread, holds that row too."""
    if traffic.height == 0:
        return []
    first_score: dict[str, float] = {}
    for row in feedback.sort("_seq").iter_rows(named=True):
        if row["score"] is not None:
            first_score.setdefault(row["request_id"], float(row["score"]))
    newest: dict[str, dict[str, Any]] = {}
    for row in traffic.iter_rows(named=True):
        kept = newest.get(row["request_id"])
        if kept is None or (row["_ts"], row["_seq"]) > (kept["_ts"], kept["_seq"]):
            newest[row["request_id"]] = row
    out: list[ReplayItem] = []
    for rid, row in newest.items():
        out.append(
            ReplayItem(
                key=rid,
                source="traffic",
                domain=row["domain"] or "",
                prompt=row["prompt"] or "",
                prompt_ids=tuple(row["prompt_ids"] or ()),
                temperature=float(row["temperature"] or 0.0),
                recorded_text=row["text"] or "",
                recorded_reward=first_score.get(rid),
                recorded_verdict="feedback" if rid in first_score else "",
                recorded_version=int(row["version"] if row["version"] is not None else -1),
                ts=float(row["_ts"]),
                asked=_asked(row["messages"], row["prompt"] or ""),
            )
        )
    return out


def _asked(messages: str | None, prompt: str) -> str:
    try:
        parsed = orjson.loads(messages or "[]")
    except orjson.JSONDecodeError:
        return prompt
    users = [m.get("content") for m in parsed if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1]) if users and isinstance(users[-1], str) else prompt


class RecordingsTail:
    """One channel's recorded rows, read incrementally: :meth:`new_rows` returns the rows recorded since the last
    call, each once (``_seq`` order within one call).

    What it remembers stays small over weeks of recordings: the sequences it has returned, as ranges (a channel's
    sequences are nearly contiguous, so a handful), and per partition folder its modification time and the names
    of the files read there. A refresh lists only the folders that changed since the last look (a file written,
    merged or deleted in a folder changes its time) or changed too recently to be sure of; it reads only files it
    has not read and keeps only rows whose sequence it has not returned — so a merged file replacing files
    already read yields nothing twice, and rows it holds that were never read are returned. The names of a
    folder's files are forgotten once the folder has settled (unchanged since the last look, and not recent):
    when it changes again, files are told apart by whether their sequence range is already returned."""

    def __init__(self, recordings: str | Path, channel: str) -> None:
        self.folder = channel_dir(recordings, channel)
        self.channel = channel
        self.returned = SeqRanges()
        self._seen: dict[Path, int] = {}  # folder -> mtime_ns at the last look
        self._names: dict[Path, set[str]] = {}  # folder -> files read there, while the folder is unsettled
        self.files_listed = 0  # statistics: files listed, files opened, over the tail's life
        self.files_read = 0

    def new_rows(self) -> pl.DataFrame:
        frames: list[pl.DataFrame] = []
        now_ns = time.time_ns()
        for folder in self._changed_folders(now_ns):
            frames += self._read_folder(folder)
        if not frames:
            return pl.DataFrame(schema=schema(self.channel))
        tagged = [frame.with_columns(_file=pl.lit(i, pl.UInt32)) for i, frame in enumerate(frames)]
        rows = one_copy_per_seq(pl.concat(tagged, how="diagonal_relaxed"))
        rows = rows.filter(~self.returned.contains(rows["_seq"]))
        self.returned.add(rows["_seq"])
        return rows.sort("_seq", maintain_order=True)

    def _changed_folders(self, now_ns: int) -> list[Path]:
        """Partition folders (the files' parents) whose contents may differ from the last look."""
        changed: list[Path] = []
        present: set[Path] = set()
        for folder in self._folders():
            present.add(folder)
            try:
                mtime = folder.stat().st_mtime_ns
            except FileNotFoundError:
                continue
            racy = now_ns - mtime < _RACY_NS  # changed so lately that another change may share its time stamp
            if racy or self._seen.get(folder) != mtime:
                changed.append(folder)
            elif folder in self._names:
                del self._names[folder]  # settled: what it holds is returned
            self._seen[folder] = mtime
        for gone in [f for f in self._seen if f not in present]:  # expired partitions
            del self._seen[gone]
            self._names.pop(gone, None)
        return changed

    def _folders(self) -> list[Path]:
        return [self.folder / name for name in partitions(self.folder)]

    def _read_folder(self, folder: Path) -> list[pl.DataFrame]:
        names = self._names.setdefault(folder, set())
        frames: list[pl.DataFrame] = []
        for _attempt in range(_READ_ATTEMPTS):
            try:
                listed = sorted(p for p in folder.iterdir() if p.name.startswith("part-") and p.suffix == ".parquet")
            except FileNotFoundError:  # the partition expired
                return frames
            self.files_listed += len(listed)
            vanished = False
            for path in listed:
                bounds = _range_of(path.name)
                if path.name in names or (bounds is not None and self.returned.covers(*bounds)):
                    names.add(path.name)
                    continue
                try:
                    frames.append(pl.read_parquet(path))
                except FileNotFoundError:  # an original whose merged file has landed: list again
                    vanished = True
                    continue
                self.files_read += 1
                names.add(path.name)
            if not vanished:
                return frames
        return frames


_RACY_NS = 2_000_000_000  # a folder changed this lately is listed again on the next look
_READ_ATTEMPTS = 5


def _range_of(name: str) -> tuple[int, int] | None:
    first, sep, last = name.removeprefix("part-").removesuffix(".parquet").partition("-")
    return (int(first), int(last)) if sep and first.isdigit() and last.isdigit() else None


class SeqRanges:
    """A set of sequences kept as sorted, disjoint, inclusive ranges."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def __len__(self) -> int:
        return len(self.starts)

    def add(self, seqs: pl.Series) -> None:
        values = sorted({int(v) for v in seqs.to_list()})
        if not values:
            return
        runs: list[tuple[int, int]] = []
        for value in values:
            if runs and value == runs[-1][1] + 1:
                runs[-1] = (runs[-1][0], value)
            else:
                runs.append((value, value))
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted([*zip(self.starts, self.ends, strict=True), *runs]):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        self.starts = [lo for lo, _hi in merged]
        self.ends = [hi for _lo, hi in merged]

    def covers(self, first: int, last: int) -> bool:
        """Whether every sequence from ``first`` to ``last`` is in the set."""
        i = bisect.bisect_right(self.starts, first) - 1
        return i >= 0 and self.ends[i] >= last

    def contains(self, seqs: pl.Series) -> pl.Series:
        """A boolean series: which of ``seqs`` are in the set."""
        out = [
            (i := bisect.bisect_right(self.starts, int(v)) - 1) >= 0 and self.ends[i] >= int(v) for v in seqs.to_list()
        ]
        return pl.Series(out, dtype=pl.Boolean)
