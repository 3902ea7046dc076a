"""What a published weight version is: a manifest of names, shapes and dtypes, and checks against it.

A manifest travels through the KV bucket (small JSON); the tensors travel through a transport. A subscriber
checks what it received against the manifest *and* against the model it serves before anything touches the
live weights, so a corrupted, truncated or mismatched payload is rejected with a message that names the
tensors at fault.

Non-goals: no tensor I/O here (transports do it) and no trust model: the bus is assumed to be ours.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import torch

__all__ = ["TensorInfo", "WeightManifest", "WeightPayloadError", "check_state_dict", "describe"]


class WeightPayloadError(ValueError):
    """A weight payload does not match what was announced or what the model expects."""


class WeightPayloadGone(WeightPayloadError):
    """The announced version's payload no longer exists and never will again (its shared-memory slot belonged to a
    run before a resume, or was rewritten with a newer version): the next announcement is the one to load."""


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "float32"

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorInfo:
        return cls(tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))


@dataclass(frozen=True)
class WeightManifest:
    version: int
    transport: str  # "object-store" | "disk" | "broadcast"
    location: str  # object name, directory path or group name — meaning is the transport's
    tensors: Mapping[str, TensorInfo]
    nbytes: int
    digest: str = ""  # sha256 of the payload bytes where the transport has one
    published_at: float = field(default_factory=time.time)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "version": self.version,
                "transport": self.transport,
                "location": self.location,
                "tensors": {name: [list(info.shape), info.dtype] for name, info in self.tensors.items()},
                "nbytes": self.nbytes,
                "digest": self.digest,
                "published_at": self.published_at,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> WeightManifest:
        try:
            raw: dict[str, Any] = orjson.loads(data)
            tensors = {
                name: TensorInfo(tuple(int(d) for d in shape), str(dtype))
                for name, (shape, dtype) in raw["tensors"].items()
            }
            return cls(
                version=int(raw["version"]),
                transport=str(raw["transport"]),
                location=str(raw["location"]),
                tensors=tensors,
                nbytes=int(raw["nbytes"]),
                digest=str(raw.get("digest", "")),
                published_at=float(raw.get("published_at", 0.0)),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise WeightPayloadError(f"unreadable weight manifest: {exc}") from exc


def describe(state_dict: Mapping[str, torch.Tensor]) -> dict[str, TensorInfo]:
    return {name: TensorInfo.of(tensor) for name, tensor in state_dict.items()}


def check_state_dict(
    state_dict: Mapping[str, torch.Tensor], expected: Mapping[str, TensorInfo], *, what: str = "payload"
) -> None:
    """Raise :class:`WeightPayloadError` listing every missing, unexpected or mismatched tensor."""
    problems: list[str] = []
    missing = sorted(set(expected) - set(state_dict))
    extra = sorted(set(state_dict) - set(expected))
    if missing:
        problems.append(f"missing {_names(missing)}")
    if extra:
        problems.append(f"unexpected {_names(extra)}")
    for name in sorted(set(expected) & set(state_dict)):
        got, want = TensorInfo.of(state_dict[name]), expected[name]
        if got.shape != want.shape:
            problems.append(f"{name}: shape {list(got.shape)}, expected {list(want.shape)}")
        if got.dtype != want.dtype:
            problems.append(f"{name}: dtype {got.dtype}, expected {want.dtype}")
    if problems:
        raise WeightPayloadError(
            f"{what} rejected: "
            + "; ".join(problems[:8])
            + (f"; … {len(problems) - 8} more" if len(problems) > 8 else "")
        )


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")
