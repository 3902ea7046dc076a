"""safetensors files and blobs read and written with one copy of the tensor bytes, or none.

The format is simple enough to handle here: an 8-byte little-endian header length, a JSON header naming every
tensor's dtype, shape and byte range (``__metadata__`` holds free-form strings), then the data. Every byte range is
checked against the payload's size and the dtype/shape before any tensor is built, so a truncated or malformed
payload is rejected with the tensor at fault named.

- :func:`write_safetensors` writes a file with ``pwrite`` straight from the tensors' memory (the library's
  ``save_file`` serializes into a second buffer first); into a file of the same size already there (allocated
  ahead: on a tmpfs a fresh file's pages cost far more than the copy, bench/RESULTS.md) it writes in place,
  header first.
- :func:`read_safetensors_into` reads with ``preadv`` straight into given tensors (a reused buffer: no page
  faults, one kernel copy) or into new ones, and compares the header before and after: a file rewritten under a
  reader is detected, never half-read.
- :func:`view_safetensors` gives tensors that are views of an in-memory blob; :func:`map_safetensors` of a
  private memory map of a file.

Non-goals: big-endian hosts, the library's dtype-aligned ordering (any contiguous layout is valid safetensors).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from actors.policy import all_finite

__all__ = [
    "CheckedTensors",
    "MalformedSafetensors",
    "NonFiniteValues",
    "map_safetensors",
    "read_safetensors_into",
    "safetensors_size",
    "serialize_safetensors",
    "view_safetensors",
    "write_safetensors",
]

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024
_CHECK_CHUNK = 1 << 20  # bytes read, then checked, at a time: they are still in the cache
_HEADER_ROUND = 4096  # headers are padded to a multiple: the same model's files then have the same size


class MalformedSafetensors(ValueError):
    pass


class NonFiniteValues(MalformedSafetensors):
    """A well-formed payload with a NaN or an infinity in it."""


@dataclass(frozen=True)
class _Entry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # byte offsets into the data, which starts at ``base``
    end: int


def _parse(head: bytes, size: int, where: str) -> tuple[int, dict[str, _Entry], dict[str, str]]:
    """(data start, entries, metadata) from a payload's first bytes (header length and header) and its size."""
    if size < 8 or len(head) < 8:
        raise MalformedSafetensors(f"{where}: {size} bytes is too short for a safetensors payload")
    (header_len,) = struct.unpack("<Q", head[:8])
    if header_len > min(_MAX_HEADER, size - 8) or len(head) < 8 + header_len:
        raise MalformedSafetensors(f"{where}: header length {header_len} does not fit a {size}-byte payload")
    try:
        header = json.loads(head[8 : 8 + header_len])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedSafetensors(f"{where}: unreadable header: {exc}") from None
    if not isinstance(header, dict):
        raise MalformedSafetensors(f"{where}: header is not a JSON object")
    base = 8 + header_len
    metadata = header.pop("__metadata__", None) or {}
    entries: dict[str, _Entry] = {}
    for name, raw in header.items():
        try:
            dtype = _DTYPES[raw["dtype"]]
            shape = tuple(int(d) for d in raw["shape"])
            begin, end = (int(x) for x in raw["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedSafetensors(f"{where}: bad header entry for {name!r}: {exc!r}") from None
        count = math.prod(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end or base + end > size or end - begin != count * itemsize:
            raise MalformedSafetensors(
                f"{where}: {name} claims bytes {begin}..{end} of a {size - base}-byte "
                f"payload for {count} × {itemsize} bytes (truncated or corrupted)"
            )
        entries[name] = _Entry(dtype, shape, begin, end)
    return base, entries, metadata if isinstance(metadata, dict) else {}


def _bytes(tensor: torch.Tensor) -> Any:
    """A writable buffer over a contiguous CPU tensor's bytes (numpy knows no bfloat16: viewed as bytes)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def _views(buffer: Any, base: int, entries: dict[str, _Entry]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for name, entry in entries.items():
        count = math.prod(entry.shape)
        if count == 0:
            tensors[name] = torch.empty(entry.shape, dtype=entry.dtype)
            continue
        with warnings.catch_warnings():  # a bytes blob is read-only: its views are only ever copied from
            warnings.filterwarnings("ignore", "The given buffer is not writable")
            flat = torch.frombuffer(buffer, dtype=entry.dtype, count=count, offset=base + entry.begin)
        tensors[name] = flat.view(entry.shape)
    return tensors


def view_safetensors(blob: bytes | bytearray | memoryview, *, where: str = "payload") -> dict[str, torch.Tensor]:
    """Tensors that are views of ``blob`` (which they keep alive); no bytes are copied. Views of a ``bytes`` blob
    must not be written to."""
    view = memoryview(blob)
    base, entries, _ = _parse(_head_of(view), len(view), where)
    return _views(blob, base, entries)


def _head(first: bytes, size: int, read: Callable[[int], bytes]) -> bytes:
    """A payload's length field (``first``, its first 8 bytes) and the header it announces (``read(n)``: the n bytes
    after the length field) — only those: slicing more of a mapped payload costs a copy of the weights."""
    if len(first) < 8:
        return first
    (length,) = struct.unpack("<Q", first)
    return first + read(min(length, _MAX_HEADER, max(0, size - 8)))


def _head_of(view: memoryview) -> bytes:
    return _head(bytes(view[:8]), len(view), lambda n: bytes(view[8 : 8 + n]))


def map_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors backed by a private (copy-on-write) memory map of ``path``; they stay valid after return."""
    with open(path, "rb") as handle:
        size = Path(path).stat().st_size
        if size < 8:
            raise MalformedSafetensors(f"{path}: {size} bytes is too short for a safetensors file")
        view = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    base, entries, _ = _parse(_head_of(memoryview(view)), size, str(path))
    return _views(view, base, entries)


def _layout(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> tuple[dict[str, Any], bytes]:
    """The header (by name, with ``__end__``: the data's size) and its padded JSON bytes."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name]
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    header["__end__"] = offset
    return header, raw + b" " * (-len(raw) % _HEADER_ROUND)


def safetensors_size(tensors: Mapping[str, torch.Tensor], *, metadata: Mapping[str, str]) -> int:
    """The size of the file :func:`write_safetensors` writes for these tensors and metadata."""
    header, padded = _layout(tensors, metadata)
    return 8 + len(padded) + int(header["__end__"])


def write_safetensors(path: str | Path, tensors: Mapping[str, torch.Tensor], *, metadata: Mapping[str, str]) -> None:
    """Write contiguous CPU ``tensors`` to ``path``; a file already there of the same size is overwritten in place
    (header first), any other is replaced."""
    header, padded = _layout(tensors, metadata)
    base = 8 + len(padded)
    size = base + header["__end__"]
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, 0)
            os.ftruncate(fd, size)
        _pwrite_all(fd, struct.pack("<Q", len(padded)) + padded, 0)
        for name in sorted(tensors):
            if tensors[name].numel():
                _pwrite_all(fd, _bytes(tensors[name]), base + header[name]["data_offsets"][0])
    finally:
        os.close(fd)


def serialize_safetensors(tensors: Mapping[str, torch.Tensor], *, metadata: Mapping[str, str]) -> bytearray:
    """``tensors`` (contiguous, on the CPU) as one safetensors blob, each tensor's bytes copied once."""
    header, padded = _layout(tensors, metadata)
    base = 8 + len(padded)
    blob = bytearray(base + header["__end__"])
    blob[:base] = struct.pack("<Q", len(padded)) + padded
    view = memoryview(blob)
    for name in sorted(tensors):
        begin, end = header[name]["data_offsets"]
        if end > begin:
            view[base + begin : base + end] = memoryview(_bytes(tensors[name])).cast("B")
    return blob


class CheckedTensors(dict[str, torch.Tensor]):
    """Tensors whose floating-point values were all checked finite as they were read (``values_checked``)."""

    values_checked = True


def read_safetensors_into(
    path: str | Path, into: Mapping[str, torch.Tensor] | None = None, *, version: str | None = None
) -> CheckedTensors:
    """The file's tensors, read into ``into``'s tensors where it names exactly the file's tensors with the same
    shapes and dtypes (contiguous, on the CPU), else into new ones. ``version``: the ``version`` the file's
    metadata must hold where it has one (files written before versions were recorded have none). Floating-point
    values are checked finite chunk by chunk as they arrive, while the chunk is in the cache (a second pass over
    the weights costs about half a copy). Raises :class:`MalformedSafetensors` for a bad file, one rewritten
    while it was read, or a NaN or infinity."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        first = os.pread(fd, 8, 0)
        header_len = struct.unpack("<Q", first)[0] if len(first) == 8 else 0
        head = first + os.pread(fd, min(header_len, _MAX_HEADER, max(0, size - 8)), 8)
        base, entries, metadata = _parse(head, size, str(path))
        if version is not None and "version" in metadata and metadata["version"] != version:
            raise MalformedSafetensors(
                f"{path}: holds version {metadata.get('version')!r}, expected {version!r} (rewritten since)"
            )
        fits = (
            into is not None
            and set(into) == set(entries)
            and all(
                t.device.type == "cpu"
                and t.is_contiguous()
                and t.dtype == entries[n].dtype
                and tuple(t.shape) == entries[n].shape
                for n, t in into.items()
            )
        )
        targets = (
            dict(into)
            if fits and into is not None
            else {n: torch.empty(e.shape, dtype=e.dtype) for n, e in entries.items()}
        )
        for name, entry in sorted(entries.items(), key=lambda item: item[1].begin):
            if entry.end == entry.begin:
                continue
            target = targets[name]
            raw = memoryview(_bytes(target))
            flat = target.reshape(-1)
            step = max(1, _CHECK_CHUNK // target.element_size()) * target.element_size()
            for lo in range(0, len(raw), step):
                hi = min(lo + step, len(raw))
                _pread_all(fd, raw[lo:hi], base + entry.begin + lo)
                values = flat[lo // target.element_size() : hi // target.element_size()]
                if values.is_floating_point() and not all_finite(values):
                    raise NonFiniteValues(f"{name}: contains NaN or infinite values")
        if os.pread(fd, len(head), 0) != head:
            raise MalformedSafetensors(f"{path}: rewritten while it was being read")
        return CheckedTensors(targets)
    finally:
        os.close(fd)


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _pread_all(fd: int, target: Any, offset: int) -> None:
    view = memoryview(target).cast("B")
    while view:
        got = os.preadv(fd, [view], offset)
        if got == 0:
            raise MalformedSafetensors(f"file ended at byte {offset}: truncated while it was being read")
        view, offset = view[got:], offset + got
