"""Copying weights in one pass: the bytes go in pieces on worker threads of one OpenMP thread each, and each piece's
values are checked finite while the piece is still in the cache. The learner's copy into a shared-memory slot.

- Why pieces on threads of their own: a copy per tensor on the calling thread's torch pool, then a second pass to
  check the values, took up to twice as long (bench/RESULTS.md, 2026-12-05); and in a thread pool worker that pool
  is a second team of OpenMP threads on cores the caller's own team already uses.
- Why not ``torch.set_num_threads(1)`` in those threads: it also sets the pool size that every thread started
  later begins with (a learner's next training thread would run on one core). The worker threads set their own
  OpenMP pool through the OpenMP runtime torch loaded; where that is not found, their ops use torch's pool as
  they are: slower, as correct.

Non-goals: sources on a GPU or not contiguous (made contiguous CPU tensors first, whole: one copy more).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch

from actors.policy import all_finite

__all__ = ["PIECE", "copy_checked"]

PIECE = 8 << 20  # bytes copied, then checked, at a time: the piece is still in the cache when it is read again
_MAX_LANES = 8


class _Piece(NamedTuple):
    name: str
    source: torch.Tensor  # uint8
    target: torch.Tensor  # uint8
    values: torch.Tensor | None  # the source's floating-point values, to check


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(_MAX_LANES, thread_name_prefix="flywheel-copy", initializer=_one_thread)


def _one_thread() -> None:
    """Run this thread's torch ops on this thread alone (see the module docstring)."""
    torch.get_num_threads()  # torch sizes a thread's pool when first asked (or at its first op): ours comes after
    for library in ("libgomp.so.1", "libiomp5.so", "libomp.so"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(library, mode=os.RTLD_NOLOAD).omp_set_num_threads(1)  # only one already loaded
            if torch.get_num_threads() == 1:
                return


def copy_checked(jobs: Sequence[tuple[str, torch.Tensor, torch.Tensor]], *, lanes: int) -> str | None:
    """Copy each ``(name, source, target)`` — tensors of the same number of bytes, the target a contiguous CPU one
    (a uint8 range at any offset, say) — in pieces of at most :data:`PIECE` bytes on ``lanes`` threads (at most 8),
    and check each piece's floating-point values finite right after its copy. Returns the name of a tensor with a
    NaN or an infinity (its copy may be partly done), or None when every value is finite."""
    pieces: list[_Piece] = []
    for name, source, target in jobs:
        flat = source.detach().to("cpu").contiguous().reshape(-1)  # (no copy for a contiguous CPU tensor)
        raw, out = flat.view(torch.uint8), target.reshape(-1).view(torch.uint8)
        if raw.numel() != out.numel():
            raise ValueError(f"{name}: {raw.numel()} bytes into {out.numel()}")
        step = PIECE // flat.element_size()
        for first in range(0, flat.numel(), step):
            begin = first * flat.element_size()
            values = flat[first : first + step] if flat.is_floating_point() else None
            pieces.append(_Piece(name, raw[begin : begin + PIECE], out[begin : begin + PIECE], values))
    total = sum(piece.source.numel() for piece in pieces)
    # a lane per piece's worth of bytes at most: below that, handing tensors back and forth between threads costs
    # more than the copy (a 4-MB model's many small tensors took twice as long on two lanes as on one)
    lanes = max(1, min(lanes, _MAX_LANES, len(pieces), -(-total // PIECE)))
    shares: list[list[_Piece]] = [[] for _ in range(lanes)]
    loads = [0] * lanes
    for piece in pieces:  # each to the lane with the fewest bytes so far: the lanes finish together
        k = loads.index(min(loads))
        shares[k].append(piece)
        loads[k] += piece.source.numel()
    bad = [name for name in _pool().map(_lane, shares) if name is not None]
    return bad[0] if bad else None


def _lane(pieces: list[_Piece]) -> str | None:
    """Copy these pieces one after the other, each checked right after its copy; the name of the first tensor with a
    non-finite value among them (the lane stops there), or None."""
    for piece in pieces:
        _copy_piece(piece)
        if piece.values is not None and not all_finite(piece.values):  # read from the source: a target need not
            return piece.name  # start at a multiple of the item size
    return None


def _copy_piece(piece: _Piece) -> None:
    """One piece's copy, a function of its own so that a test can stop a writer in the middle of a publish."""
    piece.target.copy_(piece.source)
