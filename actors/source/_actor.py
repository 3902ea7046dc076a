"""The `source` actor: draws tasks from the spec's domains by weight and publishes them to `prompts`.

Contract:
- Opens the domains named in its config (default: every domain of the spec) with `domains_from_spec`; a
  bad source or JSONL row fails `start()` with the one-line `SourceError`.
- Replica i samples with `random.Random(seed + i)`, so two replicas never emit the same sequence and a run is
  reproducible given its seeds; a restarted or resumed replica goes on where its sequence stood
  (`actors.source._position`), instead of drawing its head again. Only training tasks are published (`heldout:
  false`); held-out tasks never leave through this actor.
- Each message is a `PromptMsg` payload (`actors.protocol._messages`), envelope type `"prompt"`, with a fresh
  message id per emission (the same task drawn twice is two prompts; `task_id` stays the task's stable id).
- Backpressure: before each batch the actor reads the channel's *backlog* from JetStream — for every
  consumer group on the stream, messages not yet delivered plus delivered but not yet acked; the backlog is
  the largest of these (the slowest group) or, while no group exists yet, the messages in the stream. It
  publishes at most `max_pending − backlog` more, then polls again. One replica therefore keeps at most
  `max_pending` prompts waiting (plus at most one batch in flight); R replicas at most R × `max_pending`.
  A consumer group that stops consuming stalls the source (it is the slowest group) — logged once per stall.
- End-to-end backpressure (`max_in_flight`; `auto` by default, sized from the learner's batch, publish cadence
  and `max_staleness`, see `resolve_max_in_flight`; null turns it off): the source also counts the training
  groups anywhere downstream on the way to a learner — following the spec's graph from `prompts` to every
  learner, it adds the backlog (undelivered + unacked) of each consumer group on the way, and for a learner the
  groups not yet delivered to it plus those buffered un-applied inside it (its heartbeat's `buffered_groups`),
  less the held-out prompts the learner itself has out (its heartbeat's `eval_out`: they pass through the same
  stages). It publishes at most `max_in_flight − in_flight` more. This is what keeps an asynchronous loop whose
  learner is slower than its generators from sampling groups that would only go stale: they are simply never
  drawn.
- `prompts_per_s` (optional) caps the rate with a token bucket (burst: one second's worth, at least one prompt).
- Settled tasks (`skip_no_signal` > 0; off by default): the actor listens to the learners' `TaskOutcomes` (core NATS,
  `TASK_OUTCOMES`) and passes over a drawn task whose latest groups carried no signal as `_settled` decides, drawing
  another task of the same domain instead (so the domains' weights hold), at most `_REDRAWS` times per prompt (then
  the last one drawn goes). Passed-over draws are counted in ``passed_over.<domain>``; a report that is not a
  `TaskOutcomes` is counted in ``task_outcomes_malformed`` and ignored. Without reports (no learner yet, the bus
  away) every draw goes as the domain's source made it.

- Sync mode: when the topology's learner has `mode: sync`, the source does not run ahead of the learner: it
  publishes one batch per weights version — prompts drawn until their groups bring the learner's `batch_size`
  completions (with domains of several group sizes, a count from the smallest made most of them stale) — once when a new
  version appears under the KV key `current` of `fw_<topology>_weights` (polled; the JSON manifest's
  `version`), and nothing more until the next one. Before publishing it waits (up to 30 s, then publishes with a
  warning) until every generator replica has put that version under its `served.<actor>.<replica>` key of the
  same bucket (right after its swap), so the batch is sampled by exactly those
  weights (a prompt taken before a generator swapped would come back stale and be dropped by the learner).
  A version that no step follows within `_SYNC_TOP_UP_S` (or five times the recent median, if longer), while no
  learner holds groups of it, gets its batch again (`sync_top_ups`, logged): its prompts were held by a replica that
  crashed (back only after the bus's `ack_wait_s`) or lost on the way; the learner drops what comes back of the first
  as stale.
  Backpressure and `prompts_per_s` do not apply then. A bus that is away is ridden out as below.
- A nats-server restart (the runtime brings a killed one back on its port) is ridden out: while the backlog and the
  learner's heartbeat cannot be read, the source publishes nothing and looks again (counted as `bus_waits`, logged
  once per outage) instead of crashing on the first request that timed out. So is a publish the bus refuses (its
  storage budget reached: "insufficient resources"; a full disk): the batch is not counted, the source waits as
  for an outage and draws anew (tasks are drawn with replacement, so none is owed).

Non-goals: exact global in-flight accounting across replicas; priorities between domains beyond weights.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections import deque
from typing import Any

import anyio
import nats.js.errors as js_errors
import orjson
import pydantic
from nats.aio.msg import Msg

from actors.domains import Domain, DomainSampler, Task, domains_from_spec
from actors.protocol import (
    TASK_OUTCOMES,
    LearnerPace,
    LearnerStatus,
    PromptMsg,
    TaskOutcomes,
    served_key,
    weights_bucket,
)
from actors.source._config import SourceConfig
from actors.source._position import SequencePosition
from actors.source._settled import SettledTasks
from topology import ephemeral_subject
from topology.bus import BUS_AWAY, new_id
from topology.runtime import Actor

__all__ = ["SourceActor"]

_BATCH = 32  # most prompts per publish_many call
_AUTO_BATCHES = 4  # `max_in_flight: auto`: learner batches drawn ahead (more only goes stale)
_POLL_S = 0.05  # how often a blocked source looks downstream again (each look costs a few JetStream API calls);
#   well under a learner step, so the generators are never a batch short for long
_SYNC_POLL_S = 0.02  # sync mode: how often the source looks for a new version / the generators' swaps
_STALL_LOG_S = 10.0  # a stall this long is logged (once per stall)
_BUS_RETRY_S = 0.5  # how often a source whose bus is away looks again
_SYNC_TOP_UP_S = 10.0  # sync mode: a version no step followed in this long (or 5x the recent median) gets a new batch
_REDRAWS = 8  # most tasks passed over for one prompt (a domain whose every task is settled still gets prompts)


class SourceActor(Actor[SourceConfig]):
    """Publishes domain tasks to `prompts`, never more than `max_pending` ahead of the consumers."""

    sampler: DomainSampler
    channel: str
    max_in_flight: int | None  # the resolved bound (groups), None: only max_pending applies

    async def start(self) -> None:
        ctx = self.ctx
        self.sampler = DomainSampler(
            domains_from_spec(ctx.spec, self.config.domains), random.Random(self.config.seed + ctx.replica)
        )
        self.position = SequencePosition(ctx.state_dir, self.sampler.rng, self.config.seed + ctx.replica)
        restored = self.position.restore()
        if restored == "restored":
            ctx.log.info("source.sequence_resumed", path=str(self.position.path))
        elif restored != "fresh":
            ctx.log.warning("source.sequence_unreadable", path=str(self.position.path), why=restored)
        self.settled = SettledTasks(self.config.skip_no_signal, self.sampler.rng)
        if self.config.skip_no_signal:
            await ctx.bus.nc.subscribe(ephemeral_subject(ctx.topology, TASK_OUTCOMES), cb=self.on_outcomes)
        self.channel = ctx.output_channel("prompts")
        self._js = ctx.bus.nc.jetstream()
        self._stream = ctx.bus.stream(self.channel)
        self._pipeline = self.pipeline()  # auto sizes the bound from the learners on it
        self.max_in_flight = self.resolve_max_in_flight()
        if self.max_in_flight is None:
            self._pipeline = []  # no bound: in_flight() is never asked
        ctx.log.info(
            "source started",
            channel=self.channel,
            domains={name: d.source.source for name, d in self.sampler.domains.items()},
            max_pending=self.config.max_pending,
            max_in_flight=self.max_in_flight,
            skip_no_signal=self.config.skip_no_signal,
            pipeline=[f"{channel}→{group}" for channel, group, _ in self._pipeline],
        )

    async def on_outcomes(self, msg: Msg) -> None:
        """One `TaskOutcomes` report from a learner (see the module docstring)."""
        try:
            report = TaskOutcomes.model_validate_json(msg.data)
        except pydantic.ValidationError:
            self.ctx.counters.inc("task_outcomes_malformed")
            return
        self.settled.update(report)

    def draw(self) -> tuple[Domain, Task]:
        """The next task to publish: the sampler's, less settled ones passed over (see the module docstring)."""
        domain, task = self.sampler.next()
        for _ in range(_REDRAWS):
            if not self.settled.passes_over(task.id):
                break
            self.ctx.counters.inc(f"passed_over.{domain.name}")
            task = domain.source.sample(self.sampler.rng)
        return domain, task

    async def consumer_groups(self) -> dict[str, Any]:
        """This channel's consumer groups by name (their JetStream consumer infos), in one request."""
        try:
            return {g.name: g for g in await self._js.consumers_info(self._stream)}
        except js_errors.NotFoundError:
            return {}  # the stream does not exist yet; the first publish creates it

    async def backlog(self, groups: dict[str, Any]) -> int:
        """Prompts waiting for the slowest of ``groups`` (see the module docstring)."""
        try:
            if groups:
                return max(int(g.num_pending or 0) + int(g.num_ack_pending or 0) for g in groups.values())
            info = await self._js.stream_info(self._stream)
            return int(info.state.messages)
        except js_errors.NotFoundError:
            return 0  # the stream does not exist yet; the first publish creates it

    def pipeline(self) -> list[tuple[str, str, bool]]:
        """``(channel, consumer group, is_learner)`` on every path from this source's channel to a learner."""
        actors = self.ctx.spec.actors
        reaching = {name for name, a in actors.items() if a.kind == "learner"}  # actors from which a learner is reached
        grew = True
        while grew:
            grew = False
            for name, a in actors.items():
                if name not in reaching and any(
                    ch in actors[other].consumes for ch in a.publishes for other in reaching
                ):
                    reaching.add(name)
                    grew = True
        found: list[tuple[str, str, bool]] = []
        frontier, seen = [self.channel], set()
        while frontier:
            channel = frontier.pop()
            if channel in seen:
                continue
            seen.add(channel)
            for name in sorted(reaching - {self.ctx.actor}):
                if channel in actors[name].consumes:
                    learner = actors[name].kind == "learner"
                    found.append((channel, name, learner))
                    if not learner:
                        frontier.extend(actors[name].publishes)
        return found

    def resolve_max_in_flight(self) -> int | None:
        """The bound on groups in flight: ``max_in_flight`` as configured, or for ``auto`` (the default), per learner
        this source feeds, ``_AUTO_BATCHES`` of its batches, but no more than ``publish_every_steps × max_staleness``
        batches (a group drawn further ahead would reach the learner too stale to train on, and be dropped), and at
        least one. A batch in groups is the learner's ``batch_size`` over the weighted mean group size of this
        source's domains, rounded up, times the learner's replicas. ``auto`` with no learner downstream: no bound."""
        configured = self.config.max_in_flight
        if configured != "auto":
            return configured
        actors = self.ctx.spec.actors
        learners = sorted({group for _, group, is_learner in self._pipeline if is_learner})
        if not learners:
            return None
        domains = self.sampler.domains.values()
        group_size = sum(d.weight * d.group_size for d in domains) / sum(d.weight for d in domains)
        total = 0
        for name in learners:
            pace = actors[name].config
            if not isinstance(pace, LearnerPace):
                raise TypeError(f"actor {name!r} is a learner whose config does not say its pace (LearnerPace)")
            per_batch = math.ceil(pace.batch_size / group_size)
            lead = pace.publish_every_steps * pace.max_staleness
            total += per_batch * max(1, min(_AUTO_BATCHES, lead)) * actors[name].replicas
        return total

    async def in_flight(self, own: dict[str, Any], before: dict[tuple[str, int], LearnerStatus]) -> int:
        """Training groups between this source and its learners (see the module docstring); ``own``: this channel's
        consumer groups as just read (`consumer_groups`), so they are not asked for again; ``before``: the learners'
        figures (`learner_statuses`) as read before ``own``.

        The stage counts (consumer infos) and a learner's heartbeat are read at different moments while both move,
        so the learner's figures are read on both sides of the counts and each taken on its safe side: the larger
        ``buffered_groups`` (a group delivered before the counts is in the later one unless applied, which takes it
        out of flight), the smaller ``eval_out`` (held-out prompts published after the first read are in the counts
        but may not be subtracted; ones whose scores came back before the second read are in neither). Read after
        the counts only, a held-out round published in between was subtracted without having been counted: the
        source drew that many groups past its bound."""
        total = 0
        for channel, group, learner in self._pipeline:
            stream = self.ctx.bus.stream(channel)
            try:
                info = own.get(group) if channel == self.channel else None
                if info is None:
                    info = await self._js.consumer_info(stream, group)
            except js_errors.NotFoundError:
                # the group does not exist yet (its actor is still starting): it will be delivered the whole
                # stream (deliver policy all), so every message in it is pending for it
                try:
                    total += int((await self._js.stream_info(stream)).state.messages)
                except js_errors.NotFoundError:
                    pass  # nor the stream: nothing was published there yet
                continue
            total += int(info.num_pending or 0)
            if not learner:
                total += int(info.num_ack_pending or 0)
        after = await self.learner_statuses()
        for key in before.keys() | after.keys():
            first, second = before.get(key, LearnerStatus()), after.get(key, LearnerStatus())
            # the learner's own held-out prompts pass through the same stages: not training groups
            total += max(first.buffered_groups, second.buffered_groups) - min(first.eval_out, second.eval_out)
        return max(total, 0)

    async def learner_statuses(self, *, all_learners: bool = False) -> dict[tuple[str, int], LearnerStatus]:
        """The backpressure figures of every learner replica on the pipeline (``all_learners``: of the topology),
        from their latest heartbeats."""
        from topology.runtime import read_status

        if all_learners:
            learners = sorted(name for name, actor in self.ctx.spec.actors.items() if actor.kind == "learner")
        else:
            learners = sorted({group for _, group, learner in self._pipeline if learner})
        replicas = [(name, i) for name in learners for i in range(self.ctx.spec.actors[name].replicas)]
        if not replicas:
            return {}
        records = await read_status(self.ctx.bus, self.ctx.topology, replicas)
        return {(r.actor, r.replica): LearnerStatus.from_counters(r.counters) for r in records}

    def sync_batch(self) -> int | None:
        """Completions per weights version (the learner's ``batch_size``) when the topology's learner runs `mode:
        sync`, else None."""
        for actor in self.ctx.spec.actors.values():
            if actor.kind == "learner" and isinstance(actor.config, LearnerPace) and actor.config.mode == "sync":
                return max(1, actor.config.batch_size)
        return None

    async def weights_version(self) -> int:
        """The current weights version in KV (0 before the first publish); the manifest is plain JSON."""
        raw = await self.ctx.bus.kv_get(weights_bucket(self.ctx.topology), "current")
        return int(orjson.loads(raw).get("version", 0)) if raw else 0

    async def wait_generators(self, version: int, timeout_s: float = 30.0) -> None:
        """Until every generator replica has swapped in ``version`` (the key each puts right after a swap)."""
        bucket = weights_bucket(self.ctx.topology)
        keys = [
            served_key(name, i)
            for name, a in self.ctx.spec.actors.items()
            if a.kind == "generator"
            for i in range(a.replicas)
        ]
        with anyio.move_on_after(timeout_s) as scope:
            while not self.ctx.stopping.is_set():
                served = [await self.ctx.bus.kv_get(bucket, key) for key in keys]
                if all(raw is not None and int(orjson.loads(raw).get("version", 0)) >= version for raw in served):
                    return
                with anyio.move_on_after(_SYNC_POLL_S):
                    await self.ctx.stopping.wait()
        if scope.cancelled_caught:
            self.ctx.log.warning("source: generators did not report the new version in time", version=version)

    async def run_sync(self, per_version: int) -> None:
        last, left = 0, 0  # the newest version seen and its completions not published yet
        bus_away = False  # an outage: logged at its first failure
        sent_at = time.monotonic()  # when the newest version's batch went out
        looked = 0.0  # when the learners were last asked whether they hold groups of it
        intervals: deque[float] = deque(maxlen=20)  # from a version's batch to the next version, recently
        while not self.ctx.stopping.is_set():
            try:
                if not left:
                    version = await self.weights_version()
                    if version <= last:
                        now = time.monotonic()
                        if last and now - sent_at > _sync_top_up_s(intervals) and now >= looked + 1.0:
                            looked = now  # (the learners' heartbeats: read once a second at most)
                            if not await self._learner_holds_groups():
                                # nothing of that batch reached the learner: its prompts held by a replica that
                                # crashed (back after the bus's ack_wait_s), or every group of it lost on the way
                                self.ctx.counters.inc("sync_top_ups")
                                waited = round(now - sent_at, 1)
                                self.ctx.log.warning(
                                    "source.sync_top_up", version=last, waited_s=waited, completions=per_version
                                )
                                sent_at, left = now, per_version
                                continue
                        with anyio.move_on_after(_SYNC_POLL_S):
                            await self.ctx.stopping.wait()
                        continue
                    await self.wait_generators(version)
                    if last:
                        intervals.append(time.monotonic() - sent_at)
                    last, left, sent_at = version, per_version, time.monotonic()
                while left > 0:  # (a batch the bus did not take is drawn anew, as in async mode)
                    left = max(0, left - await self.publish_batch(_BATCH, completions=left))
                self.ctx.counters.set("sync_version", last)
            except BUS_AWAY as exc:  # the version, the generators' swaps or a publish: wait as for an outage
                await self._bus_wait(exc, first=not bus_away)
                bus_away = True
                continue
            bus_away = False

    async def _learner_holds_groups(self) -> bool:
        """Whether a learner holds training groups not applied yet (its heartbeat's ``buffered_groups``): then the
        version's batch reached it and waits there (for its post-warm-start round, say), and nothing is owed. True
        when no learner's heartbeat can be read: a top-up is never made on a guess."""
        statuses = await self.learner_statuses(all_learners=True)
        return not statuses or any(status.buffered_groups for status in statuses.values())

    async def run(self) -> None:
        ctx, config = self.ctx, self.config
        per_version = self.sync_batch()
        if per_version is not None:
            await self.run_sync(per_version)
            return
        rate = config.prompts_per_s
        burst = max(1.0, rate or 0.0)  # at least one prompt, so rates below 1/s still publish
        tokens, last = burst, time.monotonic()
        blocked_since: float | None = None
        bus_away = refused = False  # an outage, a publish refused: each logged at its first failure
        while not ctx.stopping.is_set():
            try:
                learners = await self.learner_statuses()  # before the counts: see in_flight
                groups = await self.consumer_groups()
                backlog = await self.backlog(groups)
                room = min(config.max_pending - backlog, _BATCH)
                if self.max_in_flight is not None and room > 0:
                    in_flight = await self.in_flight(groups, learners)
                    ctx.counters.set("in_flight", in_flight)
                    room = min(room, self.max_in_flight - in_flight)
            except BUS_AWAY as exc:
                await self._bus_wait(exc, first=not bus_away)
                bus_away = True
                continue
            bus_away = False
            ctx.counters.set("backlog", backlog)
            if rate is not None:
                now = time.monotonic()
                tokens, last = min(burst, tokens + (now - last) * rate), now
                room = min(room, int(tokens))
            if room <= 0:
                if blocked_since is None:
                    blocked_since = time.monotonic()
                elif time.monotonic() - blocked_since > _STALL_LOG_S:
                    ctx.log.info(
                        "source waiting for downstream",
                        backlog=backlog,
                        max_pending=config.max_pending,
                        in_flight=ctx.counters.snapshot().get("in_flight"),
                        max_in_flight=self.max_in_flight,
                    )
                    blocked_since = float("inf")  # once per stall
                with anyio.move_on_after(_POLL_S):
                    await ctx.stopping.wait()
                continue
            blocked_since = None
            try:
                await self.publish_batch(room)
            except BUS_AWAY as exc:  # refused (storage full) or timed out: nothing counted, wait as for an outage
                await self._bus_wait(exc, first=not refused)
                refused = True
                continue
            refused = False
            if rate is not None:
                tokens -= room

    async def _bus_wait(self, exc: Exception, *, first: bool) -> None:
        """Count a look or publish the bus did not answer (logged at the first of an outage), then wait."""
        self.ctx.counters.inc("bus_waits")
        if first:
            self.ctx.log.warning("source.bus_away", error=f"{type(exc).__name__}: {exc}", retry_s=_BUS_RETRY_S)
        with anyio.move_on_after(_BUS_RETRY_S):
            await self.ctx.stopping.wait()

    async def publish_batch(self, n: int, *, completions: int | None = None) -> int:
        """Publish ``n`` prompts — or, with ``completions``, as many as bring that many completions (group sizes
        summed; at most ``n``); returns the completions they bring."""
        items: list[tuple[str, dict[str, Any], str | None]] = []
        domains: list[str] = []
        brought = 0
        for _ in range(n):
            if completions is not None and brought >= completions:
                break
            domain, task = self.draw()
            brought += domain.group_size
            payload = PromptMsg.model_validate(task.payload(group_size=domain.group_size)).model_dump()
            items.append(("prompt", payload, new_id()))
            domains.append(domain.name)
        await self.ctx.bus.publish_many(self.channel, items, source=self.ctx.replica_id)
        for name in domains:  # counted once stored: a batch the bus refused is not
            self.ctx.counters.inc(f"published.{name}")
        self.ctx.counters.inc("published", len(items))
        error = self.position.save_if_due()
        if error is not None:
            self.ctx.counters.inc("sequence_save_errors")
            if self.ctx.counters.get("sequence_save_errors") == 1:  # once: it is retried every few seconds
                self.ctx.log.warning("source.sequence_not_saved", path=str(self.position.path), error=error)
        return brought

    async def stop(self) -> None:
        if hasattr(self, "position"):  # start() got that far
            try:
                self.position.save()
            except OSError as exc:
                self.ctx.log.warning("source.sequence_not_saved", path=str(self.position.path), error=str(exc))


def _sync_top_up_s(intervals: deque[float]) -> float:
    """How long a sync-mode version may go without a step before its batch is published again."""
    return max(_SYNC_TOP_UP_S, 5.0 * statistics.median(intervals)) if intervals else _SYNC_TOP_UP_S
