"""Weight broadcast over a torch.distributed group: the trainer side and the receiving side.

Contract: the trainer is rank 0 of a group of ``world_size`` (1 + the server's ranks). Both sides meet on
a TCPStore at ``master_address:master_port`` (rank 0 hosts it) and build the group with the same store key
layout as SGLang's and vLLM's ``init_custom_process_group`` (prefix ``<group_name>`` then
``<group_name>/`` then ``<device>/`` per backend device), so a real server can join the trainer's group.
Every update broadcasts the tensors one by one, in the order of the ``names`` list both sides agreed on
(:func:`describe` sorts by name) — what SGLang's and vLLM's receivers expect — or, between our own ends
(``packed=True``: the ``distributed`` transport to torch engines), all of them in one buffer laid out by
:mod:`actors.engines._packing`, which a CPU engine's standby set already is: one collective per version. The
receiving side stages every declared tensor first, then validates names, shapes and dtypes against what the
engine expects, and only then hands the whole set over — a bad payload is drained off the wire (so the trainer
never hangs) and rejected without touching the engine.

Non-goals: no buckets (a packed version is one buffer), no multi-server fan-out in one group (one group per
server), no fault tolerance inside a collective — a peer that dies mid-broadcast surfaces as a timeout.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore
from torch.distributed.distributed_c10d import BackendConfig

from actors.engines._packing import packed_layout, packed_region, packed_views
from actors.policy import all_finite

__all__ = [
    "Broadcaster",
    "DistributedWeights",
    "WeightBroadcaster",
    "WeightGroup",
    "describe",
    "parse_dtype",
    "receive_weights",
]

Backend = Literal["gloo", "nccl"]


def parse_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` / ``"torch.bfloat16"`` → ``torch.bfloat16``; ValueError naming the bad string."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} (expected a torch dtype name such as 'float32')")
    return dtype


def describe(tensors: Mapping[str, torch.Tensor]) -> tuple[list[str], list[str], list[list[int]]]:
    """Names (sorted), dtype names and shapes: the metadata both sides of a broadcast agree on."""
    names = sorted(tensors)
    dtypes = [str(tensors[n].dtype).removeprefix("torch.") for n in names]
    shapes = [list(tensors[n].shape) for n in names]
    return names, dtypes, shapes


class WeightGroup:
    """One rank's membership of a weight-broadcast group (built without touching torch's default group)."""

    def __init__(
        self,
        master_address: str,
        master_port: int,
        world_size: int,
        rank: int,
        *,
        backend: Backend = "gloo",
        group_name: str = "weight_update_group",
        timeout_s: float = 120.0,
    ) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        self.rank = rank
        self.world_size = world_size
        self.backend: Backend = backend
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        timeout = datetime.timedelta(seconds=timeout_s)
        # Blocks until all `world_size` ranks reached the store (rank 0 hosts it), or `timeout` passes.
        self._store = TCPStore(master_address, master_port, world_size, rank == 0, timeout=timeout)
        group_store = PrefixStore(f"{group_name}/", PrefixStore(group_name, self._store))
        self._backends: dict[str, Any] = {}
        for device, backend_name in BackendConfig(dist.Backend(backend)).get_device_backend_map().items():
            device_store = PrefixStore(f"{device}/", group_store)
            if backend_name == "gloo":
                self._backends[device] = dist.ProcessGroupGloo(device_store, rank, world_size, timeout)
            else:
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                self._backends[device] = dist.ProcessGroupNCCL(device_store, rank, world_size, options)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """In-place broadcast from rank 0 (blocking)."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self._backends[tensor.device.type].broadcast([tensor], options).wait()

    def close(self) -> None:
        self._backends.clear()


@dataclass
class WeightBroadcaster:
    """The trainer (rank 0) side. ``connect()`` blocks until every server rank has joined."""

    master_address: str
    master_port: int
    world_size: int
    backend: Backend = "gloo"
    group_name: str = "weight_update_group"
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.world_size < 2:
            raise ValueError(f"world_size must be >= 2 (the trainer plus >= 1 server rank), got {self.world_size}")
        self._group: WeightGroup | None = None
        self._lock = threading.Lock()
        self._flat: torch.Tensor | None = None  # the packed buffer, reused by the next version of the same size

    @property
    def connected(self) -> bool:
        return self._group is not None

    def connect(self) -> None:
        with self._lock:
            if self._group is None:
                self._group = WeightGroup(
                    self.master_address,
                    self.master_port,
                    self.world_size,
                    0,
                    backend=self.backend,
                    group_name=self.group_name,
                    timeout_s=self.timeout_s,
                )

    def broadcast(self, tensors: Mapping[str, torch.Tensor], *, packed: bool = False) -> list[str]:
        """Broadcast every tensor in :func:`describe` order (``packed``: copied into one buffer in that order, its
        values checked finite on the way — a version with a NaN is not sent, ValueError — and sent at once; the
        receivers must pass ``packed=True`` too and need not check the values again); returns that order."""
        if self._group is None:
            raise RuntimeError("WeightBroadcaster.broadcast() before connect()")
        names, _, shapes = describe(tensors)
        with self._lock, torch.no_grad():
            if not packed:
                for name in names:
                    tensor = tensors[name].detach().to(self._group.device).contiguous()
                    self._group.broadcast(tensor)
                return names
            layout, total = packed_layout(names, [tensors[n].dtype for n in names], shapes)
            flat = self._flat if self._flat is not None and self._flat.numel() == total else None
            if flat is None or flat.device != self._group.device:
                flat = self._flat = torch.empty(total, dtype=torch.uint8, device=self._group.device)
            for name, (lo, hi) in layout.items():
                if hi > lo:
                    source = tensors[name].detach().contiguous().reshape(-1)
                    flat[lo:hi].copy_(source.view(torch.uint8))
                    if source.is_floating_point() and not all_finite(source):  # while it is in the cache
                        raise ValueError(f"{name}: contains NaN or infinite values: not sent")
            self._group.broadcast(flat)
        return names

    def close(self) -> None:
        with self._lock:
            if self._group is not None:
                self._group.close()
                self._group = None


