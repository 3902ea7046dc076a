"""Weight transports: how the tensors of one version travel from the learner to the generators.

- :class:`ObjectStoreTransport` — the NATS JetStream object store (the embedded default: nothing to share but
  the bus). Payload = one safetensors blob; the object store chunks it and records its SHA-256 digest, which
  travels in the manifest: a blob corrupted in transit or replaced since it was announced is rejected.
- :class:`SafetensorsDirTransport` — a directory in Hugging Face layout (``model.safetensors`` + ``config.json``),
  what SGLang and vLLM load from disk; on ``/dev/shm`` it is the shared-memory path. Each version is written to
  a hidden temporary directory and renamed into place, so a reader never sees a half-written version.

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
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Protocol

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from safetensors.torch import save_file as st_save_file

from actors.weights._manifest import WeightManifest, WeightPayloadError, check_state_dict, describe
from actors.weights._mmap import map_safetensors
from topology.bus import Bus, BusError

__all__ = ["CollectiveTransport", "ObjectStoreTransport", "SafetensorsDirTransport", "WeightTransport"]

StateDict = Mapping[str, torch.Tensor]


class WeightTransport(Protocol):
    name: str

    async def put(self, version: int, state_dict: StateDict) -> WeightManifest: ...

    async def get(self, manifest: WeightManifest) -> dict[str, torch.Tensor]: ...


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
        blob = await asyncio.to_thread(st_save, tensors)
        name = f"v{version}"
        _, digest = await self._bus.object_put(self._bucket, name, blob)
        if version - self._keep >= 0:
            await self._bus.object_delete(self._bucket, f"v{version - self._keep}")
        return WeightManifest(version, self.name, name, describe(tensors), len(blob), digest)

    async def get(self, manifest: WeightManifest) -> dict[str, torch.Tensor]:
        try:
            blob = await self._bus.object_get(self._bucket, manifest.location, expect_digest=manifest.digest or None)
        except BusError as exc:
            raise WeightPayloadError(f"v{manifest.version}: {exc}") from exc
        if len(blob) != manifest.nbytes:
            raise WeightPayloadError(
                f"v{manifest.version}: payload is {len(blob)} bytes, manifest says {manifest.nbytes} (truncated?)"
            )
        try:
            state_dict = await asyncio.to_thread(st_load, blob)
        except (SafetensorError, ValueError, RuntimeError) as exc:
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

    def version_dir(self, version: int) -> Path:
        return self.root / f"v{version}"

    async def put(self, version: int, state_dict: StateDict) -> WeightManifest:
        tensors = _contiguous_cpu(state_dict)
        final = self.version_dir(version)
        await asyncio.to_thread(self._write, final, tensors)
        self._prune(version)
        return WeightManifest(version, self.name, str(final), describe(tensors), _nbytes(tensors))

    def _write(self, final: Path, tensors: dict[str, torch.Tensor]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / f".{final.name}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        st_save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
        for name, data in self._extra.items():
            (partial / name).write_bytes(data)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(partial, final)  # atomic on one filesystem: readers see all of a version or none of it

    def _prune(self, version: int) -> None:
        for old in self.root.glob("v*"):
            try:
                number = int(old.name[1:])
            except ValueError:
                continue
            if number <= version - self._keep:
                shutil.rmtree(old, ignore_errors=True)

    async def get(self, manifest: WeightManifest) -> dict[str, torch.Tensor]:
        path = Path(manifest.location) / "model.safetensors"
        if not path.is_file():
            raise WeightPayloadError(f"v{manifest.version}: {path} does not exist (pruned or never written)")
        try:
            state_dict = await asyncio.to_thread(map_safetensors, path)  # views of the file: one copy, into the model
        except (ValueError, RuntimeError, OSError) as exc:
            raise WeightPayloadError(f"v{manifest.version}: {path} is not a valid safetensors file: {exc}") from exc
        check_state_dict(state_dict, manifest.tensors, what=f"v{manifest.version}")
        return state_dict
