"""The learner's held-out rounds on the bus: a round goes out on ``prompts``, its scores come back on ``scored``.

Contract:
- :meth:`HeldoutRounds.publish` sends one round labelled with the version it is given: every held-out prompt of
  every domain at once, once per decoding in ``eval_temperature`` (``_eval`` names the messages); ``baseline``: the
  post-warm-start round, read more closely when sampled. A publish that fails, or puts out only part of the round,
  takes its prompts back off ``out``: a round never complete is never reported, so it is not waited for.
- ``out``: the held-out prompts published and not scored yet, which the learner reports as ``eval_out``. They pass
  through the same stages as training groups, and the source's ``max_in_flight`` must not count them.
- :meth:`HeldoutRounds.on_scored` accounts one held-out score and acks it at once. A score of no round of this
  learner's weights (a version past its own: rolled back by a resume, or a foreign message) is counted in
  ``heldout_unknown_version`` and never evicts real rounds; one of a domain removed from the spec (or its held-out
  set) since the round went out, in ``removed_domain.<domain>``. A verifier's errors among the completions are left
  out of the round's accuracy and counted in ``heldout_verifier_errors.<domain>``. A complete round sets
  ``heldout_acc.<domain>`` (``heldout_acc@T<t>.<domain>`` for a decoding other than the first, and
  ``heldout_acc_start.<domain>`` at the first round) and writes an ``eval`` metrics row with its series.
- :meth:`HeldoutRounds.scored`: the held-out prompts scored are counted in ``eval_prompts_scored``; prompts out for
  ``_EVAL_LOST_S`` with no score back are written off (lost on the way: a generator restart, a dead-lettered
  message), counted in ``eval_prompts_lost``, so ``eval_out`` never holds a source back forever.
- ``due`` and ``baseline_out`` are the learner's to set: a round came due (every ``eval_every_steps`` steps, or a
  new series on a resume); the post-warm-start round is out and the first RL step waits for its scores (or for
  them to be written off: a lost round never holds RL back). With a weight average (``ema_decay``) a round measures
  the average: it goes out as a version of its own, and while it is out (``holds_weights``) no other version is
  published — the generators decode the whole round with it; a round that comes due meanwhile starts once that
  one is scored.

Non-goals: the accuracy arithmetic and what makes a round complete (``_eval``), publishing the average's version
(the learner's ``publish_weights``).
"""

from __future__ import annotations

import time

from actors.learner._config import LearnerConfig
from actors.learner._eval import EvalSeries, EvalTracker, eval_message_id, round_version
from actors.learner._metrics import MetricsWriter
from actors.protocol import ScoredMsg
from topology.bus import Delivery
from topology.runtime import ActorContext

__all__ = ["HeldoutRounds"]

_EVAL_LOST_S = 60.0  # held-out prompts with no score back for this long are written off (eval_out)


