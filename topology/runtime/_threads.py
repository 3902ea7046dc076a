"""Sizing a replica's thread pools from its ``resources.num_cpus`` (the rule itself: `topology._names.torch_threads`).

Contract: `thread_env` is the environment a replica process starts with (OpenMP / MKL / OpenBLAS pools); `size_torch`
sets torch's intra- and inter-op pools once torch is loaded — this module never imports torch itself.

Non-goals: CPU pinning, cgroups.
"""

from __future__ import annotations

import sys
from typing import Any

from topology._names import torch_threads

__all__ = ["size_torch", "thread_env"]


def thread_env(num_cpus: float) -> dict[str, str]:
    """The environment variables that size native thread pools of a replica given ``num_cpus`` cores."""
    threads = str(torch_threads(num_cpus))
    return {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}


def size_torch(num_cpus: float) -> int | None:
    """Give torch ``torch_threads(num_cpus)`` threads if torch is loaded; returns what was set (None: not loaded)."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return None
    threads = torch_threads(num_cpus)
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # only settable before the first parallel op; the intra-op pool is what matters
        pass
    return threads
