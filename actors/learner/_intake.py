"""The learner's intake of training groups from ``scored``, and where each one is from its delivery to its ack.

Contract (:meth:`Intake.on_delivery`, for training groups; held-out scores go to ``_rounds``):
- A redelivery of a message the learner holds replaces the delivery wherever the message is — buffered
  (``held``), in the step under way (``stepping``), applied and waiting for a checkpoint (``unacked``), or covered by
  the checkpoint being written (``writing``) — and is never buffered again. One whose id is in the applied ledger
  (``_ledger``) is acked without being applied, counted in ``duplicates_skipped``.
- Refused before it is buffered: a token id outside the policy's vocabulary (dead-lettered: it would fail the batch
  it joined, every time); tokens of a version newer than the learner's — weights it never published, see
  :func:`unpublished_version` — (dead-lettered, ``unpublished_version``); a domain the learner does not train
  (``ignored_domain``) or one removed from the spec since the group was drawn (``removed_domain.<domain>``); greedy
  samples (``greedy_skipped``: no behavior distribution to correct for); stale ones (``dropped_stale[.<domain>]``,
  completions: past ``max_staleness``, or for production feedback ``feedback_max_staleness``). All of these but the
  dead-lettered are acked.
- Completions the verifier failed on (verdict ``VERIFIER_ERROR``) leave their group first: their reward 0 is not the
  answer's (``verifier_errors_skipped.<domain>`` counts them; a group left with fewer than two is consumed).
- In ``async`` mode a group's samples are made as it arrives (``_samples``), and a group without signal (every
  reward equal, no guidance) or whose every row is too long is consumed there and then — accounted like an applied
  one, never buffered — so every step trains on ``batch_size`` completions that carry signal: a learner that
  outruns its generators waits for signal instead of stepping on the few signal rows of a mostly solved batch.
  ``sync``: a batch is what one version's prompts gave, signal or not.
- :meth:`Intake.account`: groups a step applied (or consumed) go into the ledger and wait in ``unacked`` for a
  checkpoint; each gets an ``applied`` metrics row with the step and how (``applied`` or ``consumed``), the audit
  trail. :meth:`Intake.hand_to_checkpoint` moves them to ``writing`` for the checkpoint being taken, and
  :meth:`Intake.ack_written` acks them (a redelivery that came meanwhile replaced its entry: acked here) once it is
  on disk.
- :meth:`Intake.keepalive`: every message held anywhere above is kept alive with ``in_progress`` at least every
  ``_KEEPALIVE_S_MAX`` seconds (a third of ``ack_wait_s`` when shorter); a lost keepalive means a redelivery later,
  which the rules above handle.

Non-goals: the held-out scores (``_rounds``), when to checkpoint and what a checkpoint holds (the learner), batch
composition (``_batcher``), a group's samples and advantages (``_samples``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import anyio

from actors.learner._advantages import staleness
from actors.learner._batcher import DomainBatcher
from actors.learner._config import LearnerConfig
from actors.learner._ledger import AppliedLedger
from actors.learner._metrics import MetricsWriter
from actors.learner._samples import SampleMaker
from actors.learner._trainer import TrainSample
from actors.policy import Policy
from actors.protocol import VERIFIER_ERROR, ScoredMsg, domains_of
from topology.bus import Delivery
from topology.runtime import ActorContext

__all__ = ["Held", "Intake", "group_staleness", "out_of_vocabulary", "unpublished_version"]

_KEEPALIVE_S_MAX = 10.0  # in_progress at least this often for held messages (ack_wait / 3 when shorter)


@dataclass
class Held:
    """A training group waiting in the buffer."""

    delivery: Delivery[ScoredMsg]
    msg: ScoredMsg
    size: int  # its completions
    samples: list[TrainSample] | None = None  # computed on arrival (async mode), else when its batch is taken


def out_of_vocabulary(msg: ScoredMsg, vocab_size: int) -> str | None:
    """Why ``msg`` holds a token id the policy has no embedding for (the first one found), else None."""
    rows = [("prompt_ids", msg.prompt_ids)]
    rows += [(f"completions.{i}.token_ids", c.token_ids) for i, c in enumerate(msg.completions)]
    for where, ids in rows:
        top = max(ids, default=0)
        if top >= vocab_size:
            return f"token id {top} in {where} is outside the policy's vocabulary of {vocab_size}"
    return None


def unpublished_version(msg: ScoredMsg, version: int) -> str | None:
    """Why ``msg`` holds tokens of a weight version newer than the learner's ``version`` (the reason it is
    dead-lettered), else None. A resumed learner numbers on past every version published before (``publish_weights``:
    the newest in KV, or its checkpoint's), so such tokens come from weights it never published: an SGLang or vLLM
    server left running by another run (it reports that run's version until the first swap), or another run on the
    same bus and topology name. Their staleness would come out negative and pass any ``max_staleness``."""
    newest = max((v for c in msg.completions for v in c.versions), default=0)
    if newest <= version:
        return None
    return (
        f"tokens of weight version {newest}, newer than any this learner has published (v{version}): "
        f"weights from another run (an inference server left running, another run on this bus)"
    )


def group_staleness(msg: ScoredMsg, version: int) -> int:
    return staleness(version, [v for c in msg.completions for v in c.versions])


class Intake:
    """The buffer, the ledger and every message held between delivery and ack; ``attach`` gives it the parts the
    learner builds in ``start``."""

    # set by attach() (the learner's start)
    policy: Policy
    sample_maker: SampleMaker
    metrics: MetricsWriter

    def __init__(self, ctx: ActorContext, config: LearnerConfig, batcher: DomainBatcher[Held]) -> None:
        self.ctx, self.config, self.batcher = ctx, config, batcher
        self.max_staleness = config.effective_max_staleness
        self.ledger = AppliedLedger()
        self.held: dict[str, Held] = {}  # buffered, not applied yet
        self.stepping: dict[str, Held] = {}  # taken by the step under way: out of the buffer, not accounted yet
        self.unacked: dict[str, Delivery[ScoredMsg]] = {}  # applied (or consumed), waiting for a checkpoint
        self.writing: dict[str, Delivery[ScoredMsg]] = {}  # covered by the checkpoint being written, acked after it
        self.written: anyio.Event | None = None  # set once the checkpoint being written is on disk
        self.arrived = anyio.Event()  # set when a group is buffered: wakes a train loop waiting for a batch

    def attach(self, policy: Policy, sample_maker: SampleMaker, metrics: MetricsWriter) -> None:
        self.policy, self.sample_maker, self.metrics = policy, sample_maker, metrics

    async def on_delivery(self, delivery: Delivery[ScoredMsg], version: int, step: int) -> None:
        """Take in one training group (``version``, ``step``: the learner's now), then report the groups' outcomes
        to the sources when a report is due (after the group is wherever it goes: the report may yield)."""
        await self.take(delivery, version, step)
        await self.sample_maker.outcomes.flush_due()

    async def take(self, delivery: Delivery[ScoredMsg], version: int, step: int) -> None:
        counters, msg, mid = self.ctx.counters, delivery.payload, delivery.id
        if mid in self.unacked:  # redelivered while waiting for its checkpoint: keep the fresh delivery
            self.unacked[mid] = delivery
            return
        if mid in self.writing:  # redelivered while its checkpoint is being written: that one acks the fresh one
            self.writing[mid] = delivery
            return
        if mid in self.ledger:
            counters.inc("duplicates_skipped")
            await delivery.ack()
            return
        if mid in self.held:
            self.held[mid].delivery = delivery
            return
        if mid in self.stepping:  # redelivered while its step runs: that step accounts (and later acks) the fresh one
            self.stepping[mid].delivery = delivery
            return
        problem = out_of_vocabulary(msg, self.policy.vocab_size)
        if problem is not None:  # from no generator of this policy: it would fail the batch it joined, every time
            await delivery.dead_letter(problem)
            return
        problem = unpublished_version(msg, version)
        if problem is not None:  # weights this learner never published: not its policy, whatever the staleness says
            counters.inc("unpublished_version")
            if counters.get("unpublished_version") == 1:
                self.ctx.log.warning("learner.unpublished_version", id=mid, domain=msg.domain, reason=problem)
            await delivery.dead_letter(problem)
            return
        if self.config.domains and msg.domain not in self.config.domains:
            counters.inc("ignored_domain")
            await delivery.ack()
            return
        if msg.origin == "domain" and msg.domain not in domains_of(self.ctx.spec):  # removed from the spec since
            counters.inc(f"removed_domain.{msg.domain}")  # it was drawn: training on it would train what was removed
            await delivery.ack()
            return
        if msg.temperature <= 0:  # greedy samples carry no behavior distribution to correct for
            counters.inc("greedy_skipped")
            await delivery.ack()
            return
        if self.is_stale(msg, version):
            await self.drop_stale(delivery)
            return
        scored = [c for c in msg.completions if c.verdict != VERIFIER_ERROR]
        if len(scored) < len(msg.completions):  # the verifier failed on these: their 0 says nothing about the answer
            counters.inc(f"verifier_errors_skipped.{msg.domain}", len(msg.completions) - len(scored))
            if len(scored) < min(2, len(msg.completions)):  # no group left to compare within: consumed, no signal
                self.account([], [Held(delivery, msg, len(msg.completions))], step)
                self.ctx.report_soon()
                return
            msg = msg.model_copy(update={"completions": scored})
        held = Held(delivery, msg, len(msg.completions))
        if self.config.mode == "async":  # sync: a batch is what one version's prompts gave, signal or not
            held.samples = self.sample_maker.make(msg)
            if not held.samples:  # no signal (or every row too long): nothing to wait in the buffer for
                if held.samples is None:
                    self.sample_maker.count_no_signal(msg)
                self.account([], [held], step)
                self.ctx.report_soon()
                return
        self.held[mid] = held
        self.batcher.add(msg.domain, held, held.size if held.samples is None else len(held.samples))
        self.arrived.set()
        self.ctx.report_soon()  # delivered (no longer pending on the bus) and buffered: max_in_flight counts it here

    def is_stale(self, msg: ScoredMsg, version: int) -> bool:
        if msg.origin != "domain":  # production: served by the gated version, rated late (feedback_max_staleness)
            bound = self.config.feedback_max_staleness
            return bound is not None and group_staleness(msg, version) > bound
        return group_staleness(msg, version) > self.max_staleness

    async def drop_stale(self, delivery: Delivery[ScoredMsg]) -> None:
        self.ctx.counters.inc(f"dropped_stale.{delivery.payload.domain}", len(delivery.payload.completions))
        self.ctx.counters.inc("dropped_stale", len(delivery.payload.completions))
        await delivery.ack()

    def account(self, applied: list[Held], consumed: list[Held], step: int) -> None:
        """Ledger + audit trail for the step just taken (or for consumed groups when no step was taken)."""
        for held in [*applied, *consumed]:
            self.stepping.pop(held.delivery.id, None)
            self.unacked[held.delivery.id] = held.delivery
        self.ledger.add(h.delivery.id for h in [*applied, *consumed])
        now = time.time()
        for held, how in [*((h, "applied") for h in applied), *((h, "consumed") for h in consumed)]:
            rewards = [c.reward for c in held.msg.completions]
            self.metrics.add(
                "applied",
                {
                    "ts": now,
                    "step": step,
                    "message_id": held.delivery.id,
                    "domain": held.msg.domain,
                    "completions": held.size,
                    "how": how,
                    "reward": sum(rewards) / len(rewards),
                    "task_id": held.msg.task_id,
                },
            )
        self.ctx.counters.inc("samples_applied", sum(h.size for h in applied))
        self.ctx.counters.inc("groups_applied", len(applied))

    async def wait_written(self) -> None:
        """Until the checkpoint being written (if one is) is on disk."""
        if self.written is not None:
            await self.written.wait()

    def hand_to_checkpoint(self) -> dict[str, Delivery[ScoredMsg]]:
        """What a checkpoint taken now covers: from here on its write acks these (a redelivery meanwhile replaces its
        entry, never counts as a duplicate)."""
        pending = self.unacked
        self.unacked = {}
        self.writing, self.written = pending, anyio.Event()
        return pending

    async def ack_written(self, pending: dict[str, Delivery[ScoredMsg]]) -> None:
        """The checkpoint that covers ``pending`` is on disk: ack them."""
        for delivery in pending.values():  # (a redelivery that came meanwhile replaced its entry: acked here)
            await delivery.ack()
        self.writing = {}
        if self.written is not None:
            self.written.set()
            self.written = None

    async def keepalive(self) -> None:
        every = min(_KEEPALIVE_S_MAX, self.ctx.spec.bus.ack_wait_s / 3)
        while True:
            await anyio.sleep(every)
            waiting = [*self.unacked.values(), *self.writing.values()]
            for delivery in [h.delivery for h in [*self.held.values(), *self.stepping.values()]] + waiting:
                try:
                    await delivery.in_progress()
                except Exception as exc:  # a lost keepalive means a redelivery later: handled by the ledger
                    self.ctx.log.warning("learner.keepalive_failed", error=str(exc))
                    break
