"""The learner's weight versions going out: the transport, when a version is due, and what happens when it cannot go.

Contract:
- Weights go out through the transport named by ``weight_transport`` — the same set the generators receive from
  (:func:`actors.weights.weight_transports`): the object store, a safetensors directory, shared-memory slots, or a
  torch.distributed broadcast to the generators configured with ``weight_sync: distributed``; ``auto`` (the default)
  is the shared-memory slots on the local runtime (the directory where an engine is SGLang or vLLM) and the object
  store on Ray. When ``auto`` chose the slots and the tmpfs has no room for one more, every version from then on
  goes through the disk (logged as ``learner.weight_transport_fallback``); a transport named outright fails instead.
- Cadence (:meth:`WeightsOut.due`): a version is due ``publish_every_steps`` steps and ``publish_min_interval_s``
  seconds after the previous one (``mode: sync``: after every step). A version not announced stays due.
- Numbering: the learner numbers a version past the newest on the bus; on start past every one this run published
  (:meth:`WeightsOut.numbered_past`: the newest of the checkpoint's, the KV's, the run's ``lifecycle`` metrics' and
  the ``newest_version`` file in the learner's state dir, written before each version is announced — which a bus that
  lost its store does not take away, nor a kill before the metrics' next flush; logged as
  ``learner.versions_past_the_bus``).
- Every version goes out with a ``publish`` row in the ``lifecycle`` metrics (which steps it holds: a sample applied
  at step s is in every version published at step >= s, and whether it is the current weights or their average), the
  ``publish_s`` counter and a ``learner.published`` log line.
- :func:`unless_bus_away`: the train loop's publishes (a version, a held-out round) do not fail the run while the bus
  is away (a restarting or frozen server): counted in ``bus_waits``, logged, and left due; the learner tries again
  while it waits for a batch (a second apart) and at its next step.

Non-goals: the transports themselves (``actors.weights``), choosing which weights go out (the learner: the current
ones, or the average for a held-out round), holding versions back while a round of the average is out (``_rounds``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable

import anyio.to_thread
import torch

from actors.learner._config import LearnerConfig
from actors.learner._metrics import MetricsWriter, newest_version
from actors.weights import SlotSpaceError, WeightPublisher, WeightTransport, weight_transports
from topology.bus import BUS_AWAY
from topology.runtime import ActorContext

__all__ = ["WeightsOut", "unless_bus_away"]


class WeightsOut:
    """The learner's weight publisher and the step and time of its last version."""

    def __init__(
        self, ctx: ActorContext, config: LearnerConfig, transport: WeightTransport, metrics: MetricsWriter
    ) -> None:
        self.ctx, self.metrics = ctx, metrics
        self.fallback = config.weight_transport == "auto"  # not asked for shared memory: may fall back to disk
        sync = config.mode == "sync"  # sync publishes after every step: the source waits for each version
        self.every = 1 if sync else config.publish_every_steps
        self.floor_s = 0.0 if sync else config.publish_min_interval_s
        self.step, self.at = 0, 0.0  # the last version's step and time.monotonic()
        self.publisher = WeightPublisher(ctx.bus, ctx.topology, transport)
        self.newest_file = ctx.state_dir / "newest_version"  # the newest version numbered, before it is announced

    def due(self, step: int) -> bool:
        """``publish_every_steps`` steps and ``publish_min_interval_s`` seconds since the last version."""
        return step - self.step >= self.every and time.monotonic() - self.at >= self.floor_s

    async def newest(self) -> int:
        """The newest version announced on the bus."""
        return await self.publisher.newest()

    async def numbered_past(self, version: int) -> int:
        """What the next version is numbered past (``version``: the checkpoint's): every one this run published, the
        newest of ``version``, the KV's and the run's lifecycle metrics' — which a bus that lost its store (the KV with
        it) does not take away."""
        recorded = max(await anyio.to_thread.run_sync(newest_version, self.ctx.run_dir), self._numbered())
        announced = await self.publisher.newest()
        if recorded > announced:
            self.ctx.log.warning(
                "learner.versions_past_the_bus",
                bus=announced,
                run=recorded,
                next=max(version, recorded) + 1,
                note="the bus's weights key is behind the versions this run published (a bus without its old store?): "
                "numbering on past the run's own",
            )
        return max(version, recorded)

    async def publish(self, version: int, state: dict[str, torch.Tensor], *, step: int, weights: str) -> None:
        """Publish ``state`` as ``version``, taken at ``step`` (``weights``: ``current`` or ``average``)."""
        self._number(version)
        try:
            await self.publisher.publish(version, state)
        except SlotSpaceError as exc:
            if not self.fallback:  # asked for shared memory: say so, do not pick another
                raise
            self._through_disk(str(exc))
            await self.publisher.publish(version, state)
        self.step, self.at = step, time.monotonic()
        # which steps each version holds: a sample applied at step s is in every version published at step >= s
        self.metrics.add(
            "lifecycle",
            {"ts": time.time(), "event": "publish", "step": step, "version": version, "weights": weights},
        )
        self.ctx.counters.set("publish_s", round(self.publisher.last_publish_s, 4))
        self.ctx.log.info("learner.published", version=version, step=step, weights=weights)

    def _numbered(self) -> int:
        """The newest version this learner numbered (0: none, or a state dir from before the file was kept)."""
        try:
            return int(self.newest_file.read_text())
        except (OSError, ValueError):
            return 0

    def _number(self, version: int) -> None:
        """Keep ``version`` as the newest numbered before any generator can see it: a later life numbers past it even
        when a kill took the metrics' last rows and the bus its store (a rename: never a torn number)."""
        partial = self.newest_file.with_name(".newest_version.part")
        try:
            self.newest_file.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(str(version))
            os.replace(partial, self.newest_file)
        except OSError as exc:  # a full disk, say: publishing goes on, the bus's key and the metrics still number
            self.ctx.counters.inc("newest_version_errors")
            self.ctx.log.warning("learner.newest_version_not_kept", version=version, error=str(exc))

    def _through_disk(self, reason: str) -> None:
        """``weight_transport: auto`` chose the shared-memory slots and the tmpfs has no room for one more (a
        container's /dev/shm is 64 MB unless it is given more): publish through safetensors files in the run dir from
        now on, as with HTTP engines. Generators take whatever transport a version's manifest names; their current
        slot stays mapped until they move on (its file is removed now)."""
        self.ctx.log.warning(
            "learner.weight_transport_fallback",
            reason=reason,
            now="disk",
            hint="give /dev/shm room for three versions (docker run --shm-size), or set weight_transport",
        )
        self.publisher.close()
        self.publisher = WeightPublisher(self.ctx.bus, self.ctx.topology, weight_transports(self.ctx)["disk"])

    def close(self) -> None:
        self.publisher.close()  # the shared-memory slots; a resumed run publishes again from its checkpoint


async def unless_bus_away(ctx: ActorContext, publish: Callable[[], Awaitable[None]], event: str, *, step: int) -> bool:
    """The train loop's publishes (a version, a held-out round): while the bus is away (a restarting or frozen
    server) the publish fails, is counted in ``bus_waits`` and logged as ``event``, and stays due: the learner tries
    again while idle and at its next step (training goes on; those steps are in whatever goes out then). False
    then."""
    try:
        await publish()
    except BUS_AWAY as exc:
        ctx.counters.inc("bus_waits")
        ctx.log.warning(event, step=step, error=f"{type(exc).__name__}: {exc}", retry="when idle or at the next step")
        return False
    return True
