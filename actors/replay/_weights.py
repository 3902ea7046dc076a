"""Which weights a replay runs: a version of a run (by number) or a checkpoint (a safetensors file or dir).

``resolve_weights(ref, run_dir=…, bus=…)``:
- ``initial`` / ``v0`` / ``0``: the policy exactly as the spec builds it (its checkpoint, or fresh init);
- ``vN`` / ``N``: version N of the run — a pinned serving copy (``<run_dir>/weights/serving-vN``), the disk
  transport's ``<run_dir>/weights/vN``, a shared-memory slot of the run still holding it, else (with a bus) the
  object store's ``serving-vN`` / ``vN``;
- ``current`` / ``serving`` (a live run: with a bus): the version the learner published last / the one users are
  served, read from the weights bucket at the moment of the call (a small model's learner publishes several a
  second and keeps only a few: a number read from ``flywheel status`` is often gone by the time it is asked for);
- anything else: a path to a ``.safetensors`` file or a directory of them.

Errors are one-line ``WeightsNotFound`` naming every place that was searched and the versions the run's
``weights/`` folder still holds.

Non-goals: downloading from hubs; versions the learner's stores already pruned (only pinned serving
versions are kept for good).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import anyio
import torch
from safetensors.torch import load as st_load

from actors.policy import StateDictError, read_safetensors
from actors.protocol import CURRENT, SERVING, weights_bucket
from actors.weights import SharedMemoryTransport, WeightManifest, WeightPayloadError, shm_root
from topology.bus import Bus, BusError

__all__ = ["ResolvedWeights", "WeightsNotFound", "resolve_weights"]

_VERSION = re.compile(r"^v?(\d+)$")
_ON_DISK = re.compile(r"^(?:serving-)?v(\d+)$")


class WeightsNotFound(ValueError):
    """No weights where the user pointed; the message lists where we looked."""


@dataclass(frozen=True)
class ResolvedWeights:
    label: str  # "v3", "initial", or the checkpoint path
    version: int  # -1 for a checkpoint outside any run
    state_dict: dict[str, torch.Tensor] | None  # None: the spec's own policy


async def resolve_weights(ref: str, *, run_dir: Path | None = None, bus: Bus | None = None) -> ResolvedWeights:
    if ref in ("current", "serving"):
        ref = await _live_version(ref, bus)
    found, searched = await anyio.to_thread.run_sync(_local, ref, run_dir)
    if found is not None:
        return found
    version = int(ref.removeprefix("v"))
    if run_dir is not None:
        slots = SharedMemoryTransport(shm_root(run_dir))
        manifest = await anyio.to_thread.run_sync(slots.find, version)
        if manifest is not None:
            try:
                views = await slots.get(manifest)
            except WeightPayloadError:  # rewritten since it was found
                pass
            else:  # a copy: the slot is the learner's to rewrite
                return ResolvedWeights(f"v{version}", version, {n: t.clone() for n, t in views.items()})
        searched.append(f"the run's shared-memory slots ({slots.root})")
    if bus is not None:
        bucket = weights_bucket(bus.topology)
        for name in (f"serving-v{version}", f"v{version}"):
            try:
                blob = await bus.object_get(bucket, name)
            except BusError:
                searched.append(f"object store {bucket}/{name}")
                continue
            return ResolvedWeights(f"v{version}", version, dict(st_load(bytes(blob))))
    where = "; ".join(searched) or "nowhere (pass the run dir, or run it while the run's bus is up)"
    left = ""
    if run_dir is not None and (held := _versions_on_disk(run_dir)):
        # the learner's stores keep a few recent versions and the gate a few pinned serving ones: say which are left
        left = f"; {run_dir / 'weights'} holds {', '.join(f'v{v}' for v in held)}"
    raise WeightsNotFound(f"version {version} not found (searched: {where}){left}")


async def _live_version(key: str, bus: Bus | None) -> str:
    """``vN`` for the live run's ``current`` or ``serving`` key; WeightsNotFound when there is no run or no version."""
    if bus is None:
        raise WeightsNotFound(
            f"{key}: the run is not live (its bus is not up): give a version (v12) or a checkpoint path"
        )
    raw = await bus.kv_get(weights_bucket(bus.topology), CURRENT if key == "current" else SERVING)
    if not raw:
        raise WeightsNotFound(f"{key}: the run has no {key} version yet")
    return f"v{WeightManifest.from_json(raw).version}"


def _versions_on_disk(run_dir: Path) -> list[int]:
    """The versions whose weights ``<run_dir>/weights`` holds (pinned serving copies, the disk transport's)."""
    found: set[int] = set()
    folder = run_dir / "weights"
    for child in folder.iterdir() if folder.is_dir() else ():
        match = _ON_DISK.match(child.name)
        if match is not None and (child / "model.safetensors").is_file():
            found.add(int(match.group(1)))
    return sorted(found)


def _local(ref: str, run_dir: Path | None) -> tuple[ResolvedWeights | None, list[str]]:
    if ref in ("initial", "v0", "0"):
        return ResolvedWeights("initial", 0, None), []
    match = _VERSION.match(ref)
    if match is None:
        path = Path(ref).expanduser()
        if not path.exists():
            raise WeightsNotFound(
                f"no weights at {ref!r}: expected a version (v3), 'initial', or a path to a "
                ".safetensors file or directory"
            )
        try:
            return ResolvedWeights(str(path), -1, read_safetensors(path)), []
        except StateDictError as exc:
            raise WeightsNotFound(str(exc)) from None
    version = int(match.group(1))
    searched: list[str] = []
    if run_dir is not None:
        for folder in (run_dir / "weights" / f"serving-v{version}", run_dir / "weights" / f"v{version}"):
            if (folder / "model.safetensors").is_file():
                return ResolvedWeights(f"v{version}", version, read_safetensors(folder / "model.safetensors")), []
            searched.append(str(folder))
    return None, searched
