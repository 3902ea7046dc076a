"""The recorder actor: ``traffic``, ``feedback`` and ``scored`` to parquet, every acknowledged event exactly once.

How exactly-once holds across crashes (of the recorder, of the producer, of nats-server with JetStream on
disk):

1. A message is acknowledged only after the file holding it was renamed into place and its directory
   fsynced. A crash before that loses nothing: JetStream redelivers the un-acked message.
2. File names carry the stream sequences they hold; at start the recorder asks the server for the
   consumer's *ack floor* (every sequence at or below it is acknowledged and never redelivered) and reads
   the ``_seq`` column of every file whose last sequence is above it. A redelivered message already in a
   file — the recorder died between rename and ack, or nats-server died before persisting the ack — is
   acknowledged without being written again. The index is pruned to the un-acked window after each flush.
3. The hidden temporary of a flush cut short is deleted at start; it never held an acknowledged message.
3b. A directory holding another stream's recordings (another run's, or a stream deleted and created again, whose
   sequences restarted) is refused at start with a message saying so: its files would make new messages look
   already written (``ChannelWriter.claim``).
4. A message redelivered while still buffered (``ack_wait_s`` elapsed) replaces its buffered copy; the flush
   interval is capped at half of ``ack_wait_s`` so that this stays rare.

Throughput: messages stay un-acked until their file is written, and the server hands a consumer at most its
``max_ack_pending`` un-acked messages. The recorder's consumers take a window of their own (``IN_FLIGHT``, or the
bus's if larger) and a channel is flushed as soon as half of it is buffered, not only every ``flush_every_s``:
otherwise the recorder could write one window per interval and fall behind any traffic faster than that.

A producer that publishes an id twice inside the bus's dedupe window is stored once by JetStream; beyond it,
two messages exist and both are recorded (their ``_id`` column shows it).

Non-goals: more than one replica per recordings directory (refused at start: two writers could both write a
message redelivered between them), reading recordings (see ``read_recordings``).
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import nats.js.errors as js_errors
from pydantic import BaseModel

from actors.protocol import CHANNEL_MODELS, rows_of
from actors.recorder._compact import Upkeep, UpkeepReport
from actors.recorder._config import RecorderConfig
from actors.recorder._writer import ChannelWriter, StreamIdentity
from topology.bus import Bus, Delivery
from topology.runtime import Actor, ActorContext, iterate_until

__all__ = ["RecorderActor", "ack_floor", "stream_identity"]

_Buffered = tuple[Delivery[Any], float, list[dict[str, Any]]]
IN_FLIGHT = 4096  # un-acked messages a recorder's consumer may hold (buffered, waiting for their file)


async def ack_floor(bus: Bus, channel: str, group: str) -> int:
    """The consumer group's ack floor on ``channel``: every sequence up to it is acknowledged (0: none yet)."""
    try:
        info = await bus.nc.jetstream().consumer_info(bus.stream(channel), group)
    except js_errors.NotFoundError:
        return 0
    return int(info.ack_floor.stream_seq or 0) if info.ack_floor is not None else 0


async def stream_identity(bus: Bus, channel: str) -> StreamIdentity:
    """The identity of ``channel``'s stream (created with the bus's defaults when it does not exist yet)."""
    js = bus.nc.jetstream()
    try:
        info = await js.stream_info(bus.stream(channel))
    except js_errors.NotFoundError:
        await bus.ensure_channel(channel)
        info = await js.stream_info(bus.stream(channel))
    created = info.created.isoformat() if info.created is not None else ""
    return StreamIdentity(name=info.config.name or bus.stream(channel), created=created, last_seq=info.state.last_seq)


