"""The recorded schema: one parquet table per channel, and how a bus message becomes rows.

Every file of channel ``C`` lives at ``<root>/C/date=YYYY-MM-DD/hour=HH/part-<first>-<last>.parquet``
(``hour=HH`` is absent with ``partition: day``; a day recorded partly with each setting has both: files directly
under ``date=…`` and hour folders beside them); the partition is the UTC hour (or day) of the envelope timestamp
(when the event was published). Columns common to every channel:

- ``_seq`` (UInt64): the JetStream stream sequence of the message — the recorder's exactly-once key;
- ``_id`` (Utf8): the envelope id; ``_ts`` (Float64): the envelope's publish time; ``_source`` (Utf8).

``traffic`` (one row per served request; the completion is flattened): request_id, ts, model, route, domain,
prompt, messages (JSON text), prompt_ids, text, token_ids, logprobs, versions, finish_reason, temperature,
top_p, max_tokens, stream, generator, latency_s, version (newest weight version among its tokens, -1: none).

``feedback`` (one row per feedback event; repeats are recorded — the joiner applies only the first):
request_id, score (in [0, 1]), label (null when a number was sent), comment, ts, key_id.

``scored`` (one row per scored completion; a group of 8 is 8 rows sharing ``_seq``): task_id, domain, prompt,
prompt_ids, verifier_fields (JSON text), heldout, temperature, origin, generator, generate_s, verify_s,
completion_index, text, token_ids, logprobs, versions, finish_reason, reward, verdict, detail, version (the
newest weight version among the completion's tokens; -1 when it has none).

:func:`channel_dir` is where a channel's files are, :func:`partitions` lists its partition folders oldest first,
:func:`partition_end` says when one is over; ``read_recordings(..., partitions=…)`` reads only those folders — a
reader that wants the newest rows or those of the last hours need not read weeks of files.

Non-goals: schema evolution beyond adding columns (a reader selecting columns that an old file lacks gets
nulls via ``read_recordings``' diagonal concat), other channels (a channel without a schema is refused).
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import polars as pl
from pydantic import BaseModel

from actors.protocol._messages import FeedbackMsg, ScoredMsg, TrafficMsg

__all__ = [
    "CHANNEL_MODELS",
    "channel_dir",
    "frame",
    "one_copy_per_seq",
    "partition_end",
    "partitions",
    "read_recordings",
    "rows_of",
    "schema",
]

_READ_ATTEMPTS = 20  # listings tried when files vanish while read (each vanishing is a merge finishing)

_COMMON: dict[str, pl.DataType] = {"_seq": pl.UInt64(), "_id": pl.Utf8(), "_ts": pl.Float64(), "_source": pl.Utf8()}
_INTS = pl.List(pl.Int64())
_FLOATS = pl.List(pl.Float64())

_SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "traffic": {
        "request_id": pl.Utf8(),
        "ts": pl.Float64(),
        "model": pl.Utf8(),
        "route": pl.Utf8(),
        "domain": pl.Utf8(),
        "prompt": pl.Utf8(),
        "messages": pl.Utf8(),
        "prompt_ids": _INTS,
        "text": pl.Utf8(),
        "token_ids": _INTS,
        "logprobs": _FLOATS,
        "versions": _INTS,
        "finish_reason": pl.Utf8(),
        "temperature": pl.Float64(),
        "top_p": pl.Float64(),
        "max_tokens": pl.Int64(),
        "stream": pl.Boolean(),
        "generator": pl.Utf8(),
        "latency_s": pl.Float64(),
        "version": pl.Int64(),
    },
    "feedback": {
        "request_id": pl.Utf8(),
        "score": pl.Float64(),
        "label": pl.Utf8(),
        "comment": pl.Utf8(),
        "ts": pl.Float64(),
        "key_id": pl.Utf8(),
    },
    "scored": {
        "task_id": pl.Utf8(),
        "domain": pl.Utf8(),
        "prompt": pl.Utf8(),
        "prompt_ids": _INTS,
        "verifier_fields": pl.Utf8(),
        "heldout": pl.Boolean(),
        "temperature": pl.Float64(),
        "origin": pl.Utf8(),
        "generator": pl.Utf8(),
        "generate_s": pl.Float64(),
        "verify_s": pl.Float64(),
        "completion_index": pl.Int64(),
        "text": pl.Utf8(),
        "token_ids": _INTS,
        "logprobs": _FLOATS,
        "versions": _INTS,
        "finish_reason": pl.Utf8(),
        "reward": pl.Float64(),
        "verdict": pl.Utf8(),
        "detail": pl.Utf8(),
        "version": pl.Int64(),
    },
}

CHANNEL_MODELS: dict[str, type[BaseModel]] = {"traffic": TrafficMsg, "feedback": FeedbackMsg, "scored": ScoredMsg}


def schema(channel: str | None = None) -> dict[str, Any]:
    """The polars schema of a channel's files (common columns first); all channels when ``channel`` is None."""
    if channel is None:
        return {name: schema(name) for name in _SCHEMAS}
    if channel not in _SCHEMAS:
        raise ValueError(f"no recorded schema for channel {channel!r} (recorded: {', '.join(sorted(_SCHEMAS))})")
    return {**_COMMON, **_SCHEMAS[channel]}


