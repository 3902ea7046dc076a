"""One buffer for a whole set of weights: the byte layout both ends of a packed broadcast agree on.

A packed broadcast sends every tensor of a version in one collective instead of one per tensor (each costs a
round of synchronisation between the ranks). Layout: the tensors in the agreed (sorted) name order, each starting
at a multiple of ``ALIGN`` bytes. A CPU engine keeps its two sets of weights packed this way, so a receiver reads
a version straight into its standby set; anything else receives into a buffer of its own.

Non-goals: buckets (one buffer per version: the sender holds one packed copy of the weights).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

__all__ = ["ALIGN", "allocate_packed", "is_packed", "packed_layout", "packed_region", "packed_views"]

ALIGN = 64  # bytes: every tensor's start, so that a view of any dtype is aligned

Layout = dict[str, tuple[int, int]]  # name -> (first byte, end byte) in the buffer


def packed_layout(
    names: Sequence[str], dtypes: Sequence[torch.dtype], shapes: Sequence[Sequence[int]]
) -> tuple[Layout, int]:
    """Each tensor's byte range and the buffer's size."""
    layout: Layout = {}
    offset = 0
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        offset = -(-offset // ALIGN) * ALIGN
        end = offset + math.prod(shape) * dtype.itemsize
        layout[name] = (offset, end)
        offset = end
    return layout, -(-offset // ALIGN) * ALIGN


def packed_views(
    flat: torch.Tensor, layout: Layout, dtypes: Sequence[torch.dtype], shapes: Sequence[Sequence[int]]
) -> dict[str, torch.Tensor]:
    """Views of ``flat`` (uint8) as the tensors of ``layout`` (in its order)."""
    return {
        name: flat[lo:hi].view(dtype).view(tuple(shape))
        for (name, (lo, hi)), dtype, shape in zip(layout.items(), dtypes, shapes, strict=True)
    }


def _layout_of(like: Mapping[str, torch.Tensor]) -> tuple[Layout, int, list[torch.dtype], list[tuple[int, ...]]]:
    names = sorted(like)
    dtypes = [like[n].dtype for n in names]
    shapes = [tuple(like[n].shape) for n in names]
    layout, total = packed_layout(names, dtypes, shapes)
    return layout, total, dtypes, shapes


def is_packed(tensors: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``tensors`` are views of one packed buffer in their sorted name order."""
    layout, total, _, _ = _layout_of(tensors)
    return packed_region(tensors, layout, total) is not None


def allocate_packed(like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Uninitialised tensors shaped like ``like``'s, views of one packed buffer (sorted name order)."""
    layout, total, dtypes, shapes = _layout_of(like)
    device = next(iter(like.values())).device if like else torch.device("cpu")
    return packed_views(torch.empty(total, dtype=torch.uint8, device=device), layout, dtypes, shapes)


def packed_region(tensors: Mapping[str, torch.Tensor], layout: Layout, total: int) -> torch.Tensor | None:
    """The uint8 buffer ``tensors`` tile in ``layout`` (they are views of one storage at exactly its offsets),
    or None when they do not."""
    if not layout or not set(layout) <= set(tensors):
        return None
    first = tensors[next(iter(layout))]
    storage = first.untyped_storage()
    start = first.data_ptr() - storage.data_ptr() - layout[next(iter(layout))][0]
    if start < 0 or start + total > storage.nbytes():
        return None
    for name, (lo, hi) in layout.items():
        t = tensors[name]
        if (
            t.untyped_storage().data_ptr() != storage.data_ptr()
            or t.data_ptr() - storage.data_ptr() != start + lo
            or not t.is_contiguous()
            or t.numel() * t.element_size() != hi - lo
        ):
            return None
    flat = torch.empty(0, dtype=torch.uint8, device=first.device)
    return flat.set_(storage, start, (total,), (1,))
