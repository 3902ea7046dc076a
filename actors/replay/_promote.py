"""Promotion: moving the ``serving`` key of the weights bucket, pinning what it points at, logging why.

Contract:
- ``decide(candidate, serving, threshold, best=…)`` is the gate's rule: promote when there is no serving version
  yet (the first version is promoted unconditionally) or when, on the same replayed samples, the candidate's mean
  reward is ≥ the serving version's − ``threshold`` *and* ≥ the best served version's − ``threshold`` (``best``:
  the gate's champion, so a chain of versions each a little worse than the last cannot ratchet what users get
  down: every promoted version is within ``threshold`` of the best one served so far); with fewer than
  ``min_samples`` scored samples the candidate is *held* (``without_evidence: hold``) or promoted (``promote``).
- ``hold(…)`` gives the gate its own copy of a candidate (``gate-vN``: hard links on disk, a copy in the object
  store, a directory written from a shared-memory slot) before it reads it, so the learner's stores pruning (or
  rewriting) ``vN`` cannot pull it from under an evaluation; ``release(…)`` drops that copy. A version pruned
  before it could be held raises ``WeightPayloadError``.
- ``promote(…)`` pins the version's payload under a name the learner's stores never prune
  (``serving-vN``: a copy in the object store, or ``<run_dir>/weights/serving-vN`` for disk and shm), points
  ``serving`` at the pinned manifest (serving generators swap to it) and appends the decision to
  ``<run_dir>/gate/decisions.jsonl``. The newest ``KEEP_PINNED`` pinned versions, and those in ``keep`` (the
  gate's best), are kept for rollback.
- ``rollback(…)`` points ``serving`` back at the version that served before the current one (from the
  decisions log) and logs that too. Every record carries the manifest, so a log line is enough to restore it.
- An operator's move pauses the gate (``pause=True``: the entry carries ``"gate": "paused"``), as does
  ``pause_gate``; ``resume_gate`` ends the pause. While paused the gate promotes nothing and rolls nothing back, so
  what an operator chose keeps serving (the gate decided every second or so: a newer version that passed replay
  replaced a rollback within seconds). The log holds the state (`DecisionLog.paused`): a restarted gate, or a
  resumed run, is paused as it was.

Non-goals: distributed agreement between several gates (run one), broadcast-transported versions (nothing
to pin: they are refused with a clear message).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import orjson
from safetensors.torch import save_file

from actors.protocol import SERVING, weights_bucket
from actors.weights import SharedMemoryTransport, WeightManifest, WeightPayloadError, shm_root
from actors.weights._transports import link_or_copy
from topology.bus import Bus, BusError

__all__ = [
    "Decision",
    "DecisionLog",
    "decide",
    "decisions_path",
    "hold",
    "pause_gate",
    "promote",
    "read_decisions",
    "record",
    "release",
    "resume_gate",
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
    best: float | None = None,
    best_version: int | None = None,
) -> Decision:
    if not has_serving:
        return Decision("promote", "first version: promoted unconditionally")
    if samples < min_samples or candidate is None or serving is None:
        action: Literal["promote", "hold"] = "promote" if without_evidence == "promote" else "hold"
        if samples < min_samples:
            return Decision(action, f"{samples} scored samples < min_samples {min_samples}")
        return Decision(action, f"none of {samples} replayed samples scored (the verifier failed on every one)")
    if candidate < serving - threshold:
        return Decision("reject", f"mean reward {candidate:.4f} < serving {serving:.4f} - {threshold}")
    if best is not None and candidate < best - threshold:
        which = f"v{best_version}" if best_version is not None else "version"
        return Decision("reject", f"mean reward {candidate:.4f} < best served {which} {best:.4f} - {threshold}")
    against = f" and best served {best:.4f}" if best is not None else ""
    return Decision("promote", f"mean reward {candidate:.4f} >= serving {serving:.4f}{against} - {threshold}")


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
    """Every entry of the run's decisions log (a line cut short by a crash left out)."""
    return DecisionLog(run_dir).update()


class DecisionLog:
    """What the gate keeps of ``decisions.jsonl``: the entries that moved ``serving`` and the newest ``best_version``,
    read once, then from the lines appended since (by the gate, or by ``flywheel promote`` / ``rollback`` in another
    process). A service appends a line per version it decides on; reading the whole file at every check took
    seconds after a day of them."""

    def __init__(self, run_dir: Path) -> None:
        self.path = decisions_path(run_dir)
        self.serving: list[dict[str, Any]] = []
        self.best_version: int | None = None
        self.paused: dict[str, Any] | None = None  # the entry that paused the gate, until one resumes it
        self._offset = 0
        self._inode = -1
        self._rest = b""  # a line not finished yet (a writer between its bytes and its newline)

    def update(self) -> list[dict[str, Any]]:
        """Take the lines appended since the last update; returns them (every entry, at the first update, and after
        the file was replaced or cut short: rotated by its owner, say)."""
        try:
            with open(self.path, "rb") as log:
                info = os.fstat(log.fileno())
                if info.st_ino != self._inode or info.st_size < self._offset:  # another file: read it whole
                    self.serving, self.best_version, self._offset, self._rest = [], None, 0, b""
                    self.paused = None
                    self._inode = info.st_ino
                log.seek(self._offset)
                data = log.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._rest = (self._rest + data).split(b"\n")
        entries = []
        for line in lines:
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a line cut short by a crash
            entries.append(entry)
            if entry.get("serving") and "version" in entry:
                self.serving.append(entry)
            if entry.get("best_version") is not None:
                self.best_version = int(entry["best_version"])
            if entry.get("gate") == "paused":
                self.paused = entry
            elif entry.get("action") == "resume":
                self.paused = None
        return entries


