"""Learner checkpoints with torchsnapshot: written whole or not at all, the newest two kept.

Layout: ``<root>/ckpt-<step:09d>/`` (a torchsnapshot directory), ``ckpt-<step:09d>-<n>/`` for the n-th later one
taken at the same step (a learner checkpoints groups it consumed without a step, and a resumed one may reach a step
an earlier life also reached): the newest is the highest (step, n). A checkpoint is taken into a hidden temporary
directory next to it and renamed into place only when torchsnapshot has finished, so ``latest()`` never returns a
half-written one — a learner killed with SIGKILL mid-checkpoint restarts from the previous one — and none is ever
removed before a newer one is in place (removing a same-step one first would, for a moment, leave an older one as
the latest: its ledger lacks messages the removed one had acked). Temporary leftovers of a kill are removed by the
next ``save``.

What goes in is the caller's ``app_state``; ``restore`` fills the same keys in place. A learner's is built by
`learner_state`: ``model`` (the policy's weights), ``optim`` (the RL optimizer), ``reference`` (the frozen KL
reference, only when ``kl_beta > 0``: the post-warm-start policy, which a restart could not rebuild otherwise),
``average`` (the weights' moving average, only with ``ema_decay``; `holds` says whether a checkpoint has it) and
``extra`` (a ``torchsnapshot.StateDict`` with ``meta``, JSON of step, version, phase, advantage statistics and
cumulative counters, and ``ledger``, the applied message ids).

`staged` copies a learner state (to the CPU) so that it can be written while training goes on: the learner's
periodic checkpoints are written in the background from such a copy.

Non-goals: sharded / multi-rank checkpoints (one learner replica), cloud storage paths.
"""

from __future__ import annotations

import copy
import io
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["Checkpointer", "fsync_dir", "learner_state", "staged"]

_NAME = re.compile(r"^ckpt-(\d{9})(?:-(\d+))?$")


class Checkpointer:
    def __init__(self, root: Path, *, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep: expected an integer >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints as (step, path), oldest first (at one step, in the order they were taken)."""
        found = []
        for path in self.root.iterdir():
            match = _NAME.match(path.name)
            if match and (path / ".snapshot_metadata").exists():
                found.append((int(match.group(1)), int(match.group(2) or 0), path))
        return [(step, path) for step, _, path in sorted(found)]

    def _name(self, step: int) -> str:
        """The name of the next checkpoint at ``step``: ``ckpt-<step>``, or ``-<n>`` after the last one taken there."""
        taken = [int(m.group(2) or 0) for m in map(_NAME.match, os.listdir(self.root)) if m and int(m.group(1)) == step]
        return f"ckpt-{step:09d}" if not taken else f"ckpt-{step:09d}-{max(taken) + 1}"

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1][1] if found else None

    def save(self, step: int, app_state: Mapping[str, Any]) -> Path:
        from torchsnapshot import Snapshot

        for leftover in self.root.glob(".tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = self.root / f".tmp-{step:09d}-{uuid.uuid4().hex[:8]}"
        Snapshot.take(str(tmp), dict(app_state))
        final = self.root / self._name(step)  # a new name: the one it supersedes stays until it is in place
        os.replace(tmp, final)
        fsync_dir(self.root)
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


class _Staged:
    """A state dict copied once, written as the object it was copied from would be (the same containers, so the
    same manifest); restoring goes into the live objects, never into this."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def state_dict(self) -> Any:
        return self._state

    def load_state_dict(self, state: Any) -> None:
        raise TypeError("a staged copy is only written; restore into the live objects")


def _copy(value: Any) -> Any:
    """``value`` with every tensor in it copied to the CPU (containers rebuilt with their own types)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return type(value)((key, _copy(item)) for key, item in value.items())
    if isinstance(value, list | tuple):
        return type(value)(_copy(item) for item in value)
    return copy.deepcopy(value)


def staged(app_state: Mapping[str, Any], *, frozen: tuple[str, ...] = ("reference",)) -> dict[str, Any]:
    """A copy of ``app_state`` (a `learner_state`) to write while training steps the originals: each entry's
    state dict with its tensors copied to the CPU, except the ``frozen`` entries (nothing changes them), which are
    written from the objects themselves. ``Checkpointer.save`` takes it as it takes ``app_state``, and the
    checkpoint restores into the live objects as one taken from them does."""
    return {key: value if key in frozen else _Staged(_copy(value.state_dict())) for key, value in app_state.items()}


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


def fsync_dir(path: Path) -> None:
    """Make the entries created, renamed or removed in ``path`` (a directory) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