class HeldoutRounds:
    """The rounds out and the scores back; ``attach`` gives it the held-out sets once the learner has built them."""

    # set by attach() (the learner's start)
    evals: EvalTracker
    metrics: MetricsWriter

    def __init__(self, ctx: ActorContext, config: LearnerConfig) -> None:
        self.ctx, self.config = ctx, config
        self.channel = "prompts" if "prompts" in ctx.publishes else None
        self.out = 0  # held-out prompts published and not scored yet
        # a round is due; with an average it waits for the previous round's scores: rounds that overlapped would hold
        # the current weights back from the generators for as long as they kept overlapping
        self.due = False
        self.baseline_out = False  # the post-warm-start round is out: the first step waits for its scores
        self.heard = time.monotonic()  # the last held-out publish or score
        self.measures_average = False  # rounds measure the weights' moving average (ema_decay)
        self.series: dict[str, EvalSeries] = {}  # what each domain's held-out rounds measure (set by attach)

    def attach(
        self, evals: EvalTracker, series: dict[str, EvalSeries], metrics: MetricsWriter, *, measures_average: bool
    ) -> None:
        self.evals, self.series, self.metrics = evals, series, metrics
        self.measures_average = measures_average

    @property
    def publishable(self) -> bool:
        """There is a ``prompts`` channel to publish on and a held-out set to publish."""
        return self.channel is not None and bool(self.evals.tasks)

    @property
    def holds_weights(self) -> bool:
        """A round of the weights' average is being decoded: the generators hold the average until it is scored."""
        return self.measures_average and self.out > 0

    async def publish(self, version: int, *, baseline: bool = False) -> None:
        """Publish a round labelled ``version`` (nothing unless ``publishable``)."""
        if self.channel is None or not self.evals.tasks:
            return
        items = []
        for i, temperature in enumerate(self.config.eval_temperatures):
            samples = self.config.eval_samples_at(temperature, baseline=baseline)
            for tasks in self.evals.tasks.values():
                for task in tasks:
                    payload = {**task.payload(group_size=samples, heldout=True), "temperature": temperature}
                    message_id = eval_message_id(version, task, None if i == 0 else temperature)
                    items.append(("prompt", payload, message_id))
        self.scored(0)
        self.out += len(items)
        self.heard = time.monotonic()
        try:
            await self.ctx.bus.publish_many(self.channel, items, source=self.ctx.replica_id)
        except BaseException:  # not out, or not all of it: a round never complete is never reported, so not waited for
            self.out = max(0, self.out - len(items))
            raise
        self.ctx.report_soon()  # eval_out: a source steering by max_in_flight does not count these as training
        self.ctx.counters.inc("eval_rounds")
        self.ctx.log.info("learner.eval_published", version=version, prompts=len(items))

    async def on_scored(self, delivery: Delivery[ScoredMsg], version: int, step: int) -> None:
        """Account one held-out score (``version``, ``step``: the learner's now) and ack it."""
        counters, msg, mid = self.ctx.counters, delivery.payload, delivery.id
        if round_version(mid, msg) > version:  # no round of this learner's weights (rolled back by a resume,
            counters.inc("heldout_unknown_version")  # or a foreign message): counted, and never evicts real rounds
            await delivery.ack()
            return
        if not self.evals.expected(msg.domain):  # of a domain removed from the spec (or its held-out set) since
            counters.inc(f"removed_domain.{msg.domain}")  # the round went out: a round of nothing it measures
            await delivery.ack()
            self.scored(1)
            return
        result = self.evals.record(mid, msg)
        if result is not None and result.errors:
            counters.inc(f"heldout_verifier_errors.{result.domain}", result.errors)
            self.ctx.log.warning(
                "learner.heldout_verifier_errors",
                domain=result.domain,
                version=result.version,
                errors=result.errors,
                scored=result.n,
                note="the verifier failed on these held-out completions: left out of the round's accuracy",
            )
        if result is not None and result.n:
            headline = result.temperature == self.config.eval_temperatures[0]
            counters.set(
                f"heldout_acc{'' if headline else f'@T{result.temperature:g}'}.{result.domain}",
                round(result.accuracy, 4),
            )
            if headline and f"heldout_acc_start.{result.domain}" not in counters.snapshot():
                counters.set(f"heldout_acc_start.{result.domain}", round(result.accuracy, 4))
            series = self.series.get(result.domain)
            self.metrics.add(
                "eval",
                {
                    "ts": time.time(),
                    "step": step,
                    "version": result.version,
                    "domain": result.domain,
                    "series": series.key if series is not None else None,
                    "prompts": series.prompts if series is not None else None,
                    "verifier": series.verifier if series is not None else None,
                    "n": result.n,
                    "accuracy": result.accuracy,
                    "reward_mean": result.reward_mean,
                    "temperature": result.temperature,
                    "samples": (result.n + result.errors) // max(self.evals.expected(result.domain), 1),
                    "errors": result.errors,
                },
            )
            self.ctx.log.info(
                "learner.heldout",
                domain=result.domain,
                version=result.version,
                accuracy=round(result.accuracy, 4),
                temperature=result.temperature,
                n=result.n,
            )
        await delivery.ack()
        self.scored(1)
        self.ctx.report_soon()  # eval_out fell: a source steering by max_in_flight subtracts it from its count

    def scored(self, scored: int) -> None:
        """Account ``scored`` held-out prompts that came back. Prompts out for ``_EVAL_LOST_S`` with no score back
        are written off (lost on the way: a generator restart, a dead-lettered message), so ``eval_out`` never
        holds a source back forever; the round they belonged to is then never complete and never reported."""
        now = time.monotonic()
        if scored:
            self.out, self.heard = max(0, self.out - scored), now
            self.ctx.counters.inc("eval_prompts_scored", scored)
        elif self.out and now - self.heard > _EVAL_LOST_S:
            self.ctx.log.warning("learner.eval_prompts_lost", prompts=self.out, waited_s=round(now - self.heard))
            self.ctx.counters.inc("eval_prompts_lost", self.out)
            self.out = 0