class Broadcaster(Protocol):
    """The trainer side as the engines use it; :class:`WeightBroadcaster` is one, a wrapper around vLLM's
    ``NCCLWeightTransferEngine.trainer_init``/``trainer_send_weights`` can be another."""

    master_address: str
    master_port: int
    world_size: int
    backend: Backend
    group_name: str
    timeout_s: float

    def connect(self) -> None: ...

    def broadcast(self, tensors: Mapping[str, torch.Tensor]) -> list[str]: ...


@dataclass(frozen=True)
class DistributedWeights:
    """A weight source for the HTTP engines: these tensors, sent through this broadcaster's group."""

    broadcaster: Broadcaster
    tensors: Mapping[str, torch.Tensor]


def receive_weights(
    group: WeightGroup,
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    expected: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
    *,
    into: Mapping[str, torch.Tensor] | None = None,
    packed: bool = False,
) -> dict[str, torch.Tensor]:
    """The receiving side of one update: stage every declared tensor, then validate against ``expected``.

    A tensor of ``into`` (an engine's standby weights) with the declared shape, dtype and the group's device is
    received into directly (no buffer of its own, no copy), and its values are left to ``into``'s owner to check
    (``TorchEngine.update_weights_from`` checks every value of its standby set); the others go into new buffers
    and are checked here. ``packed``: the sender sent one buffer (``WeightBroadcaster.broadcast(packed=True)``,
    which checked the values finite before sending: the result says so, ``values_checked``); it is received
    straight into ``into`` where ``into`` is packed in the same layout (a CPU engine's standby set), else into a
    buffer whose views are returned.

    Raises ValueError naming the first problem; by then the whole payload has been drained, so the trainer's
    broadcast completes either way. Parameters the payload omits keep their current values (partial updates
    are allowed); names the engine does not know, or wrong shapes, are errors. Tensors are returned in the
    engine's dtype.
    """
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"names/dtypes/shapes have different lengths ({len(names)}/{len(dtypes)}/{len(shapes)})")
    parsed: list[torch.dtype] = []
    for name, dtype_name in zip(names, dtypes, strict=True):
        try:
            parsed.append(parse_dtype(dtype_name))
        except ValueError as exc:
            # Cannot size the buffer: the stream is now out of step, so stop here.
            raise ValueError(f"{name}: {exc}") from None
    problems: list[str] = []
    staged: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        views: Mapping[str, torch.Tensor] = {}
        if packed:
            layout, total = packed_layout(names, parsed, shapes)
            flat = packed_region(into or {}, layout, total)
            direct = (
                flat is not None
                and flat.device == group.device
                and all((into or {})[n].dtype == d for n, d in zip(names, parsed, strict=True))
            )
            if not direct or flat is None:
                flat = torch.empty(total, dtype=torch.uint8, device=group.device)
            group.broadcast(flat)
            views = (into or {}) if direct else packed_views(flat, layout, parsed, shapes)
        for name, dtype, shape in zip(names, parsed, shapes, strict=True):
            if packed:
                buffer, fits = views[name], True  # its values: checked by the sender
            else:
                target = (into or {}).get(name)
                fits = (
                    target is not None
                    and tuple(target.shape) == tuple(shape)
                    and target.dtype == dtype
                    and target.device == group.device
                    and target.is_contiguous()
                )
                buffer = (
                    target
                    if fits and target is not None
                    else torch.empty(tuple(shape), dtype=dtype, device=group.device)
                )
                group.broadcast(buffer)
            if name not in expected:
                problems.append(f"unknown parameter {name!r}")
                continue
            want_shape, want_dtype = expected[name]
            if tuple(shape) != want_shape:
                problems.append(f"{name}: shape {list(shape)} does not match the model's {list(want_shape)}")
                continue
            if not fits and buffer.is_floating_point() and not all_finite(buffer):
                problems.append(f"{name}: contains NaN or inf")
                continue
            staged[name] = buffer.to(want_dtype)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValueError(problems[0] + more)
    return _SenderChecked(staged) if packed else staged


class _SenderChecked(dict[str, torch.Tensor]):
    """Tensors of a packed broadcast: their sender checked every value finite before sending."""

    values_checked = True
