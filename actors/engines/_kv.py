"""Batch-level KV-cache surgery for continuous batching: merge left-padded batches, keep a subset of rows.

Contract: a batch is ``(cache, mask)`` — ``cache`` one ``(keys, values)`` pair per layer, each
``[rows, heads, length, head_dim]``, and ``mask`` ``[rows, length]`` with 1 for real tokens. Rows are
left-padded: real tokens of a row are contiguous and end at the last column. Both functions return new
tensors and never change the inputs. Position ids are not stored: callers derive them from the mask.
Non-goals: paging, in-place growth (each decode step concatenates; fine at the sizes the engine targets).
"""

from __future__ import annotations

import torch
from torch import Tensor

from actors.policy import KVCache


def merge(cache_a: KVCache, mask_a: Tensor, cache_b: KVCache, mask_b: Tensor) -> tuple[KVCache, Tensor]:
    """Stack batch ``b``'s rows under batch ``a``'s, left-padding the shorter one to a common length."""
    width = max(mask_a.shape[1], mask_b.shape[1])
    cache = [
        (
            torch.cat((_left_pad(ka, width), _left_pad(kb, width))),
            torch.cat((_left_pad(va, width), _left_pad(vb, width))),
        )
        for (ka, va), (kb, vb) in zip(cache_a, cache_b, strict=True)
    ]
    return cache, torch.cat((_left_pad(mask_a, width), _left_pad(mask_b, width)))


def keep_rows(cache: KVCache, mask: Tensor, rows: list[int]) -> tuple[KVCache, Tensor]:
    """Keep ``rows`` (non-empty, in that order) and drop leading columns that are padding in all of them."""
    index = torch.tensor(rows, device=mask.device)
    kept = mask.index_select(0, index)
    start = int(kept.any(dim=0).long().argmax())
    new_cache = [(k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:]) for k, v in cache]
    return new_cache, kept[:, start:]


def _left_pad(tensor: Tensor, width: int) -> Tensor:
    """Left-pad the sequence axis (dim 2 of a cache tensor, dim 1 of a mask) with zeros to ``width``."""
    axis = 2 if tensor.dim() == 4 else 1
    missing = width - tensor.shape[axis]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[axis] = missing
    return torch.cat((tensor.new_zeros(shape), tensor), dim=axis)
