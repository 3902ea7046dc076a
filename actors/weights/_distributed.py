"""The ``distributed`` weight transport: a torch.distributed broadcast from the learner to its generators.

Who is in the group: the learner is rank 0; the receivers are the replicas of every actor with ``weight_sync:
distributed`` (generators with ``engine: torch``) whose latest heartbeat says ``running`` (not stale). Each
version gets a group of its own, formed from that list — so a generator that crashed is simply left out, and
a restarted one is in the group of the next version (the "re-formed on the next version" rule). Works the same
between local processes and between Ray actors on different nodes.

One version, two phases (:meth:`DistributedTransport.put_announced`, driven by
:class:`~actors.weights.WeightPublisher`):
1. the manifest goes into KV first; its ``location`` is the rendezvous: ``{address, port, backend,
   group, ranks: {"<actor>.<replica>": rank}, join_by}`` (``join_by`` = wall-clock deadline to join);
2. the learner hosts the TCPStore at ``address:port`` and broadcasts every tensor (sorted by name) to the
   members, who build their side with :class:`~actors.engines._group.WeightGroup` and stage what they
   receive with :func:`~actors.engines._group.receive_weights` before the engine swaps it in.

The broadcast runs in a worker thread on a copy of the weights, so the learner keeps training meanwhile; the
next publish first waits for the previous broadcast (at most ``join_timeout_s`` plus the transfer). A member
that never joins makes that version's broadcast fail after ``join_timeout_s``: logged with the missing members
named, counted (``failures``, ``last_error``), never raised — generators keep their weights until the next one.

Backend: NCCL when the learner's weights are on CUDA and no member generator runs on ``device: cpu``; gloo
(CPU tensors) otherwise. Address: ``FLYWHEEL_WEIGHTS_ADDRESS`` if set, else the Ray node IP inside a Ray
actor, else the local address that routes to the bus (127.0.0.1 for a loopback bus).

Limits: a group per version costs one TCPStore plus one gloo/NCCL communicator set-up (milliseconds for gloo
on a LAN, up to seconds for NCCL) — publish every few seconds or slower. ``join_by`` compares wall clocks
across machines (keep them NTP-synced). SGLang/vLLM generators are not members: their servers join a
trainer's group through their own HTTP API (``DistributedWeights`` in ``actors.generator``). A member that
dies mid-broadcast fails that version for everyone; the learner sees it at once, but a surviving member can stay in
that version's group until its ``join_by``, so the next version (which waits for it) may take up to
``join_timeout_s`` longer. The free port is picked by binding port 0 then closing
it (a race with another process is possible and shows as one failed version).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import orjson
import torch

from actors.protocol import runs_on_cpu, weight_receivers, weights_bucket
from actors.weights._manifest import WeightManifest, WeightPayloadError, describe
from actors.weights._shared import SharedMemoryTransport, shm_root
from actors.weights._transports import ObjectStoreTransport, SafetensorsDirTransport, WeightTransport

if TYPE_CHECKING:
    from topology.runtime import ActorContext

__all__ = ["DistributedTransport", "advertise_address", "weight_transports"]

StateDict = Mapping[str, torch.Tensor]
Announce = Callable[[WeightManifest], Awaitable[None]]
_ENV_ADDRESS = "FLYWHEEL_WEIGHTS_ADDRESS"


def advertise_address(bus_url: str) -> str:
    """The address other ranks can reach this process at (see the module docstring)."""
    if os.environ.get(_ENV_ADDRESS):
        return os.environ[_ENV_ADDRESS]
    ray: Any = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return str(ray.util.get_node_ip_address())
    parsed = urlparse(bus_url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 4222
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet is sent: this only routes
        probe.connect((host, port))
        return str(probe.getsockname()[0])


def join_timeout_s() -> float:
    """How long a version's group waits for its members (``FLYWHEEL_WEIGHTS_JOIN_TIMEOUT_S``, default 30 s)."""
    return float(os.environ.get("FLYWHEEL_WEIGHTS_JOIN_TIMEOUT_S", "30"))


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