def rows_of(
    channel: str, payload: BaseModel | Mapping[str, Any], *, seq: int, id: str, ts: float, source: str
) -> list[dict[str, Any]]:
    """The rows one message contributes to ``channel``'s table."""
    common = {"_seq": seq, "_id": id, "_ts": ts, "_source": source}
    if not isinstance(payload, BaseModel):  # validate, so defaults are filled as a consumer would see them
        payload = CHANNEL_MODELS[channel].model_validate(payload)
    data = payload.model_dump(mode="json")
    columns = _SCHEMAS[channel]
    if channel == "traffic":
        completion = data.get("completion") or {}
        row = {**common, **{name: data.get(name) for name in columns}}
        row.update({name: completion.get(name) for name in _COMPLETION_FIELDS})
        row["messages"] = orjson.dumps(data.get("messages") or []).decode()
        row["version"] = max(completion.get("versions") or [-1])
        return [row]
    if channel != "scored":
        return [{**common, **{name: data.get(name) for name in columns}}]
    rows: list[dict[str, Any]] = []
    shared = {name: data.get(name) for name in columns if name not in _PER_COMPLETION}
    shared["verifier_fields"] = orjson.dumps(data.get("verifier_fields") or {}).decode()
    for index, completion in enumerate(data.get("completions") or []):
        row = {**common, **shared, "completion_index": index}
        for name in _PER_COMPLETION - {"completion_index", "version"}:
            row[name] = completion.get(name)
        row["version"] = max(completion.get("versions") or [-1])
        rows.append(row)
    return rows


_COMPLETION_FIELDS = ("text", "token_ids", "logprobs", "versions", "finish_reason")
_PER_COMPLETION = {
    "completion_index",
    "text",
    "token_ids",
    "logprobs",
    "versions",
    "finish_reason",
    "reward",
    "verdict",
    "detail",
    "version",
}


def frame(channel: str, rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=schema(channel), orient="row")


def partitions(directory: Path) -> list[str]:
    """The partition folders under one channel's directory, oldest first (by :func:`partition_end`): each
    ``date=…/hour=…`` folder, and ``date=…`` itself for a day without hour folders or one that holds part files of
    its own beside them — a recorder whose ``partition`` setting changed that day (the spec edited, then
    ``flywheel up --resume``) writes both. Such a day's own files are listed after its hours: they may be as new
    as its end. :func:`read_recordings` reads only a listed folder's own files, never its hour folders'."""
    if not directory.is_dir():
        return []
    found: list[str] = []
    for day in sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith("date=")):
        hours: list[str] = []
        own_files = False
        for entry in day.iterdir():
            if entry.name.startswith("hour=") and entry.is_dir():
                hours.append(entry.name)
            elif entry.name.startswith("part-") and entry.name.endswith(".parquet"):
                own_files = True
        found += [f"{day.name}/{hour}" for hour in sorted(hours)]
        if own_files or not hours:
            found.append(day.name)
    return found


def partition_end(partition: str) -> float | None:
    """The unix time at which ``date=YYYY-MM-DD[/hour=HH]`` is over (UTC); None for a name of another shape."""
    day, _, hour = partition.partition("/")
    try:
        start = calendar.timegm(time.strptime(day.removeprefix("date="), "%Y-%m-%d"))
        if not hour:
            return float(start + 86_400)
        return float(start + 3_600 * (int(hour.removeprefix("hour=")) + 1))
    except ValueError:
        return None


def channel_dir(path: str | Path, channel: str) -> Path:
    """``channel``'s folder under ``path``: a recordings root, or a run dir (its ``recordings`` folder)."""
    root = Path(path)
    if (root / "recordings").is_dir() and not (root / channel).is_dir():
        root = root / "recordings"
    return root / channel


def read_recordings(path: str | Path, channel: str, *, partitions: Sequence[str] | None = None) -> pl.DataFrame:
    """Every recorded row of ``channel`` under ``path`` (a recordings root or a run dir), ordered by ``_seq``;
    ``partitions``: only the rows of those partition folders (names as :func:`partitions` gives them).

    Partial files (hidden ``.part-*`` temporaries) are never read; an empty frame with the schema when
    nothing was recorded. While the recorder merges a closed partition, a message's rows sit in two files for a
    while (the merged one and the original): one copy of each ``_seq`` is returned (``one_copy_per_seq``). A file
    deleted between listing and reading (an original whose merged file has landed) makes the whole read start
    over, so that the merged file is listed.
    """
    directory = channel_dir(path, channel)
    for _attempt in range(_READ_ATTEMPTS):
        if partitions is None:
            files = sorted(directory.rglob("part-*.parquet")) if directory.is_dir() else []
        else:  # a day's own files only, not its hours' (those are partitions of their own)
            folders = [directory / name for name in partitions]
            files = sorted(p for folder in folders if folder.is_dir() for p in folder.glob("part-*.parquet"))
        if not files:
            return pl.DataFrame(schema=schema(channel))
        try:
            frames = [pl.read_parquet(file).with_columns(_file=pl.lit(i, pl.UInt32)) for i, file in enumerate(files)]
        except FileNotFoundError:
            continue
        return one_copy_per_seq(pl.concat(frames, how="diagonal_relaxed")).sort("_seq", maintain_order=True)
    raise FileNotFoundError(f"{directory}: files kept vanishing while read ({_READ_ATTEMPTS} tries)")


def one_copy_per_seq(rows: pl.DataFrame) -> pl.DataFrame:
    """Rows tagged with the ``_file`` they came from, keeping for each ``_seq`` the rows of one file only (a message
    is in two files while the recorder merges its partition); the ``_file`` column is dropped."""
    if rows.height == 0:
        return rows.drop("_file")
    return rows.filter(pl.col("_file") == pl.col("_file").min().over("_seq")).drop("_file")
