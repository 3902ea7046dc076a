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

``RecordingsTail`` reads the same files incrementally (each refresh opens only files it has not read: the
recorder writes a file once and renames it into place), for a reader that looks again and again — the gate.

Non-goals: filtering by anything but age and count; de-duplicating identical prompts (each recorded
sample is one replayed sample, so the figures weigh prompts as production did).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
import polars as pl

from actors.protocol import read_recordings, schema

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
    (``scored``) or both; ``limit`` counts the chosen ones only."""
    items: list[ReplayItem] = []
    if source != "traffic":
        items += items_from_scored(read_recordings(recordings, "scored"))
    if source != "scored":
        items += items_from_traffic(read_recordings(recordings, "traffic"), read_recordings(recordings, "feedback"))
    if since_s is not None:
        horizon = (time.time() if now is None else now) - since_s
        items = [item for item in items if item.ts >= horizon]
    items.sort(key=lambda item: (item.ts, item.key))
    if limit is not None:
        items = items[-limit:] if limit > 0 else []
    return items


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
    """Items of recorded ``traffic`` rows (the first row of each request id), with the first feedback score in
    ``feedback`` as the recorded reward."""
    if traffic.height == 0:
        return []
    first_score: dict[str, float] = {}
    for row in feedback.sort("_seq").iter_rows(named=True):
        if row["score"] is not None:
            first_score.setdefault(row["request_id"], float(row["score"]))
    out: list[ReplayItem] = []
    seen: set[str] = set()
    for row in traffic.iter_rows(named=True):
        rid = row["request_id"]
        if rid in seen:
            continue
        seen.add(rid)
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
    """One channel's recorded rows, read incrementally: :meth:`new_rows` returns the rows of the files written
    since the last call (oldest file first; ``_seq`` order within and across files of one partition)."""

    def __init__(self, recordings: str | Path, channel: str) -> None:
        root = Path(recordings)
        if (root / "recordings").is_dir() and not (root / channel).is_dir():
            root = root / "recordings"
        self.folder = root / channel
        self.channel = channel
        self._read: set[Path] = set()

    def new_rows(self) -> pl.DataFrame:
        files = (
            sorted(p for p in self.folder.rglob("part-*.parquet") if p not in self._read)
            if self.folder.is_dir()
            else []
        )
        frames = []
        for path in files:
            try:
                frames.append(pl.read_parquet(path))
            except OSError:  # removed meanwhile: nothing to read
                continue
            self._read.add(path)
        if not frames:
            return pl.DataFrame(schema=schema(self.channel))
        return pl.concat(frames, how="diagonal_relaxed").sort("_seq", maintain_order=True)