class DistributedTransport:
    """Both ends of the ``distributed`` transport: the learner calls ``put_announced`` (through
    :class:`~actors.weights.WeightPublisher`), a member generator calls ``get`` (through the subscriber)."""

    name = "distributed"
    announces = True  # WeightPublisher calls put_announced(): manifest in KV first, tensors after

    def __init__(self, ctx: ActorContext, *, join_timeout_s: float = 30.0) -> None:
        self.ctx = ctx
        self.join_timeout_s = join_timeout_s
        self.members = weight_receivers(ctx.spec)
        self.key = f"{ctx.actor}.{ctx.replica}"
        self.failures = 0
        self.last_error = ""
        self._previous: asyncio.Future[None] | None = None

    @classmethod
    def for_context(cls, ctx: ActorContext) -> DistributedTransport:
        return cls(ctx, join_timeout_s=join_timeout_s())

    # ------------------------------------------------------------------ sender (the learner, rank 0)
    async def put(self, version: int, state_dict: StateDict) -> WeightManifest:
        raise RuntimeError(
            "the distributed transport announces before it sends: publish through "
            "WeightPublisher.publish (it calls put_announced)"
        )

    async def put_announced(self, version: int, state_dict: StateDict, announce: Announce) -> WeightManifest:
        if self._previous is not None:  # one broadcast at a time; bounded by the join timeout
            await asyncio.shield(self._previous)
        alive = await self._alive_members()
        on_cuda = any(t.is_cuda for t in state_dict.values())
        backend = "nccl" if on_cuda and not self._cpu_member() else "gloo"
        device = "cuda" if backend == "nccl" else "cpu"
        tensors = {n: t.detach().to(device, copy=True).contiguous() for n, t in state_dict.items()}
        address = advertise_address(str(getattr(self.ctx.bus, "url", "") or ""))
        port = _free_port(address)
        ranks = {f"{a}.{r}": i + 1 for i, (a, r) in enumerate(alive)}
        location = {
            "address": address,
            "port": port,
            "backend": backend,
            "group": f"fw-{self.ctx.topology}-v{version}",
            "ranks": ranks,
            "join_by": time.time() + self.join_timeout_s,
        }
        manifest = WeightManifest(
            version,
            self.name,
            orjson.dumps(location).decode(),
            describe(tensors),
            sum(t.numel() * t.element_size() for t in tensors.values()),
        )
        await announce(manifest)
        # how many members each version goes to (a member whose heartbeat is stale is left out of it): in the
        # heartbeat, so a receiver that never gets a version can be told from one that was never asked
        self.ctx.counters.set("weights.members", len(ranks))
        if not ranks:
            self.ctx.counters.inc("weights.no_receivers")
            self.ctx.log.info("weights.no_receivers", version=version, members=len(self.members))
            return manifest
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._previous = done

        def send() -> None:
            error = ""
            try:
                self._send(location, tensors)
            except Exception as exc:  # a missing or dead member: this version fails, the learner goes on
                error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            loop.call_soon_threadsafe(self._sent, done, version, sorted(ranks), error)

        threading.Thread(target=send, name=f"weights-v{version}", daemon=True).start()
        return manifest

    def _send(self, location: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        from actors.engines import WeightBroadcaster

        broadcaster = WeightBroadcaster(
            location["address"],
            location["port"],
            len(location["ranks"]) + 1,
            backend=location["backend"],
            group_name=location["group"],
            timeout_s=self.join_timeout_s,
        )
        try:
            broadcaster.connect()
            broadcaster.broadcast(tensors, packed=True)  # every member is a torch engine: one collective
        finally:
            broadcaster.close()

    def _sent(self, done: asyncio.Future[None], version: int, members: list[str], error: str) -> None:
        if error:
            self.failures += 1
            self.last_error = (
                f"v{version}: weight broadcast to {', '.join(members)} failed within "
                f"{self.join_timeout_s:g}s ({error}); they keep their weights until the next version"
            )
            self.ctx.log.warning("weights.broadcast_failed", version=version, error=self.last_error)
            self.ctx.counters.inc("weights.broadcast_failed")
        else:
            self.ctx.counters.inc("weights.broadcast")
        if not done.done():
            done.set_result(None)

    async def _alive_members(self) -> list[tuple[str, int]]:
        from topology.runtime._status import read_status

        try:
            records = await read_status(self.ctx.bus, self.ctx.topology, self.members)
        except Exception as exc:
            self.ctx.log.warning("weights.status_unreadable", error=str(exc))
            return list(self.members)
        heartbeat_s = self.ctx.spec.runtime.heartbeat_s
        running = {(r.actor, r.replica) for r in records if r.state == "running" and not r.is_stale(heartbeat_s)}
        return [m for m in self.members if m in running]

    def _cpu_member(self) -> bool:
        return any(runs_on_cpu(self.ctx.spec.actors[a].config) for a, _ in self.members)

    # ------------------------------------------------------------------ receiver (a generator replica)
    async def get(
        self, manifest: WeightManifest, *, into: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        try:
            location = orjson.loads(manifest.location)
            ranks: dict[str, int] = location["ranks"]
            join_by = float(location["join_by"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise WeightPayloadError(f"v{manifest.version}: unreadable rendezvous in the manifest: {exc}") from exc
        if self.key not in ranks:
            raise WeightPayloadError(
                f"v{manifest.version}: {self.key} is not in this version's broadcast group "
                "(it was not running when the learner published); waiting for the next version"
            )
        left = join_by - time.time()
        if left <= 0:
            raise WeightPayloadError(
                f"v{manifest.version}: its broadcast window closed {-left:.1f}s ago; waiting for the next version"
            )
        return await asyncio.to_thread(self._receive, manifest, location, ranks[self.key], left, into)

    def _receive(
        self,
        manifest: WeightManifest,
        location: dict[str, Any],
        rank: int,
        timeout_s: float,
        into: Mapping[str, torch.Tensor] | None,
    ) -> dict[str, torch.Tensor]:
        from actors.engines import WeightGroup, parse_dtype, receive_weights

        names = sorted(manifest.tensors)
        dtypes = [manifest.tensors[n].dtype for n in names]
        shapes = [list(manifest.tensors[n].shape) for n in names]
        expected = {n: (manifest.tensors[n].shape, parse_dtype(manifest.tensors[n].dtype)) for n in names}
        try:
            group = WeightGroup(
                location["address"],
                int(location["port"]),
                len(location["ranks"]) + 1,
                rank,
                backend=location["backend"],
                group_name=location["group"],
                timeout_s=timeout_s,
            )
        except Exception as exc:  # TCPStore/gloo raise RuntimeError subclasses with long messages
            raise WeightPayloadError(
                f"v{manifest.version}: could not join the broadcast group at "
                f"{location['address']}:{location['port']}: {_first_line(exc)}"
            ) from exc
        try:
            staged = receive_weights(group, names, dtypes, shapes, expected, into=into, packed=True)
        except Exception as exc:
            raise WeightPayloadError(f"v{manifest.version}: broadcast failed: {_first_line(exc)}") from exc
        finally:
            group.close()
        return staged


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def weight_transports(ctx: ActorContext) -> dict[str, WeightTransport]:
    """Every transport of a topology by name — what a generator can receive from (the manifest says which one a
    version used) and what a learner or the gate can publish through: the bus's object store, safetensors
    directories under ``<run_dir>/weights``, the run's shared-memory slots, the torch.distributed broadcast. Built
    in one place so that every side agrees on the bucket and the directories."""
    return {
        "object-store": ObjectStoreTransport(ctx.bus, weights_bucket(ctx.topology)),
        "disk": SafetensorsDirTransport(ctx.run_dir / "weights"),
        "shm": SharedMemoryTransport(shm_root(ctx.run_dir), owner=ctx.run_dir),
        "distributed": DistributedTransport.for_context(ctx),
    }
