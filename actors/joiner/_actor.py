"""The joiner actor: feedback + the served request it rates → one ``scored`` sample for the learner.

Contract:
- Every traffic record is stored in KV (see ``_state``) for ``window_s`` and acked; feedback looks its
  request up there, so feedback may come seconds or days later, and across joiner restarts.
- Feedback that arrives before its traffic record waits in KV (first one wins) and is joined when the
  record comes. Both sides re-check the other after writing their own key, so a race between a request and
  its feedback cannot strand either.
- Feedback is applied at most once per request: the first applied wins; repeats (a retried POST, a second
  opinion) are counted (``feedback.repeat``) and acked. Two replicas that join one request at the same moment (one
  took the request, the other its feedback) publish one sample (same id) and count one join: the "applied" mark is
  created, never overwritten, and only the replica that created it counts and scores the join.
- Feedback whose timestamp is more than ``window_s`` after its request's is counted as ``feedback.expired`` and not
  trained on. Feedback that waited ``window_s`` for a request that never came (an id the gateway never served) stops
  waiting: it is removed and counted as ``feedback.unmatched`` (by replica 0, a few seconds after its window).
- The joined sample is off-policy data: the completion's token ids, behavior logprobs and versions are the
  served ones; ``origin`` is ``review`` for labels from ``flywheel review``, else ``feedback``; the reward
  is the feedback's score (labels were mapped to scores by whoever published them, see
  ``actors.protocol._messages.FEEDBACK_LABELS``: good/thumbs_up/accept → 1, bad/thumbs_down/reject → 0) clipped to
  [0, 1]; domain = the config's ``domain``, else the request's, else ``"feedback"``. It is published with
  the id ``joined.<request id>``: a crash between publish and the "applied" mark re-publishes the same id,
  which JetStream stores once inside its dedupe window.
- ``review_fraction`` of traffic (chosen by a hash of the request id) is queued on ``review`` with the
  id ``review.<request id>``.
- Each of its buckets holds at most ``max_pending`` entries; when one is full its oldest entry is evicted early and
  counted (``traffic.evicted``, ``feedback_pending.evicted``, ``feedback_applied.evicted`` in the heartbeat, and a
  warning in the log at the first and every 1000th).
- The joined sample carries the verifier fields of its domain's task when the request asked one (its prompt, or a
  chat request's last user message, is a task of the domain: ``DomainSource.find``), so the recorded production
  rows can be re-scored by replay and the gate; ``{}`` otherwise.
- Counters: ``traffic.stored`` and ``feedback.joined``: the requests stored and the feedback joined by every replica
  in every life of the run, reported by replica 0 alone (the live view and status sum the replicas): the writes its
  ``traffic`` and ``feedback_applied`` buckets ever took (``JoinState.written``), read at start, after each write of
  its own and every few seconds for the other replicas'; ``feedback.early`` / ``.repeat`` / ``.expired``,
  ``review.queued``,
  ``feedback_score`` and ``feedback_score.<domain>`` (mean score of the last 200 joined feedback events: the served
  answers' quality as users rate it; a restart refills them from the newest "applied" marks, which record each
  join's reward and domain — a domain with fewer than one join in ``_SCORE_SCAN`` resumes with a shorter window),
  ``feedback_waiting`` (feedback held for a request not seen yet; replica 0's), ``feedback.unmatched`` (counted by
  replica 0, in every life of the joiner: its total is kept in a bucket of its own, see ``_state``).

Non-goals: joining on anything but the request id; telling at once that a request id was never served (a request's
record may reach the joiner after its feedback: only the window closing says it never will).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import orjson

from actors.domains import Domain, domains_from_spec, find_task
from actors.joiner._config import JoinerConfig
from actors.joiner._state import JoinState
from actors.protocol import REVIEW_SOURCE, FeedbackMsg, ScoredCompletion, ScoredMsg, TrafficMsg
from topology.bus import Delivery
from topology.runtime import Actor, ActorContext, iterate_until

__all__ = ["JoinerActor", "asked_texts", "joined_sample", "selected_for_review"]


def selected_for_review(request_id: str, fraction: float) -> bool:
    if fraction <= 0:
        return False
    digest = hashlib.sha256(b"flywheel-review:" + request_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < fraction


_SCORE_WINDOW = 200  # joined feedback events in the running mean score
_SCORE_SCAN = 4  # a restart refills the score windows from the newest _SCORE_SCAN × _SCORE_WINDOW joins
_COUNT_EVERY_S = 2.0  # how often replica 0 reads the buckets' totals (and ends the waits of unmatched feedback)


def asked_texts(traffic: TrafficMsg) -> tuple[str, ...]:
    """What a request asked, most specific first: the prompt the policy saw, then a chat request's last user
    message (what the user typed)."""
    users = [str(m.get("content")) for m in traffic.messages if m.get("role") == "user" and m.get("content")]
    return (traffic.prompt, users[-1]) if users else (traffic.prompt,)


def joined_sample(
    traffic: TrafficMsg,
    feedback: FeedbackMsg,
    *,
    source: str,
    domain: str | None,
    verifier_fields: Mapping[str, Any] | None = None,
) -> ScoredMsg:
    """The ``scored`` message for one request and the feedback applied to it."""
    reward = min(1.0, max(0.0, float(feedback.score)))
    completion = traffic.completion
    verdict = f"feedback:{feedback.label}" if feedback.label else f"feedback:{reward:g}"
    return ScoredMsg(
        task_id=traffic.request_id,
        domain=domain or traffic.domain or "feedback",
        prompt=traffic.prompt,
        prompt_ids=traffic.prompt_ids,
        verifier_fields=dict(verifier_fields or {}),
        temperature=traffic.temperature,
        origin="review" if source == REVIEW_SOURCE else "feedback",
        generator=traffic.generator,
        generate_s=traffic.latency_s,
        completions=[
            ScoredCompletion(**completion.model_dump(), reward=reward, verdict=verdict, detail=feedback.comment[:200])
        ],
    )


class JoinerActor(Actor[JoinerConfig]):
    def __init__(self, ctx: ActorContext, config: JoinerConfig) -> None:
        super().__init__(ctx, config)
        self.state = JoinState(
            ctx.bus, ctx.topology, window_s=config.window_s, max_pending=config.max_pending, on_evict=self._evicted
        )
        self._in = {name: name for name in ("traffic", "feedback")}
        if len(ctx.consumes) == 2:
            self._in = {"traffic": ctx.consumes[0], "feedback": ctx.consumes[1]}
        self._out = ctx.output_channel("scored")
        self._review = "review"
        self._locks: dict[str, anyio.Lock] = {}
        self._domains: Mapping[str, Domain] = {}
        self._scores: dict[str, deque[float]] = {}

    async def start(self) -> None:
        await self.state.open()
        # a restarted (or resumed) joiner counts on from what its buckets took rather than from 0, which the live
        # view read as "no feedback joined"
        if self.ctx.replica == 0:
            await self._count_buckets()
        await self._restore_scores()
        self._domains = await anyio.to_thread.run_sync(domains_from_spec, self.ctx.spec)
        self.ctx.log.info("joiner.ready", window_s=self.config.window_s, review_fraction=self.config.review_fraction)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._consume, self._in["traffic"], TrafficMsg, self._on_traffic)
            tg.start_soon(self._consume, self._in["feedback"], FeedbackMsg, self._on_feedback)
            tg.start_soon(self._count_waiting)

    async def _consume(
        self,
        channel: str,
        model: type[Any],
        handler: Callable[[Delivery[Any]], Awaitable[None]],
    ) -> None:
        async with self.ctx.bus.consume(channel, self.ctx.actor, model=model, batch=64) as deliveries:
            async for delivery in iterate_until(deliveries, self.ctx.stopping):
                try:
                    async with self._lock(delivery.payload.request_id):
                        await handler(delivery)
                except Exception as exc:  # the bus or KV is away: try again later
                    self.ctx.counters.inc("errors")
                    self.ctx.log.warning("joiner.failed", channel=channel, id=delivery.id, error=str(exc))
                    await delivery.nak(delay_s=1.0)

    def _lock(self, request_id: str) -> anyio.Lock:
        if len(self._locks) > 10_000:
            self._locks = {k: v for k, v in self._locks.items() if v.locked()}
        return self._locks.setdefault(request_id, anyio.Lock())

    # -- handlers -------------------------------------------------------------------------------------
    async def _on_traffic(self, delivery: Delivery[TrafficMsg]) -> None:
        traffic = delivery.payload
        rid = traffic.request_id
        # create, not put: a request stored already (this delivery again after a write whose ack was lost, or the
        # gateway's record published again) takes no second write, so the bucket's write count holds it once
        stored = await self.state.create("traffic", rid, orjson.dumps(traffic.model_dump(mode="json")))
        if stored is not None:
            self._written("traffic.stored", stored)
        if selected_for_review(rid, self.config.review_fraction):
            await self.ctx.bus.publish(
                self._review, "review", traffic.model_dump(mode="json"), id=f"review.{rid}", source=self._who()
            )
            self.ctx.counters.inc("review.queued")
        pending = await self.state.get("feedback_pending", rid)
        if pending is not None and await self.state.get("feedback_applied", rid) is None:
            raw = orjson.loads(pending)
            await self._join(traffic, FeedbackMsg.model_validate(raw["feedback"]), str(raw.get("source", "")))
        if pending is not None:
            await self.state.delete("feedback_pending", rid)
        await delivery.ack()

    async def _on_feedback(self, delivery: Delivery[FeedbackMsg]) -> None:
        feedback = delivery.payload
        rid = feedback.request_id
        source = delivery.envelope.source
        if await self.state.get("feedback_applied", rid) is not None:
            self.ctx.counters.inc("feedback.repeat")
            await delivery.ack()
            return
        stored = await self.state.get("traffic", rid)
        if stored is None:
            record = orjson.dumps({"feedback": feedback.model_dump(mode="json"), "source": source})
            if await self.state.create("feedback_pending", rid, record) is None:
                self.ctx.counters.inc("feedback.repeat")
                await delivery.ack()
                return
            self.ctx.counters.inc("feedback.early")
            stored = await self.state.get("traffic", rid)  # the request may have landed meanwhile
            if stored is None:
                await delivery.ack()
                return
            await self.state.delete("feedback_pending", rid)
        await self._join(TrafficMsg.model_validate(orjson.loads(stored)), feedback, source)
        await delivery.ack()

    async def _join(self, traffic: TrafficMsg, feedback: FeedbackMsg, source: str) -> None:
        rid = traffic.request_id
        if feedback.ts - traffic.ts > self.config.window_s:
            self.ctx.counters.inc("feedback.expired")
            self.ctx.log.info("joiner.expired", request_id=rid, late_s=round(feedback.ts - traffic.ts, 1))
            return
        domain = self.config.domain or traffic.domain
        task = find_task(self._domains, domain, asked_texts(traffic))
        sample = joined_sample(
            traffic,
            feedback,
            source=source,
            domain=self.config.domain,
            verifier_fields=task.verifier_fields if task is not None else None,
        )
        await self.ctx.bus.publish(
            self._out, "scored", sample.model_dump(mode="json"), id=f"joined.{rid}", source=self._who()
        )
        reward = sample.completions[0].reward
        # the reward and domain let a restarted joiner refill its score windows (`_restore_scores`)
        applied = {"feedback": feedback.model_dump(mode="json"), "source": source, "reward": reward}
        mark = await self.state.create("feedback_applied", rid, orjson.dumps({**applied, "domain": sample.domain}))
        if mark is None:
            # another replica joined this request at the same moment (each found it unjoined): the sample went out
            # once (same id), and the join is that replica's to score
            return
        self._written("feedback.joined", mark)
        self.ctx.counters.set("last_join_lag_s", round(max(0.0, feedback.ts - traffic.ts), 3))
        self._score(reward, sample.domain)

    def _score(self, reward: float, domain: str | None) -> None:
        """One joined feedback event into the running mean scores: overall, and its domain's (when known)."""
        for key in ("", f".{domain}") if domain else ("",):
            window = self._scores.setdefault(key, deque(maxlen=_SCORE_WINDOW))
            window.append(reward)
            self.ctx.counters.set(f"feedback_score{key}", round(sum(window) / len(window), 4))

    async def _restore_scores(self) -> None:
        """Refill the score windows from the newest joins in the "applied" bucket, so that a restart (or ``up
        --resume``) does not show users' score start again from nothing. A mark written before the marks recorded
        the reward counts its feedback's score, in the overall window only."""
        marks = await self.state.newest("feedback_applied", _SCORE_SCAN * _SCORE_WINDOW)
        for raw in reversed(marks):  # oldest first, as they were joined
            try:
                mark = orjson.loads(raw)
                reward = mark.get("reward")
                if reward is None:
                    reward = min(1.0, max(0.0, float(mark["feedback"]["score"])))
                domain = mark.get("domain")
                self._score(float(reward), domain if isinstance(domain, str) else None)
            except (ValueError, KeyError, TypeError):  # not a mark this joiner wrote: it says nothing about a score
                continue

    async def _count_buckets(self) -> None:
        """Replica 0's counters of the buckets all replicas share (the live view sums the replicas, so one reports
        them): the requests stored and the feedback joined by every replica in every life (the buckets' write
        counts, kept by the server), the feedback waiting (a bucket's size) and the unmatched (a total written before
        each removal it counts). None is this life's own count, so each is counted once whichever replicas restart,
        crash or run meanwhile."""
        for counter, bucket in (("traffic.stored", "traffic"), ("feedback.joined", "feedback_applied")):
            self._written(counter, await self.state.written(bucket))
        self.ctx.counters.set("feedback_waiting", await self.state.count("feedback_pending"))
        self.ctx.counters.set("feedback.unmatched", self.state.unmatched)

    def _written(self, counter: str, seq: int) -> None:
        """Replica 0 counts the bucket's writes up to ``seq``, every replica's (see :meth:`_count_buckets`)."""
        if self.ctx.replica == 0:  # max: a read of the totals may land after a newer write of this replica
            self.ctx.counters.set(counter, max(self.ctx.counters.get(counter), seq))

    async def _count_waiting(self) -> None:
        """End the waits of unmatched feedback and count the buckets (replica 0 alone, so each is counted once)."""
        while not self.ctx.stopping.is_set():
            try:
                if self.ctx.replica == 0:
                    for request_id in await self.state.expire_unmatched():
                        self.ctx.log.info("joiner.unmatched", request_id=request_id, waited_s=self.config.window_s)
                    await self._count_buckets()
            except Exception:  # the bus is away: look next time
                pass
            with anyio.move_on_after(min(_COUNT_EVERY_S, self.config.window_s / 2)):  # before the TTL does
                await self.ctx.stopping.wait()

    def _who(self) -> str:
        return self.ctx.replica_id

    def _evicted(self, what: str) -> None:
        """A bucket was full (``max_pending``): its oldest entry went before its window closed."""
        self.ctx.counters.inc(f"{what}.evicted")
        total = sum(self.state.evicted.values())
        if total == 1 or total % 1000 == 0:
            self.ctx.log.warning(
                "joiner.evicted", bucket=what, evicted=dict(self.state.evicted), max_pending=self.config.max_pending
            )
