"""Promotion: moving the ``serving`` key of the weights bucket, pinning what it points at, logging why.

Contract:
- ``decide(candidate, serving, threshold, …)`` is the gate's rule: promote when there is no serving version
  yet (the first version is promoted unconditionally) or when candidate mean reward ≥ serving − threshold
  on the same replayed samples; with fewer than ``min_samples`` scored samples the candidate is *held*
  (``without_evidence: hold``) or promoted (``promote``).
- ``promote(…)`` pins the version's payload under a name the learner's stores never prune
  (``serving-vN``: a copy in the object store, or ``<run_dir>/weights/serving-vN`` for disk), points
  ``serving`` at the pinned manifest (serving generators swap to it) and appends the decision to
  ``<run_dir>/gate/decisions.jsonl``. The newest ``keep_pinned`` pinned versions are kept for rollback.
- ``rollback(…)`` points ``serving`` back at the version that served before the current one (from the
  decisions log) and logs that too. Every record carries the manifest, so a log line is enough to restore it.

Non-goals: distributed agreement between several gates (run one), broadcast-transported versions (nothing
to pin: they are refused with a clear message).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from actors.protocol import SERVING, weights_bucket
from actors.weights import WeightManifest
from topology.bus import Bus

__all__ = [
    "Decision",
    "decide",
    "decisions_path",
    "promote",
    "read_decisions",
    "record",
    "rollback",
    "serving_manifest",
]

KEEP_PINNED = 4


@dataclass(frozen=True)
class Decision:
    action: Literal["promote", "reject", "hold"]
    reason: str


def decide(
    candidate: float | None,
    serving: float | None,
    *,
    has_serving: bool,
    threshold: float,
    samples: int,
    min_samples: int,
    without_evidence: Literal["hold", "promote"] = "hold",
) -> Decision:
    if not has_serving:
        return Decision("promote", "first version: promoted unconditionally")
    if samples < min_samples or candidate is None or serving is None:
        action: Literal["promote", "hold"] = "promote" if without_evidence == "promote" else "hold"
        return Decision(action, f"{samples} scored samples < min_samples {min_samples}")
    if candidate >= serving - threshold:
        return Decision("promote", f"mean reward {candidate:.4f} >= serving {serving:.4f} - {threshold}")
    return Decision("reject", f"mean reward {candidate:.4f} < serving {serving:.4f} - {threshold}")


def decisions_path(run_dir: Path) -> Path:
    return run_dir / "gate" / "decisions.jsonl"


def record(run_dir: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """Append one decision (one JSON line, fsynced) and return it with its timestamp."""
    path = decisions_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"ts": time.time(), **entry}
    with open(path, "ab") as out:
        out.write(orjson.dumps(entry) + b"\n")
        out.flush()
        os.fsync(out.fileno())
    return entry


def read_decisions(run_dir: Path) -> list[dict[str, Any]]:
    path = decisions_path(run_dir)
    if not path.is_file():
        return []
    entries = []
    for line in path.read_bytes().splitlines():
        try:
            entries.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue  # a line cut short by a crash
    return entries


async def serving_manifest(bus: Bus) -> WeightManifest | None:
    raw = await bus.kv_get(weights_bucket(bus.topology), SERVING)
    return WeightManifest.from_json(raw) if raw else None


async def _pin(bus: Bus, run_dir: Path, manifest: WeightManifest) -> WeightManifest:
    name = f"serving-v{manifest.version}"
    if manifest.location.endswith(name):
        return manifest
    if manifest.transport == "object-store":
        bucket = weights_bucket(bus.topology)
        await bus.object_put(bucket, name, await bus.object_get(bucket, manifest.location))
        location = name
    elif manifest.transport == "disk":
        final = run_dir / "weights" / name
        if not final.is_dir():
            partial = run_dir / "weights" / f".{name}.partial-{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(manifest.location, partial)
            os.rename(partial, final)
        location = str(final)
    else:
        raise ValueError(f"cannot pin v{manifest.version}: transport {manifest.transport!r} keeps no copy")
    return WeightManifest(
        manifest.version,
        manifest.transport,
        location,
        manifest.tensors,
        manifest.nbytes,
        manifest.digest,
        manifest.published_at,
    )


async def _unpin_old(bus: Bus, run_dir: Path, keep: set[int]) -> None:
    pinned = sorted({int(e["version"]) for e in read_decisions(run_dir) if e.get("serving") and "version" in e})
    for version in pinned:
        if version in keep or version in pinned[-KEEP_PINNED:]:
            continue
        shutil.rmtree(run_dir / "weights" / f"serving-v{version}", ignore_errors=True)
        try:
            await bus.object_delete(weights_bucket(bus.topology), f"serving-v{version}")
        except Exception:
            pass


async def promote(
    bus: Bus, run_dir: Path, manifest: WeightManifest, *, by: str, reason: str, figures: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Pin ``manifest``, point ``serving`` at it, log the decision; returns the log entry."""
    previous = await serving_manifest(bus)
    pinned = await _pin(bus, run_dir, manifest)
    await bus.kv_put(weights_bucket(bus.topology), SERVING, pinned.to_json())
    entry = record(
        run_dir,
        {
            "action": "promote",
            "version": manifest.version,
            "by": by,
            "reason": reason,
            "serving": True,
            "previous": previous.version if previous is not None else None,
            "manifest": orjson.loads(pinned.to_json()),
            **(figures or {}),
        },
    )
    await _unpin_old(bus, run_dir, keep={manifest.version} | ({previous.version} if previous else set()))
    return entry


async def rollback(bus: Bus, run_dir: Path, *, by: str) -> dict[str, Any]:
    """Point ``serving`` at the version that served before the current one; ValueError when there is none."""
    current = await serving_manifest(bus)
    if current is None:
        raise ValueError("nothing is serving yet: there is no version to roll back from")
    history = [e for e in read_decisions(run_dir) if e.get("serving") and "manifest" in e]
    earlier = [e for e in history if int(e["version"]) != current.version]
    chain = [int(e["version"]) for e in history]
    if current.version in chain:  # the one that served before the current version's latest promotion
        last = len(chain) - 1 - chain[::-1].index(current.version)
        earlier = [e for e in history[:last] if int(e["version"]) != current.version]
    if not earlier:
        raise ValueError(f"no earlier serving version than v{current.version} in {decisions_path(run_dir)}")
    target = WeightManifest.from_json(orjson.dumps(earlier[-1]["manifest"]))
    await bus.kv_put(weights_bucket(bus.topology), SERVING, target.to_json())
    return record(
        run_dir,
        {
            "action": "rollback",
            "version": target.version,
            "by": by,
            "serving": True,
            "reason": f"rolled back from v{current.version}",
            "previous": current.version,
            "manifest": orjson.loads(target.to_json()),
        },
    )