async def serving_manifest(bus: Bus) -> WeightManifest | None:
    raw = await bus.kv_get(weights_bucket(bus.topology), SERVING)
    return WeightManifest.from_json(raw) if raw else None


async def _copy(bus: Bus, run_dir: Path, manifest: WeightManifest, name: str) -> WeightManifest:
    """``manifest``'s payload under ``name`` (disk: ``<run_dir>/weights/<name>``, hard links where possible);
    ``WeightPayloadError`` when it is gone (a pinned copy unpinned since, a slot rewritten, a version pruned)."""
    if manifest.location.endswith(name):  # the copy itself: still there?
        if manifest.transport == "object-store":
            try:
                await bus.object_info(weights_bucket(bus.topology), manifest.location)
            except BusError as exc:
                raise WeightPayloadError(f"v{manifest.version}: its copy {name} is gone ({exc})") from None
        elif not (Path(manifest.location) / "model.safetensors").is_file():
            raise WeightPayloadError(
                f"v{manifest.version}: its copy {manifest.location} is gone (the newest {KEEP_PINNED} promoted "
                "versions and the gate's best are kept)"
            )
        return manifest
    if manifest.transport == "object-store":
        bucket = weights_bucket(bus.topology)
        try:
            blob = await bus.object_get(bucket, manifest.location, expect_digest=manifest.digest or None)
        except BusError as exc:
            raise WeightPayloadError(f"v{manifest.version}: {exc}") from exc
        await bus.object_put(bucket, name, blob)
        location = name
    elif manifest.transport == "disk":
        final = run_dir / "weights" / name
        if not final.is_dir():
            partial = run_dir / "weights" / f".{name}.partial-{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            try:
                shutil.copytree(manifest.location, partial, copy_function=link_or_copy)
            except (OSError, shutil.Error) as exc:  # pruned before (or while) it was copied
                shutil.rmtree(partial, ignore_errors=True)
                raise WeightPayloadError(f"v{manifest.version}: cannot copy {manifest.location}: {exc}") from exc
            os.rename(partial, final)
        location = str(final)
    elif manifest.transport == "shm":  # a slot is rewritten soon: the copy is a directory (served through disk)
        final = run_dir / "weights" / name
        if not final.is_dir():
            state = await SharedMemoryTransport(shm_root(run_dir)).get(manifest)
            await anyio.to_thread.run_sync(_write_dir, run_dir / "weights", final, state, manifest.version)
        return WeightManifest(
            manifest.version, "disk", str(final), manifest.tensors, manifest.nbytes, "", manifest.published_at
        )
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


def _write_dir(parent: Path, final: Path, state: dict[str, Any], version: int) -> None:
    partial = parent / f".{final.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_file(state, str(partial / "model.safetensors"), metadata={"format": "pt", "version": str(version)})
    os.rename(partial, final)


async def _pin(bus: Bus, run_dir: Path, manifest: WeightManifest) -> WeightManifest:
    return await _copy(bus, run_dir, manifest, f"serving-v{manifest.version}")


async def hold(bus: Bus, run_dir: Path, manifest: WeightManifest) -> WeightManifest:
    """The gate's own copy of ``manifest`` (``gate-vN``); ``WeightPayloadError`` when it was pruned already."""
    return await _copy(bus, run_dir, manifest, f"gate-v{manifest.version}")


async def release(bus: Bus, run_dir: Path, held: WeightManifest) -> None:
    """Drop a copy made by :func:`hold` (nothing else)."""
    name = f"gate-v{held.version}"
    if not held.location.endswith(name):
        return
    shutil.rmtree(run_dir / "weights" / name, ignore_errors=True)
    if held.transport == "object-store":
        try:
            await bus.object_delete(weights_bucket(bus.topology), name)
        except Exception:  # best effort: a leftover copy is harmless
            pass


