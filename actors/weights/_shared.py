"""Shared-memory weight slots: the learner copies a version once, every generator on the machine maps it.

The ``shm`` transport keeps a few *slots* (files on a tmpfs, ``/dev/shm`` where there is one), each holding one
version in the safetensors layout. Publishing copies the learner's tensors into a free slot (one pass: piece by
piece on a few threads of the transport's own, each piece checked finite while it is in the cache), and the
manifest names the slot. A generator maps the slot once
(the mapping is kept for the next versions written there, so its page tables are built once) and its engine makes
views of the mapping its live weights: a swap is a pointer exchange, with no copy on the generator's side however
many generators there are.

Who may write where is settled by ``flock`` on the slot files, so a crash of anyone releases what it held:
- a generator takes a shared lock on the slot of the version it serves and holds it as long as any tensor of that
  version is alive (the lock's file descriptor is closed when the last view is freed: :class:`_Lease`);
- the learner writes only into a slot it can lock exclusively (nobody serves from it) and never into the slot of
  the newest version it published (generators may be about to take it). When every slot is held, it adds one, up
  to ``max_slots``; beyond that it waits ``wait_s`` for a generator to move on, then fails the publish.
- a generator that finds the announced version's slot locked for writing, or holding a newer version, was too
  slow: the version was superseded, and the next announcement is taken (``WeightPayloadGone``: not retried, not
  counted as a rejection).

The slots of a run live in ``/dev/shm/flywheel-<uid>/<hash of the run dir>/`` (``<run_dir>/weights/shm`` without
a tmpfs), so every replica of the run agrees on them and a resumed run reuses them. The learner removes them when
it stops, and removes any left behind by a run whose run dir is gone.

Non-goals: other machines (the object store or the broadcast), HTTP engines (SGLang and vLLM load a directory:
``disk``), tensors on a GPU (a GPU engine copies from the mapping, then lets it go).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import mmap
import os
import shutil
import struct
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from actors.weights._copy import copy_checked
from actors.weights._manifest import (
    TensorInfo,
    WeightManifest,
    WeightPayloadError,
    WeightPayloadGone,
    check_state_dict,
    describe,
)
from actors.weights._mmap import _Entry, _head, _layout, _parse, _views

__all__ = ["SharedMemoryTransport", "SharedTensors", "SlotSpaceError", "shm_root"]

StateDict = Mapping[str, torch.Tensor]
_RUN_FILE = "run"  # in a run's slot directory: the run dir it belongs to (stale ones are removed)


def shm_root(run_dir: Path | str) -> Path:
    """Where the slots of the run in ``run_dir`` live: on ``/dev/shm`` where it is writable, else in the run dir."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        key = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
        return shm / f"flywheel-{os.getuid()}" / key
    return Path(run_dir) / "weights" / "shm"


class SlotSpaceError(WeightPayloadError):
    """The tmpfs holding the slots has no room for one more (a container's /dev/shm is 64 MB unless given more)."""


class SharedTensors(dict[str, torch.Tensor]):
    """Views of a shared slot: the engine may make them its live weights as they are (``shared``); their values
    were checked finite by the writer (``values_checked``). They hold the slot's shared lock while alive."""

    values_checked = True
    shared = True


class _Lease:
    """One shared lock on a slot, alive as long as any tensor viewing the slot through it: numpy keeps this object
    as the base of the array it builds from ``__array_interface__``, and torch keeps that array."""

    def __init__(self, fd: int, array: np.ndarray[Any, Any]) -> None:
        self.__array_interface__ = {
            "data": (array.ctypes.data, True),  # read-only on purpose: nothing may write into a published version
            "shape": (array.size,),
            "typestr": "|u1",
            "version": 3,
        }
        self._array = array  # the mapping stays alive while the lease is
        weakref.finalize(self, os.close, fd)

    def tensors(self, base: int, entries: dict[str, _Entry]) -> SharedTensors:
        return SharedTensors(_views(np.asarray(self), base, entries))


@dataclass
class _Mapped:
    inode: int
    size: int
    map: mmap.mmap
    array: np.ndarray[Any, Any]


@dataclass
class _Slot:
    index: int
    fd: int
    mapped: _Mapped | None = None
    version: int = 0


