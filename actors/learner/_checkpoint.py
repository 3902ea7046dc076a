"""Learner checkpoints with torchsnapshot: written whole or not at all, the newest two kept.

Layout: ``<root>/ckpt-<step:09d>/`` (a torchsnapshot directory). A checkpoint is taken into a hidden temporary
directory next to it and renamed into place only when torchsnapshot has finished, so ``latest()`` never returns a
half-written one — a learner killed with SIGKILL mid-checkpoint restarts from the previous one. Temporary leftovers
of such a kill are removed by the next ``save``.

What goes in is the caller's ``app_state``; ``restore`` fills the same keys in place. A learner's is built by
`learner_state`: ``model`` (the policy's weights), ``optim`` (the RL optimizer), ``reference`` (the frozen KL
reference, only when ``kl_beta > 0``: the post-warm-start policy, which a restart could not rebuild otherwise),
``average`` (the weights' moving average, only with ``ema_decay``; `holds` says whether a checkpoint has it) and
``extra`` (a ``torchsnapshot.StateDict`` with ``meta``, JSON of step, version, phase, advantage statistics and
cumulative counters, and ``ledger``, the applied message ids).

Non-goals: sharded / multi-rank checkpoints (one learner replica), cloud storage paths.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["Checkpointer", "learner_state"]

_NAME = re.compile(r"^ckpt-(\d{9})$")


class Checkpointer:
    def __init__(self, root: Path, *, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep: expected an integer >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints, oldest first."""
        found = []
        for path in self.root.iterdir():
            match = _NAME.match(path.name)
            if match and (path / ".snapshot_metadata").exists():
                found.append((int(match.group(1)), path))
        return sorted(found)

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1][1] if found else None

    def save(self, step: int, app_state: Mapping[str, Any]) -> Path:
        from torchsnapshot import Snapshot

        for leftover in self.root.glob(".tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = self.root / f".tmp-{step:09d}-{uuid.uuid4().hex[:8]}"
        Snapshot.take(str(tmp), dict(app_state))
        final = self.root / f"ckpt-{step:09d}"
        if final.exists():  # a previous incarnation reached this step, then was rolled back past it
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        for _, old in self.checkpoints()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def restore(self, path: Path, app_state: Mapping[str, Any]) -> None:
        """Fill ``app_state`` from the checkpoint at ``path``. Every pickled entry is first loaded as plain data
        (``torch.load(weights_only=True)``), so a checkpoint holding code is refused before anything is restored —
        ``app_state`` is left as it was, and no read of torchsnapshot's is left suspended by the refusal."""
        from torchsnapshot import Snapshot

        snapshot = Snapshot(str(path))
        _refuse_code(path, snapshot.get_manifest())
        snapshot.restore(dict(app_state))

    @staticmethod
    def holds(path: Path, key: str) -> bool:
        """Whether the checkpoint at ``path`` has ``key`` (e.g. ``average``: one taken before ``ema_decay`` was set
        has none, and restoring a key it lacks fails)."""
        from torchsnapshot import Snapshot

        return any(name.split("/")[1:2] == [key] for name in Snapshot(str(path)).get_manifest())


def learner_state(
    model: Any, optimizer: Any, reference: Any | None, *, meta: str, ledger: str, average: Any | None = None
) -> dict[str, Any]:
    """A learner's checkpoint contents (see the module docstring); restore into the same dict, then read
    ``state["extra"]["meta"]`` and ``["ledger"]`` back."""
    from torchsnapshot import StateDict

    state: dict[str, Any] = {"model": model, "optim": optimizer, "extra": StateDict(meta=meta, ledger=ledger)}
    if reference is not None:
        state["reference"] = reference
    if average is not None:
        state["average"] = average
    return state


def _refuse_code(path: Path, manifest: Mapping[str, Any]) -> None:
    """Load every entry torchsnapshot pickled (``torch_save``) with ``weights_only``: raises
    ``pickle.UnpicklingError`` for one whose pickle would run code. Those entries are small (optimizer settings,
    exotic dtypes); tensors of the usual dtypes are raw buffers and are not read here."""
    import torch

    for entry in manifest.values():
        if getattr(entry, "serializer", None) != "torch_save":
            continue
        with open(path / entry.location, "rb") as f:
            byte_range = getattr(entry, "byte_range", None)
            if byte_range is not None:
                f.seek(byte_range[0])
                data = f.read(byte_range[1] - byte_range[0])
            else:
                data = f.read()
        torch.load(io.BytesIO(data), weights_only=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
