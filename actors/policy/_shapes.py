"""Whether weights fit a model by name and shape — one rule for tensors in memory (`Policy.validate_state_dict`) and
for a checkpoint's safetensors headers read before anything loads (`actors.policy._checks`). Light: no torch.

Non-goals: dtypes and values (the caller that holds tensors checks those).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["shape_mismatch"]


def shape_mismatch(expected: Mapping[str, Sequence[int]], found: Mapping[str, Sequence[int]]) -> str | None:
    """Why weights named and shaped ``found`` do not fit a model's ``expected``: the names missing and unexpected (a
    count and an example each), else the first shape that differs; None when they fit."""
    missing = [name for name in expected if name not in found]
    unexpected = [name for name in found if name not in expected]
    if missing or unexpected:
        parts = [f"{len(missing)} missing (e.g. {missing[0]!r})"] if missing else []
        parts += [f"{len(unexpected)} unexpected (e.g. {unexpected[0]!r})"] if unexpected else []
        return f"weight names do not match the model: {', '.join(parts)}"
    for name, shape in expected.items():
        if tuple(found[name]) != tuple(shape):
            return f"{name}: shape {tuple(found[name])} does not match the model's {tuple(shape)}"
    return None