class RecorderActor(Actor[RecorderConfig]):
    def __init__(self, ctx: ActorContext, config: RecorderConfig) -> None:
        super().__init__(ctx, config)
        self.channels = list(ctx.consumes)
        unknown = [c for c in self.channels if c not in CHANNEL_MODELS]
        if unknown:
            raise ValueError(
                f"recorder {ctx.actor!r}: no recorded schema for channel(s) {', '.join(unknown)} "
                f"(recordable: {', '.join(sorted(CHANNEL_MODELS))})"
            )
        if ctx.actor_spec.replicas != 1:
            raise ValueError(
                f"recorder {ctx.actor!r}: expected replicas: 1 (one writer per recordings "
                f"directory), got {ctx.actor_spec.replicas}"
            )
        directory = Path(config.directory)
        self.root = directory if directory.is_absolute() else ctx.run_dir / directory
        self.writers = {
            c: ChannelWriter(self.root, c, partition=config.partition, compression=config.compression)
            for c in self.channels
        }
        self._buffers: dict[str, dict[int, _Buffered]] = {c: {} for c in self.channels}
        self._rows: dict[str, int] = dict.fromkeys(self.channels, 0)
        self._locks = {c: anyio.Lock() for c in self.channels}
        self.upkeep: dict[str, Upkeep] = {}
        self._full = anyio.Event()
        self.flush_every_s = min(config.flush_every_s, ctx.bus.settings.ack_wait_s / 2)
        self.in_flight = max(IN_FLIGHT, ctx.bus.settings.max_ack_pending)

    async def start(self) -> None:
        for channel, writer in self.writers.items():
            stream = await stream_identity(self.ctx.bus, channel)
            await anyio.to_thread.run_sync(writer.claim, stream)
            floor = await ack_floor(self.ctx.bus, channel, self.ctx.actor)
            found = await anyio.to_thread.run_sync(writer.recover, floor)
            self.ctx.log.info("recorder.recovered", channel=channel, ack_floor=floor, unacked_in_files=found)
            days = getattr(self.config.retain_days, channel)
            upkeep = partial(
                Upkeep,
                writer,
                merge_after_s=self.config.merge_after_s,
                retain_s=None if days is None else days * 86_400.0,
                max_rows=self.config.max_rows_per_file,
            )
            self.upkeep[channel] = await anyio.to_thread.run_sync(upkeep)
        self.ctx.log.info("recorder.ready", root=str(self.root), channels=self.channels)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            for channel in self.channels:
                tg.start_soon(self._consume, channel)
            tg.start_soon(self._flush_loop)
            tg.start_soon(self._upkeep_loop)
        # consumers are closed; what they handed out is ours to write and acknowledge
        await self.flush_all()

    async def _consume(self, channel: str) -> None:
        model: type[BaseModel] = CHANNEL_MODELS[channel]
        batch = max(1, min(256, self.in_flight // 2))
        consumer = self.ctx.bus.consume(
            channel, self.ctx.actor, model=model, batch=batch, max_ack_pending=self.in_flight
        )
        async with consumer as deliveries:
            async for delivery in iterate_until(deliveries, self.ctx.stopping):
                await self._accept(channel, delivery)

    async def _accept(self, channel: str, delivery: Delivery[Any]) -> None:
        if self.writers[channel].written(delivery.stream_seq):
            await delivery.ack()  # already in a file: a redelivery after a crash or a lost ack
            self.ctx.counters.inc(f"{channel}.duplicates_skipped")
            return
        env = delivery.envelope
        rows = rows_of(channel, delivery.payload, seq=delivery.stream_seq, id=env.id, ts=env.ts, source=env.source)
        buffer = self._buffers[channel]
        previous = buffer.get(delivery.stream_seq)
        if previous is not None:
            self._rows[channel] -= len(previous[2])
            self.ctx.counters.inc(f"{channel}.redelivered_while_buffered")
        buffer[delivery.stream_seq] = (delivery, env.ts, rows)
        self._rows[channel] += len(rows)
        if self._rows[channel] >= self.config.max_rows_per_file or len(buffer) >= self.in_flight // 2:
            self._full.set()

    async def _flush_loop(self) -> None:
        while not self.ctx.stopping.is_set():
            with anyio.move_on_after(self.flush_every_s):
                async with anyio.create_task_group() as wake:

                    async def on(event: anyio.Event) -> None:
                        await event.wait()
                        wake.cancel_scope.cancel()

                    wake.start_soon(on, self._full)
                    wake.start_soon(on, self.ctx.stopping)
            self._full = anyio.Event()
            if not self.ctx.stopping.is_set():
                await self.flush_all()

    async def _upkeep_loop(self) -> None:
        while not self.ctx.stopping.is_set():
            with anyio.move_on_after(self.config.upkeep_every_s):
                await self.ctx.stopping.wait()
            if self.ctx.stopping.is_set():
                return
            for channel in self.channels:
                try:
                    await self.keep_up(channel)
                except OSError as exc:  # disk trouble: the files stay as they are, the next look tries again
                    self.ctx.counters.inc(f"{channel}.upkeep_errors")
                    self.ctx.log.error("recorder.upkeep_failed", channel=channel, error=str(exc))

    async def keep_up(self, channel: str, now: float | None = None) -> UpkeepReport:
        """Merge ``channel``'s closed partitions, delete what they superseded once its grace is over, drop
        partitions past retention (``actors.recorder._compact``); counted and logged."""
        upkeep = self.upkeep[channel]
        writer = self.writers[channel]
        at = time.time() if now is None else now
        async with self._locks[channel]:  # quick: deletions, and the index told of them
            report = await anyio.to_thread.run_sync(upkeep.expire_and_delete, at)
        merged, written = await anyio.to_thread.run_sync(upkeep.merge_closed, at)  # slow: the writer goes on
        async with self._locks[channel]:
            writer.adopt(written)
        counters = self.ctx.counters
        expired = report.expired
        if expired.partitions:
            counters.inc(f"{channel}.expired_partitions", len(expired.partitions))
            counters.inc(f"{channel}.expired_files", len(expired.files))
            counters.inc(f"{channel}.expired_bytes", expired.bytes)
            self.ctx.log.info(
                "recorder.expired",
                channel=channel,
                partitions=expired.partitions,
                files=len(expired.files),
                bytes=expired.bytes,
            )
        if merged.merged_partitions:
            counters.inc(f"{channel}.merged_partitions", merged.merged_partitions)
            counters.inc(f"{channel}.merged_files", merged.merged_files)
            self.ctx.log.info(
                "recorder.merged",
                channel=channel,
                partitions=merged.merged_partitions,
                files_in=merged.merged_files,
                files_out=len(written),
                rows=merged.merged_rows,
            )
        counters.inc(f"{channel}.superseded_deleted", report.superseded_deleted)
        merged.expired = expired
        merged.superseded_deleted = report.superseded_deleted
        return merged

    async def flush_all(self) -> None:
        for channel in self.channels:
            await self.flush(channel)

    async def flush(self, channel: str) -> None:
        """Write what is buffered for ``channel``, then acknowledge it (see the module docstring)."""
        async with self._locks[channel]:
            buffer, self._buffers[channel] = self._buffers[channel], {}
            self._rows[channel] = 0
            if not buffer:
                return
            writer = self.writers[channel]
            fresh = {seq: (ts, rows) for seq, (_d, ts, rows) in buffer.items() if not writer.written(seq)}
            started = time.perf_counter()
            try:
                if fresh:
                    await anyio.to_thread.run_sync(writer.write, fresh)
            except Exception as exc:  # disk full, permissions: give everything back for a later try
                self.ctx.counters.inc(f"{channel}.write_errors")
                self.ctx.log.error("recorder.write_failed", channel=channel, messages=len(buffer), error=str(exc))
                for delivery, _ts, _rows in buffer.values():
                    await delivery.nak(delay_s=1.0)
                return
            with anyio.CancelScope(shield=True):
                for delivery, _ts, _rows in buffer.values():
                    await delivery.ack()
            counters = self.ctx.counters
            counters.inc(f"{channel}.messages", len(fresh))
            counters.inc(f"{channel}.rows", sum(len(rows) for _ts, rows in fresh.values()))
            counters.inc(f"{channel}.duplicates_skipped", len(buffer) - len(fresh))
            counters.set(f"{channel}.files", writer.files_written)
            counters.set("last_flush_s", round(time.perf_counter() - started, 4))
            try:
                writer.prune(await ack_floor(self.ctx.bus, channel, self.ctx.actor))
            except Exception:  # the server is away; prune next time
                pass
