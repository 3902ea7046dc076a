"""Zero-copy reading of a safetensors file: tensors that are views of the memory-mapped file.

The disk (and ``/dev/shm``) weight path costs one copy on the way in — from the page cache straight into the
engine's parameters — instead of the two a regular load takes (file → new tensors → parameters). The format
is simple enough to read here: an 8-byte little-endian header length, a JSON header naming every tensor's
dtype, shape and byte range, then the data. Every byte range is checked against the file's size and the
dtype/shape, so a truncated or malformed file is rejected before any tensor is built.

Non-goals: writing (``safetensors.torch.save_file`` does that), big-endian hosts.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from pathlib import Path

import torch

__all__ = ["MalformedSafetensors", "map_safetensors"]

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
_MAX_HEADER = 100 * 1024 * 1024


class MalformedSafetensors(ValueError):
    pass


def map_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors backed by a private (copy-on-write) memory map of ``path``; they stay valid after return."""
    with open(path, "rb") as handle:
        size = Path(path).stat().st_size
        if size < 8:
            raise MalformedSafetensors(f"{path}: {size} bytes is too short for a safetensors file")
        view = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    (header_len,) = struct.unpack("<Q", view[:8])
    if header_len > min(_MAX_HEADER, size - 8):
        raise MalformedSafetensors(f"{path}: header length {header_len} does not fit a {size}-byte file")
    try:
        header = json.loads(view[8 : 8 + header_len])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedSafetensors(f"{path}: unreadable header: {exc}") from None
    if not isinstance(header, dict):
        raise MalformedSafetensors(f"{path}: header is not a JSON object")
    base = 8 + header_len
    tensors: dict[str, torch.Tensor] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES[entry["dtype"]]
            shape = [int(d) for d in entry["shape"]]
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedSafetensors(f"{path}: bad header entry for {name!r}: {exc!r}") from None
        count = math.prod(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end or base + end > size or end - begin != count * itemsize:
            raise MalformedSafetensors(
                f"{path}: {name} claims bytes {begin}..{end} of a {size - base}-byte "
                f"payload for {count} × {itemsize} bytes (truncated or corrupted)"
            )
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(view, dtype=dtype, count=count, offset=base + begin)
        tensors[name] = flat.view(shape)
    return tensors