async def _unpin_old(bus: Bus, run_dir: Path, keep: set[int], log: DecisionLog | None = None) -> None:
    if log is None:
        log = DecisionLog(run_dir)
    log.update()
    pinned = sorted({int(e["version"]) for e in log.serving})
    if log.best_version is not None:  # the gate's champion, whoever promotes: what no later version may fall below
        keep = {*keep, log.best_version}
    for version in pinned:
        if version in keep or version in pinned[-KEEP_PINNED:]:
            continue
        shutil.rmtree(run_dir / "weights" / f"serving-v{version}", ignore_errors=True)
        try:
            await bus.object_delete(weights_bucket(bus.topology), f"serving-v{version}")
        except Exception:
            pass


async def promote(
    bus: Bus,
    run_dir: Path,
    manifest: WeightManifest,
    *,
    by: str,
    reason: str,
    figures: dict[str, Any] | None = None,
    keep: Iterable[int] = (),
    log: DecisionLog | None = None,
    pause: bool = False,
) -> dict[str, Any]:
    """Pin ``manifest``, point ``serving`` at it, log the decision; returns the log entry. Pinned versions in
    ``keep`` are never unpinned here. ``log``: a caller's :class:`DecisionLog` of the run (else the file is read).
    ``pause``: the gate promotes nothing over it until :func:`resume_gate` (an operator's move)."""
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
            **({"gate": "paused"} if pause else {}),
        },
    )
    await _unpin_old(bus, run_dir, {manifest.version, *keep} | ({previous.version} if previous else set()), log)
    return entry


async def rollback(
    bus: Bus,
    run_dir: Path,
    *,
    by: str,
    reason: str | None = None,
    figures: dict[str, Any] | None = None,
    log: DecisionLog | None = None,
    pause: bool = False,
) -> dict[str, Any]:
    """Point ``serving`` at the version that served before the current one, going past those whose copies were pruned
    since (the decision's reason names them); ValueError when there is none, or none is kept (naming the gate's best,
    which is). ``log`` and ``pause``: as for :func:`promote`."""
    current = await serving_manifest(bus)
    if current is None:
        raise ValueError("nothing is serving yet: there is no version to roll back from")
    if log is None:
        log = DecisionLog(run_dir)
    log.update()
    history = [e for e in log.serving if "manifest" in e]
    stack = [e for e in _served_stack(history) if int(e["version"]) != current.version]
    if not stack:
        raise ValueError(f"no earlier serving version than v{current.version} in {decisions_path(run_dir)}")
    gone: list[str] = []  # earlier versions whose copies were pruned since: the rollback goes past them
    for earlier in reversed(stack):
        try:
            target = await _pin(bus, run_dir, WeightManifest.from_json(orjson.dumps(earlier["manifest"])))
            break
        except WeightPayloadError:
            gone.append(f"v{earlier['version']}")
    else:
        best = log.best_version  # kept whoever promotes (see _unpin_old)
        hint = f"; the gate's best is kept: flywheel promote v{best}" if best not in (None, current.version) else ""
        raise ValueError(f"no earlier serving version is kept any more ({', '.join(gone)} pruned){hint}")
    if gone:
        reason = reason or f"rolled back from v{current.version}, past {', '.join(gone)} (pruned)"
    await bus.kv_put(weights_bucket(bus.topology), SERVING, target.to_json())
    return record(
        run_dir,
        {
            "action": "rollback",
            "version": target.version,
            "by": by,
            "serving": True,
            "reason": reason or f"rolled back from v{current.version}",
            "previous": current.version,
            "manifest": orjson.loads(target.to_json()),
            **(figures or {}),
            **({"gate": "paused"} if pause else {}),
        },
    )


def _served_stack(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The serving history read as a stack: a promotion pushes its version, a rollback pops back to the one it
    restored. So a second rollback goes further back instead of returning to the version the first one rolled back
    from."""
    stack: list[dict[str, Any]] = []
    for entry in history:
        version = int(entry["version"])
        below = [int(e["version"]) for e in stack[:-1]]
        if entry.get("action") == "rollback" and version in below:  # back down to it (else: like a promotion)
            del stack[len(below) - below[::-1].index(version) :]
            stack[-1] = entry  # its newest manifest
            continue
        if stack and int(stack[-1]["version"]) == version:
            stack[-1] = entry
            continue
        stack.append(entry)
    return stack


def pause_gate(run_dir: Path, *, by: str, reason: str) -> dict[str, Any]:
    """Pause the gate without moving ``serving`` (see the module docstring); returns the log entry."""
    return record(run_dir, {"action": "pause", "by": by, "reason": reason, "gate": "paused"})


def resume_gate(run_dir: Path, *, by: str) -> dict[str, Any] | None:
    """End the gate's pause (it decides again from the next version the learner publishes); returns the log entry,
    or None when it was not paused."""
    log = DecisionLog(run_dir)
    log.update()
    if log.paused is None:
        return None
    paused = log.paused
    what = f"{paused['action']} v{paused['version']}" if "version" in paused else str(paused["action"])
    return record(run_dir, {"action": "resume", "by": by, "reason": f"ends the pause of {what} by {paused['by']}"})
