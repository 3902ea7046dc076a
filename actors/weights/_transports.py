"""Weight transports: how the tensors of one version travel from the learner to the generators.

- :class:`ObjectStoreTransport` — the NATS JetStream object store (the embedded default: nothing to share but
  the bus). Payload = one safetensors blob; the object store chunks it and records its SHA-256 digest, which
  travels in the manifest: a blob corrupted in transit or replaced since it was announced is rejected.
- :class:`SafetensorsDirTransport` — a directory in Hugging Face layout (``model.safetensors`` + ``config.json``),
  what SGLang and vLLM load from disk; on ``/dev/shm`` it is the shared-memory path. Each version is written to
  a hidden temporary directory and renamed into place, so a reader never sees a half-written version. A fresh
  file's pages cost more than the copy into them on a tmpfs (and freeing a pruned one's about as much), so a
  quarter second after each publish a thread prunes and allocates the next version's file (``fallocate``, a
  hidden ``.spare-<pid>`` of the same size; never announced, so nobody holds it open or mapped), and the next
  publish writes into it when it is ready (pruning lags a publish by that quarter second). Generators read
  with one kernel copy, into the engine's standby weights (:meth:`~actors.engines.TorchEngine.update_weights_from`).

Tensors travel with one copy on each side: the learner writes its tensors' memory straight into the file or
blob (``actors.weights._mmap``), and a generator reads the file into its standby weights, or copies from views of
the received blob.

Both keep the last ``keep_versions`` versions and delete older ones: 4 in the object store — a learner publishing
several versions a second must not delete the one a generator is still reading (the bus fails such a read after
10 s without data and the generator moves on to the newest version, but those seconds serve stale weights) — and 2
on disk (full model copies; a read of a pruned directory fails at once and the next version is taken). The
torch.distributed broadcast path lives
in :mod:`actors.engines._group` (it moves tensors peer to peer and needs no transport object).

Non-goals: no compression, no partial (delta) updates, no authentication beyond the bus's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Protocol

import torch

from actors.weights._manifest import WeightManifest, WeightPayloadError, check_state_dict, describe
from actors.weights._mmap import (
    NonFiniteValues,
    read_safetensors_into,
    safetensors_size,
    serialize_safetensors,
    view_safetensors,
    write_safetensors,
)
from topology.bus import Bus, BusError

__all__ = ["CollectiveTransport", "ObjectStoreTransport", "SafetensorsDirTransport", "WeightTransport"]

StateDict = Mapping[str, torch.Tensor]
_GRACE_S = 0.25  # after a disk publish, before its tidying thread competes with the generators reading it


class WeightTransport(Protocol):
    name: str

    async def put(self, version: int, state_dict: StateDict) -> WeightManifest:
        """Store the version; its tensors are copied (or sent) before this returns, so the caller may step them
        right after (the learner passes its live parameters)."""
        ...

    async def get(
        self, manifest: WeightManifest, *, into: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """The version's tensors; read into ``into``'s tensors (an engine's standby weights) where the transport can
        and they match exactly, so that the engine need not copy them again."""
        ...


class CollectiveTransport(WeightTransport, Protocol):
    """A transport whose receivers join the transfer (a broadcast): the manifest must be announced first.

    ``announces`` is True; :meth:`put_announced` builds the manifest, awaits ``announce(manifest)`` (the KV put),
    then sends. See :mod:`actors.weights._distributed`.
    """

    announces: bool

    async def put_announced(
        self, version: int, state_dict: StateDict, announce: Callable[[WeightManifest], Awaitable[None]]
    ) -> WeightManifest: ...


def _contiguous_cpu(state_dict: StateDict) -> dict[str, torch.Tensor]:
    return {name: t.detach().to("cpu").contiguous() for name, t in state_dict.items()}


def _nbytes(state_dict: StateDict) -> int:
    return sum(t.numel() * t.element_size() for t in state_dict.values())


class ObjectStoreTransport:
    name = "object-store"

    def __init__(self, bus: Bus, bucket: str, *, keep_versions: int = 4) -> None:
        self._bus = bus
        self._bucket = bucket
        self._keep = keep_versions

    async def put(self, version: int, state_dict: StateDict) -> WeightManifest:
        tensors = _contiguous_cpu(state_dict)
        blob = await asyncio.to_thread(serialize_safetensors, tensors, metadata={"format": "pt"})
        name = f"v{version}"
        _, digest = await self._bus.object_put(self._bucket, name, blob)
        if version - self._keep >= 0:
            await self._bus.object_delete(self._bucket, f"v{version - self._keep}")
        return WeightManifest(version, self.name, name, describe(tensors), len(blob), digest)

    async def get(
        self, manifest: WeightManifest, *, into: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        try:
            blob = await self._bus.object_get(self._bucket, manifest.location, expect_digest=manifest.digest or None)
        except BusError as exc:
            raise WeightPayloadError(f"v{manifest.version}: {exc}") from exc
        if len(blob) != manifest.nbytes:
            raise WeightPayloadError(
                f"v{manifest.version}: payload is {len(blob)} bytes, manifest says {manifest.nbytes} (truncated?)"
            )
        try:  # views of the blob: the engine's copy into its weights is the only one
            state_dict = view_safetensors(blob, where=f"object {manifest.location}")
        except (ValueError, RuntimeError) as exc:
            raise WeightPayloadError(f"v{manifest.version}: not a safetensors payload: {exc}") from exc
        check_state_dict(state_dict, manifest.tensors, what=f"v{manifest.version}")
        return state_dict


class SafetensorsDirTransport:
    name = "disk"

    def __init__(
        self, root: Path | str, *, keep_versions: int = 2, extra_files: Mapping[str, bytes] | None = None
    ) -> None:
        self.root = Path(root)
        self._keep = keep_versions
        self._extra = dict(extra_files or {})  # e.g. config.json, tokenizer files: HF layout beside the weights
        self._preparing: threading.Thread | None = None  # the tidying thread, while it runs
        self._tidy_lock = threading.Lock()
        self._newest = 0
        self.spares_used = 0  # versions written into a file allocated ahead

    def version_dir(self, version: int) -> Path:
        return self.root / f"v{version}"

    async def put(self, version: int, state_dict: StateDict) -> WeightManifest:
        tensors = _contiguous_cpu(state_dict)
        final = self.version_dir(version)
        await asyncio.to_thread(self._write, final, tensors, version)
        return WeightManifest(version, self.name, str(final), describe(tensors), _nbytes(tensors))

    async def adopt(self, source: Path | str, number: int) -> Path:
        """Another transport's version directory, hard-linked in (copied across filesystems) as ``v<number>``: a
        server reading it keeps its files whatever the other side prunes meanwhile (a link outlives the name it was
        made from). Pruned like this transport's own versions."""
        final = self.version_dir(number)
        await asyncio.to_thread(self._link, Path(source), final, number)
        return final

    def _link(self, source: Path, final: Path, number: int) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / f".{final.name}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        try:
            shutil.copytree(source, partial, copy_function=link_or_copy)
        except (OSError, shutil.Error) as exc:  # pruned before (or while) it was linked
            shutil.rmtree(partial, ignore_errors=True)
            raise WeightPayloadError(f"cannot take {source}: {exc}") from exc
        shutil.rmtree(final, ignore_errors=True)
        os.rename(partial, final)
        with self._tidy_lock:
            self._newest = max(self._newest, number)
        self._after_publish(0)

    def _write(self, final: Path, tensors: dict[str, torch.Tensor], version: int) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / f".{final.name}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        target = partial / "model.safetensors"
        size = safetensors_size(tensors, metadata=self._metadata(version))
        if self._take_spare(size, target):  # pages allocated ahead: the write is the copy alone
            self.spares_used += 1
        write_safetensors(target, tensors, metadata=self._metadata(version))
        for name, data in self._extra.items():
            (partial / name).write_bytes(data)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(partial, final)  # atomic on one filesystem: readers see all of a version or none of it
        with self._tidy_lock:
            self._newest = max(self._newest, version)
        self._after_publish(size)

    @staticmethod
    def _metadata(version: int) -> dict[str, str]:
        return {"format": "pt", "version": str(version)}

    def _spare_path(self) -> Path:
        return self.root / f".spare-{os.getpid()}"

    def _take_spare(self, size: int, target: Path) -> bool:
        """Move the spare file to ``target`` if it is ready (never waited for) and of ``size`` bytes."""
        spare = self._spare_path()
        try:
            if spare.stat().st_size != size:
                spare.unlink()
                return False
            os.rename(spare, target)
        except OSError:
            return False
        return True

    def _after_publish(self, size: int) -> None:
        """Off the publish path, in a thread, once the generators have had ``_GRACE_S`` to read the new version:
        delete the pruned versions (freeing a tmpfs file's pages costs about as much as the copy), then allocate
        the next version's file (``fallocate``: a file never announced, so nobody holds it open or mapped;
        overwriting a published one in place would change what an mmap reader, such as the safetensors library's
        own ``load_file``, holds). One such thread at a time; it goes on while publishes keep coming."""
        with self._tidy_lock:
            if self._preparing is not None:
                return
            self._preparing = threading.Thread(target=self._tidy, args=(size,), name="weights-tidy", daemon=True)
            self._preparing.start()

    def _tidy(self, size: int) -> None:
        spare = self._spare_path()
        staging = spare.with_name(spare.name + ".partial")
        while True:
            time.sleep(_GRACE_S)
            with self._tidy_lock:
                newest = self._newest
            self._prune(newest)
            if size and not spare.exists():  # none yet, or the publish meanwhile took it (none for adopted ones)
                try:
                    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    try:
                        os.posix_fallocate(fd, 0, size)
                    finally:
                        os.close(fd)
                    os.rename(staging, spare)
                except OSError:  # no room, or a filesystem without fallocate: the next write allocates as it goes
                    with contextlib.suppress(OSError):
                        staging.unlink()
            with self._tidy_lock:
                if self._newest == newest:  # nothing published meanwhile: done
                    self._preparing = None
                    return

    def wait_tidy(self, timeout_s: float | None = None) -> None:
        """Wait for the thread that prunes and allocates after a publish (tests, benchmarks)."""
        thread = self._preparing
        if thread is not None:
            thread.join(timeout_s)

    def _prunable(self, version: int) -> list[Path]:
        old = []
        for path in self.root.glob("v*"):
            try:
                number = int(path.name[1:])
            except ValueError:
                continue
            if number <= version - self._keep:
                old.append((number, path))
        return [path for _, path in sorted(old)]

    def _prune(self, version: int) -> None:
        for old in self._prunable(version):
            shutil.rmtree(old, ignore_errors=True)

    async def get(
        self, manifest: WeightManifest, *, into: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        path = Path(manifest.location) / "model.safetensors"
        if not path.is_file():
            raise WeightPayloadError(f"v{manifest.version}: {path} does not exist (pruned or never written)")
        try:  # one kernel copy, into the engine's standby weights when it offers them
            state_dict = await asyncio.to_thread(read_safetensors_into, path, into, version=str(manifest.version))
        except NonFiniteValues as exc:
            raise WeightPayloadError(f"v{manifest.version}: rejected: {exc}") from exc
        except (ValueError, RuntimeError, OSError) as exc:
            raise WeightPayloadError(f"v{manifest.version}: {path} is not a valid safetensors file: {exc}") from exc
        check_state_dict(state_dict, manifest.tensors, what=f"v{manifest.version}")
        return state_dict


def link_or_copy(source: str, target: str) -> None:
    """A hard link (versions are written once, then renamed into place: never changed) or, across filesystems, a
    copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