class SharedMemoryTransport:
    name = "shm"

    def __init__(
        self, root: Path | str, *, owner: Path | str | None = None, max_slots: int = 8, wait_s: float = 30.0
    ) -> None:
        self.root = Path(root)
        self._owner = Path(owner).resolve() if owner is not None else None  # the run dir, where there is one
        self.max_slots = max_slots
        self.wait_s = wait_s
        self._slots: dict[int, _Slot] = {}  # the writer's: open, mapped read-write
        self._newest: int | None = None  # the slot of the newest version written: never rewritten next
        self._maps: dict[str, _Mapped] = {}  # a reader's: one read-only mapping per slot file, reused

    # -- the learner's side ------------------------------------------------------------------------------
    async def put(self, version: int, state_dict: StateDict) -> WeightManifest:
        tensors = {name: t.detach().to("cpu").contiguous() for name, t in state_dict.items()}
        path = await asyncio.to_thread(self._write, version, tensors)
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        return WeightManifest(version, self.name, str(path), describe(tensors), nbytes)

    def _write(self, version: int, tensors: dict[str, torch.Tensor]) -> Path:
        header, padded = _layout(tensors, {"format": "pt", "version": str(version)})
        base = 8 + len(padded)
        size = base + int(header["__end__"])
        slot = self._claim(size)
        try:
            mapped = self._writable(slot, size)
            out = torch.from_numpy(mapped.array)
            # the header last: a writer killed mid-copy leaves a slot that names no version (its length is 0), not
            # one that names a version it does not hold
            out[:8].zero_()
            ranges = {name: header[name]["data_offsets"] for name in sorted(tensors)}
            jobs = [(name, tensors[name], out[base + b : base + e]) for name, (b, e) in ranges.items()]
            bad = copy_checked(jobs, lanes=torch.get_num_threads())
            if bad is not None:
                raise WeightPayloadError(f"{bad}: contains NaN or infinite values: not published")
            out[8:base].copy_(torch.frombuffer(bytearray(padded), dtype=torch.uint8))
            out[:8].copy_(torch.frombuffer(bytearray(struct.pack("<Q", len(padded))), dtype=torch.uint8))
            slot.version, self._newest = version, slot.index
        except BaseException:
            slot.version = 0
            with contextlib.suppress(OSError):
                os.pwrite(slot.fd, b"\0" * 8, 0)
            raise
        finally:
            fcntl.flock(slot.fd, fcntl.LOCK_UN)
        return self._path(slot.index)

    def _path(self, index: int) -> Path:
        return self.root / f"slot-{index}"

    def _claim(self, size: int) -> _Slot:
        """A slot locked exclusively: an existing one nobody serves from (oldest version first, never the newest),
        else a new one, else wait for one."""
        if not self._slots:
            self._open_root()
        started = time.monotonic()
        while True:
            order = sorted((s for i, s in self._slots.items() if i != self._newest), key=lambda s: s.version)
            for slot in order:
                try:
                    fcntl.flock(slot.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                return slot
            if len(self._slots) < self.max_slots:
                index = next(i for i in range(len(self._slots) + 1) if i not in self._slots)
                fd = os.open(self._path(index), os.O_RDWR | os.O_CREAT, 0o600)
                slot = _Slot(index, fd)
                self._slots[index] = slot
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # a generator of an earlier life of this learner still serves from it
                    continue
                return slot
            if time.monotonic() - started > self.wait_s:
                raise WeightPayloadError(
                    f"every one of the {self.max_slots} shared-memory weight slots in {self.root} is held by a "
                    f"generator serving an older version, for {self.wait_s:g} s: are generators stuck mid-swap?"
                )
            time.sleep(0.005)

    def _open_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self._owner is not None:
            _remove_stale(self.root.parent, keep=self.root)
            (self.root / _RUN_FILE).write_text(str(self._owner))

    def _writable(self, slot: _Slot, size: int) -> _Mapped:
        mapped = slot.mapped
        if mapped is None or mapped.size != size:
            slot.mapped = mapped = None  # the old mapping goes with its last view (closing it now would fail)
            try:  # locked exclusively: nobody reads it (readers remap on a new size). The pages are taken now:
                # a tmpfs out of room fails here, not with a SIGBUS in the middle of the copy
                os.ftruncate(slot.fd, size)
                os.posix_fallocate(slot.fd, 0, size)
            except OSError as exc:
                os.ftruncate(slot.fd, 0)
                raise SlotSpaceError(
                    f"no room for a {size / 1e6:.1f} MB weight slot in {self.root}: {exc.strerror} (free space in "
                    "/dev/shm — a container's is 64 MB unless run with --shm-size — or set the learner's "
                    "weight_transport to disk)"
                ) from None
            view = mmap.mmap(slot.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            mapped = slot.mapped = _Mapped(os.fstat(slot.fd).st_ino, size, view, np.frombuffer(view, np.uint8))
        return mapped

    def close(self) -> None:
        """Unmap and remove this run's slots (generators' mappings stay valid until they let them go)."""
        for slot in self._slots.values():
            with contextlib.suppress(OSError):
                os.close(slot.fd)
        self._slots.clear()
        self._newest = None
        shutil.rmtree(self.root, ignore_errors=True)

    def find(self, version: int) -> WeightManifest | None:
        """The manifest of ``version`` where one of this run's slots still holds it (replay of a recent version)."""
        for path in sorted(self.root.glob("slot-*")):
            try:
                with open(path, "rb") as handle:
                    size = os.fstat(handle.fileno()).st_size
                    head = _head(handle.read(8), size, handle.read)
                _, entries, metadata = _parse(head, size, str(path))
            except (OSError, ValueError):
                continue
            if metadata.get("version") == str(version):
                tensors = {n: TensorInfo(e.shape, str(e.dtype).removeprefix("torch.")) for n, e in entries.items()}
                nbytes = sum(e.end - e.begin for e in entries.values())
                return WeightManifest(version, self.name, str(path), tensors, nbytes)
        return None

    # -- a generator's side --------------------------------------------------------------------------------
    async def get(self, manifest: WeightManifest, *, into: Mapping[str, torch.Tensor] | None = None) -> SharedTensors:
        """Views of the version's slot, holding its shared lock while alive (``into`` is not needed: nothing is
        copied). ``WeightPayloadError`` when the slot is gone or was rewritten with a newer version."""
        out: list[SharedTensors] = []

        def build() -> None:  # off the event loop (a decode loop may share it); the result comes back through
            # ``out``, not as the thread's return value: a finished executor future may outlive the call with its
            # result, and the lease must live exactly as long as the tensors viewing it
            fd, array, base, entries = self._map(manifest)
            tensors = _Lease(fd, array).tensors(base, entries)
            check_state_dict(tensors, manifest.tensors, what=f"v{manifest.version}")
            out.append(tensors)

        await asyncio.to_thread(build)
        return out.pop()

    def _map(self, manifest: WeightManifest) -> tuple[int, np.ndarray[Any, Any], int, dict[str, _Entry]]:
        """The slot's file descriptor (share-locked), its mapping and its layout, once it holds the version."""
        what = f"v{manifest.version}"
        try:
            fd = os.open(manifest.location, os.O_RDONLY)
        except OSError as exc:
            raise WeightPayloadGone(f"{what}: shared-memory slot {manifest.location} is gone: {exc}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise WeightPayloadGone(f"{what}: superseded (its slot is being rewritten with a newer one)") from None
            info = os.fstat(fd)
            mapped = self._maps.get(manifest.location)
            if mapped is None or (mapped.inode, mapped.size) != (info.st_ino, info.st_size):
                if info.st_size < 8:
                    raise WeightPayloadError(f"{what}: shared-memory slot {manifest.location} is empty")
                mapped = _map_read_only(manifest.location, info)
                self._maps[manifest.location] = mapped
            head = _head(mapped.map[:8], mapped.size, lambda n: mapped.map[8 : 8 + n])
            try:
                base, entries, metadata = _parse(head, mapped.size, manifest.location)
            except ValueError as exc:
                raise WeightPayloadError(f"{what}: {exc}") from None
            if metadata.get("version") != str(manifest.version):
                raise WeightPayloadGone(f"{what}: superseded (its slot holds v{metadata.get('version')} now)")
        except BaseException:
            os.close(fd)
            raise
        return fd, mapped.array, base, entries


def _map_read_only(path: str, info: os.stat_result) -> _Mapped:
    """A read-only shared mapping of ``path`` through a descriptor of its own (a mapping keeps a duplicate of the
    descriptor it was made from, and a flock lasts as long as any duplicate: the lease's lock must not)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if (os.fstat(fd).st_ino, os.fstat(fd).st_size) != (info.st_ino, info.st_size):
            raise WeightPayloadError(f"shared-memory slot {path} was replaced while it was opened")
        view = mmap.mmap(fd, info.st_size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    return _Mapped(info.st_ino, info.st_size, view, np.frombuffer(view, np.uint8))


def _remove_stale(parent: Path, *, keep: Path) -> None:
    """Remove the slot directories of runs whose run dir no longer exists."""
    for entry in parent.iterdir():
        if entry == keep or not entry.is_dir():
            continue
        try:
            owner = Path((entry / _RUN_FILE).read_text().strip())
        except OSError:
            continue
        if owner.is_absolute() and not owner.exists():
            shutil.rmtree(entry, ignore_errors=True)
