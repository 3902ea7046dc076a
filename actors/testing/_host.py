"""What both fake servers need around a :class:`TorchEngine`: admission, pause modes, weight receipt.

Contract: :meth:`EngineHost.generate` waits while the host is paused, then runs the request on the engine
and tracks it as in flight. Pause modes mirror the real servers:

* ``abort`` — new requests wait; every in-flight request ends now with ``finish_reason="abort"`` and the
  tokens it has so far (the engine keeps stepping until they are out, then pauses);
* ``keep`` / ``in_place`` / ``retract`` — the engine stops between two steps; in-flight requests freeze and
  continue on resume (with whatever weights were loaded meanwhile);
* ``wait`` — new requests wait; in-flight requests run to completion before the call returns.

Weight payloads are validated in full before anything changes (the engine's own validation); a rejected
payload raises :class:`WeightUpdateError` and the old weights keep serving.
Non-goals: request priorities, several engines behind one host.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch

from actors.engines import Completion, GenerationRequest, TorchEngine, WeightGroup, WeightUpdateError, receive_weights

__all__ = ["EngineHost", "served_name"]


def served_name(engine: TorchEngine) -> str:
    """The model a real server started on the engine's model would name: a Hugging Face model's directory or hub id
    (what ``--model-path`` / ``vllm serve`` were given); ``fake/tiny-gpt`` for the builtin model."""
    name = engine.policy.name
    return name.removeprefix("hf:") if name.startswith("hf:") else "fake/tiny-gpt"


class EngineHost:
    def __init__(self, engine: TorchEngine) -> None:
        self.engine = engine
        # a server labels the weights it loads with a version; it does not order them (the same label again, too)
        engine.accepts_older = engine.accepts_same = True
        self._open = asyncio.Event()
        self._open.set()
        self._in_flight: Counter[str] = Counter()
        self._idle = asyncio.Event()
        self._idle.set()
        self._frozen = False
        self.group: WeightGroup | None = None
        self.counts: Counter[str] = Counter()
        self.loaded = engine.version != 0  # an engine at a version of its own stands for a server given one before

    @property
    def weight_version(self) -> str:
        """The label the real servers report: "default" for the weights they started with, else the version loaded."""
        return str(self.engine.version) if self.loaded else "default"

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    @property
    def in_flight(self) -> int:
        return sum(self._in_flight.values())

    async def generate(self, request: GenerationRequest) -> Completion:
        await self._open.wait()
        rid = request.request_id
        self._in_flight[rid] += 1
        self._idle.clear()
        try:
            [completion] = await self.engine.generate([request])
        finally:
            self._in_flight[rid] -= 1
            if self._in_flight[rid] <= 0:
                del self._in_flight[rid]
            if not self._in_flight:
                self._idle.set()
        self.counts["aborted" if completion.finish_reason == "abort" else "finished"] += 1
        return completion

    async def pause(self, mode: str) -> None:
        if mode not in ("abort", "keep", "in_place", "retract", "wait"):
            raise ValueError(f"unknown pause mode {mode!r} (expected abort, keep, in_place, retract or wait)")
        self._open.clear()
        if mode == "abort":
            if self._frozen:  # aborted requests only resolve at a step boundary
                await self.engine.resume()
                self._frozen = False
            for rid in list(self._in_flight):
                self.engine.abort(rid)
            await self._idle.wait()
        elif mode == "wait":
            await self._idle.wait()
        if not self._frozen:
            await self.engine.pause()
            self._frozen = True

    async def resume(self) -> None:
        if self._frozen:
            await self.engine.resume()
            self._frozen = False
        self._open.set()

    def abort_all(self) -> int:
        return sum(self.engine.abort(rid) for rid in list(self._in_flight))

    def next_version(self, requested: Any) -> int:
        """The engine version for an update: an integer-like ``requested`` or the current one plus one."""
        if requested is None or requested == "":
            return self.engine.version + 1
        try:
            return int(requested)
        except (TypeError, ValueError):
            raise WeightUpdateError(f"weight_version must be an integer, got {requested!r}") from None

    async def load_from_disk(self, path: str, version: int) -> None:
        await self.engine.update_weights(version, path)
        self.loaded = True

    def expected(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {n: (tuple(t.shape), t.dtype) for n, t in self.engine.policy.state_dict().items()}

    async def join_group(
        self, master_address: str, master_port: int, world_size: int, rank: int, backend: str, group_name: str
    ) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be gloo or nccl, got {backend!r}")
        if self.group is not None:
            self.group.close()
        self.group = await asyncio.to_thread(
            WeightGroup,
            master_address,
            master_port,
            world_size,
            rank,
            backend="nccl" if backend == "nccl" else "gloo",
            group_name=group_name,
            timeout_s=60.0,
        )

    async def receive_from_group(
        self, names: list[str], dtypes: list[str], shapes: list[list[int]], version: int
    ) -> None:
        """Receive one broadcast into staging tensors, validate, then swap into the engine."""
        if self.group is None:
            raise WeightUpdateError("no weight update group: call the group-init route first")
        try:
            staged = await asyncio.to_thread(receive_weights, self.group, names, dtypes, shapes, self.expected())
        except ValueError as exc:
            raise WeightUpdateError(f"version {version} rejected, still serving {self.engine.version}: {exc}") from None
        merged: Mapping[str, torch.Tensor] = {**self.engine.policy.state_dict(), **staged}
        await self.engine.update_weights(version, merged)
        self.loaded = True

    def leave_group(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    async def close(self) -> None:
        self.leave_group()
        self._open.set()
        with contextlib.suppress(Exception):
            await self.resume()
