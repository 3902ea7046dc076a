"""The verify actor: ``rollouts`` in, ``scored`` out, code run in a warm sandbox pool.

Every completion of a rollout is scored with its domain's verifier (built once per domain from the spec); the
group is published as one ``scored`` message with a reward, a verdict and the time it took per completion,
then the rollout is acked. Scoring never raises: a verifier failure is an ``internal_error`` verdict
(``VERIFIER_ERROR``) with reward 0, so one bad completion cannot stall the channel; it is counted per domain
(``verifier_errors.<domain>``, shown by the live view) and logged with its detail (the exception the user's function
raised, say) at the first one and then at most once a minute per domain. The learner does not train on it. So is a
user's ``module:function`` verifier's call that timed out (``verifier_timeouts.<domain>``; reward 0). Verdicts are
counted by name (``verdict.<name>``) up to ``_MAX_VERDICTS`` names, the rest as ``verdict.other``. Up to
``max_in_flight`` rollouts are verified at once; the sandbox pool's own bounded queue provides the backpressure beyond
that. A rollout being verified has its ack timer reset every ``ack_wait_s / 3`` (10 s at most), however slow its
verifier; should it be redelivered anyway (a lost keepalive), the redelivery is not verified a second time: the
handler already at work settles the newest delivery.

The ``python-expr`` verifier remembers the sandbox's answer per expression text (see its module); the report's
``sandbox_runs.<domain>`` and ``memo_hits.<domain>`` say how many jobs that saved. The report's ``isolation`` is the
sandbox level in force (``bwrap`` unless the spec opted in to less), shown by ``flywheel status`` and the live view;
every scored completion's verdict was decided outside the code it ran (see ``actors.sandbox``).

Where a domain trains on references (``failed_groups: reference``, `failed_groups_of`) and no completion of a group
is correct, the task's reference is scored too, as one more completion would be, and the message carries its reward
(``reference_reward``): the learner trains only on a reference scored correct. A reference that fails (a wrong dataset
row) is counted in ``reference_failed.<domain>`` and logged with the task id and why (at the first, then at most once
a minute per domain). A task's reference is scored once (remembered by task id and text, the newest
``_REFERENCE_MEMO`` tasks).

Non-goals: no caching of other verifiers' verdicts (they are cheap, or run code whose tests may differ per
task), no verifier hot reload.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import anyio

from actors.domains import DomainVerifier, Scorer
from actors.protocol import (
    CORRECT,
    VERIFIER_ERROR,
    RolloutMsg,
    ScoredCompletion,
    ScoredMsg,
    count_removed_domain,
    domains_of,
    failed_groups_of,
)
from actors.sandbox import SandboxPool
from actors.verify._config import VerifyConfig
from topology.bus import Delivery, InFlight, Outbox
from topology.runtime import Actor, ActorContext, iterate_until

__all__ = ["VerifyActor"]

_ERROR_LOG_EVERY_S = 60.0  # a domain's verifier errors (and failed references) are logged at most this often
_MAX_VERDICTS = 32  # distinct verdicts counted by name; more are counted as verdict.other
_REFERENCE_MEMO = 4096  # tasks whose reference's score is remembered (a task comes back every epoch)


class VerifyActor(Actor[VerifyConfig]):
    def __init__(self, ctx: ActorContext, config: VerifyConfig) -> None:
        super().__init__(ctx, config)
        self._pool: SandboxPool | None = None
        self._scorer: Scorer | None = None
        self._outbox: Outbox | None = None
        wanted = set(config.domains) if config.domains else set(domains_of(ctx.spec))
        self._domains = {name: d for name, d in domains_of(ctx.spec).items() if name in wanted}
        self._logged: dict[tuple[str, str], float] = {}  # (counter, domain) → when it was last logged (monotonic)
        self._verdicts: set[str] = set()  # the verdicts counted by name (_verdict_key)
        self._verdicts_capped = False  # more than _MAX_VERDICTS were seen (said once)
        # rollouts being verified: their ack timers kept reset, so that a slow verifier (a user's function near its
        # time limit, a group of sandboxed programs) never sees one redelivered meanwhile, nor dead-lettered after
        # `bus.max_deliver` redeliveries; a redelivery that comes anyway is settled by the verification under way
        self._verifying: InFlight[RolloutMsg] = InFlight(ctx.bus.settings.ack_wait_s, on_failure=self._keepalive_failed)
        self._guided = {name for name in self._domains if failed_groups_of(ctx.spec, name) == "reference"}
        self._references: OrderedDict[tuple[str, str, str], float] = OrderedDict()  # (domain, task, text) → reward
        self._reference_logged: dict[str, float] = {}  # domain → when its last failed reference was logged

    async def start(self) -> None:
        self._pool = SandboxPool.from_config(self.config.sandbox)
        await self._pool.start()
        verifiers = {
            name: DomainVerifier(d.verifier, dict(d.verifier_config), d.verifier_timeout_s, d.verifier_processes)
            for name, d in self._domains.items()
        }
        self._scorer = Scorer(verifiers, pool=self._pool)
        self.ctx.log.info("verify.ready", isolation=self._pool.statistics().isolation, domains=sorted(self._domains))

    async def run(self) -> None:
        channel_in = self.ctx.input_channel
        limit = anyio.CapacityLimiter(self.config.max_in_flight)
        # the work group closes before the consumer does, so every accepted rollout is acked (or nak'ed)
        # (and the outbox sends what they queued before the consumer closes)
        async with (
            self.ctx.bus.consume(
                channel_in, self.ctx.actor, model=RolloutMsg, batch=min(64, self.config.max_in_flight)
            ) as rollouts,
            Outbox(self.ctx.bus, source=self.ctx.replica_id) as outbox,
            anyio.create_task_group() as keep,
        ):
            self._outbox = outbox
            keep.start_soon(self._verifying.keepalive)
            try:
                async with anyio.create_task_group() as work:
                    async for delivery in iterate_until(rollouts, self.ctx.stopping):
                        if not self._verifying.begin(delivery):  # redelivered while being verified: that one settles it
                            self.ctx.counters.inc("redelivered_while_verifying")
                            continue
                        await limit.acquire_on_behalf_of(delivery.id)
                        work.start_soon(self._handle, delivery, limit, outbox)
            finally:
                keep.cancel_scope.cancel()

    def _keepalive_failed(self, exc: Exception) -> None:
        self.ctx.log.warning("verify.keepalive_failed", error=str(exc))

    async def stop(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()

    def report(self) -> dict[str, Any]:
        counters: dict[str, Any] = dict(self.ctx.counters.snapshot())
        if self._pool is not None:
            stats = self._pool.statistics()
            counters["sandbox_queue"] = float(stats.queued)
            counters["isolation"] = stats.isolation  # what `flywheel status` and the live view show
        if self._scorer is not None:
            counters.update({key: float(value) for key, value in self._scorer.memo_stats().items()})
        if self._outbox is not None and self._outbox.per_batch is not None:
            counters["outbox_batch"] = self._outbox.per_batch
        return counters

    def _verdict_key(self, verdict: str) -> str:
        """The counter a verdict is counted under: itself, or ``other`` once ``_MAX_VERDICTS`` others were seen (a
        user's verifier may name its verdicts; every counter goes into each heartbeat and the metrics)."""
        if verdict in self._verdicts:
            return verdict
        if len(self._verdicts) < _MAX_VERDICTS:
            self._verdicts.add(verdict)
            return verdict
        if not self._verdicts_capped:
            self._verdicts_capped = True
            self.ctx.log.warning(
                "verify.verdicts_capped",
                seen=sorted(self._verdicts),
                first_other=verdict[:60],
                note=f"more than {_MAX_VERDICTS} distinct verdicts: further ones are counted as verdict.other",
            )
        return "other"

    def _counted(self, counter: str, domain: str, event: str, detail: str, **extra: str) -> None:
        """Count ``counter.<domain>`` and say why in the log as ``event``: at the first one, then at most once a
        minute per domain (a verifier that fails, or hangs, on every answer would otherwise flood it). Verifier errors
        (``verifier_errors``), and a user's verifier calls that outlasted their limit (``verifier_timeouts``: a
        hostile answer can make a verifier hang; one slow on every answer scores nothing and holds its helpers)."""
        counters = self.ctx.counters
        counters.inc(f"{counter}.{domain}")
        now = time.monotonic()
        if now - self._logged.get((counter, domain), -_ERROR_LOG_EVERY_S) >= _ERROR_LOG_EVERY_S:
            self._logged[(counter, domain)] = now
            total = int(counters.get(f"{counter}.{domain}"))
            verifier = self._domains[domain].verifier
            self.ctx.log.warning(event, domain=domain, verifier=verifier, detail=detail, total=total, **extra)

    async def _reference_reward(self, rollout: RolloutMsg, rewards: list[float]) -> float | None:
        """The score of the task's reference when the learner may train on it (a group of several completions, none
        correct, in a domain that trains on references), else None. A failing reference is counted and logged."""
        assert self._scorer is not None
        if (
            rollout.domain not in self._guided
            or not rollout.reference
            or rollout.heldout
            or len(rewards) < 2
            or max(rewards) >= CORRECT
        ):
            return None
        key = (rollout.domain, rollout.task_id, rollout.reference)
        known = self._references.get(key)
        if known is not None:
            self._references.move_to_end(key)
            return known
        result = await self._scorer.score(rollout.domain, rollout.reference, rollout.verifier_fields)
        if result.verdict == VERIFIER_ERROR:  # says nothing about the reference: not remembered, not trained on
            self._counted("verifier_errors", rollout.domain, "verify.verifier_error", result.detail)
            return None
        self._references[key] = result.reward
        if len(self._references) > _REFERENCE_MEMO:
            self._references.popitem(last=False)
        if result.reward < CORRECT:
            counters = self.ctx.counters
            counters.inc(f"reference_failed.{rollout.domain}")
            now = time.monotonic()
            if now - self._reference_logged.get(rollout.domain, -_ERROR_LOG_EVERY_S) >= _ERROR_LOG_EVERY_S:
                self._reference_logged[rollout.domain] = now
                self.ctx.log.warning(
                    "verify.reference_failed",
                    domain=rollout.domain,
                    task_id=rollout.task_id,
                    verdict=str(result.verdict),
                    detail=result.detail[:200],
                    total=int(counters.snapshot().get(f"reference_failed.{rollout.domain}", 0)),
                    note="the task's reference fails its own verifier: the learner will not train on it",
                )
        return result.reward

    async def _handle(self, delivery: Delivery[RolloutMsg], limit: anyio.CapacityLimiter, outbox: Outbox) -> None:
        assert self._scorer is not None
        rollout = delivery.payload
        try:
            if rollout.domain not in domains_of(self.ctx.spec):  # removed since it was drawn (a resume with an edited
                await delivery.ack()  # spec): nothing here may score or train it — not a malformed message either
                count_removed_domain(self.ctx, rollout.domain, "rollouts")
                return
            if rollout.domain not in self._domains:
                await delivery.dead_letter(f"no verifier here for domain {rollout.domain!r}")
                self.ctx.counters.inc("unknown_domain")
                return
            started = time.perf_counter()
            scored: list[ScoredCompletion] = []
            results: list[Any] = [None] * len(rollout.completions)
            if self._scorer.in_process(rollout.domain):  # no sandbox to overlap: one after another, no tasks
                for index, completion in enumerate(rollout.completions):
                    results[index] = await self._scorer.score(rollout.domain, completion.text, rollout.verifier_fields)
            else:
                async with anyio.create_task_group() as group:

                    async def one(index: int, text: str) -> None:
                        assert self._scorer is not None
                        results[index] = await self._scorer.score(rollout.domain, text, rollout.verifier_fields)

                    for index, completion in enumerate(rollout.completions):
                        group.start_soon(one, index, completion.text)
            for completion, result in zip(rollout.completions, results, strict=True):
                scored.append(
                    ScoredCompletion(
                        **completion.model_dump(),
                        reward=result.reward,
                        verdict=str(result.verdict),
                        detail=result.detail[:200],
                    )
                )
                self.ctx.counters.inc(f"verdict.{self._verdict_key(str(result.verdict))}")
                if result.verdict == VERIFIER_ERROR:
                    self._counted("verifier_errors", rollout.domain, "verify.verifier_error", result.detail)
                elif result.verdict == "timeout" and ":" in self._domains[rollout.domain].verifier:
                    hint = (
                        f"reward 0; a verifier slow on every answer needs domains.{rollout.domain}.verifier_timeout_s"
                    )
                    self._counted(
                        "verifier_timeouts", rollout.domain, "verify.verifier_timeout", result.detail, hint=hint
                    )
            message = ScoredMsg(
                task_id=rollout.task_id,
                domain=rollout.domain,
                prompt_ids=rollout.prompt_ids,
                prompt=rollout.prompt,
                verifier_fields=rollout.verifier_fields,
                heldout=rollout.heldout,
                temperature=rollout.temperature,
                origin="domain",
                generator=rollout.generator,
                generate_s=rollout.generate_s,
                verify_s=time.perf_counter() - started,
                completions=scored,
                reference=rollout.reference,
                reference_reward=await self._reference_reward(rollout, [c.reward for c in scored]),
            )
            await outbox.send(
                self.ctx.output_channel("scored"),
                "scored",
                message.model_dump(mode="json"),
                id=f"{delivery.id}.s",
                delivery=self._verifying.newest(delivery),  # the newest delivery, if it was redelivered
            )
            self.ctx.counters.inc("rollouts")
            self.ctx.counters.inc("completions", len(scored))
            mean = sum(c.reward for c in scored) / len(scored)
            self.ctx.counters.set(f"reward.{rollout.domain}", round(mean, 3))
        except Exception as exc:
            self.ctx.counters.inc("errors")
            self.ctx.log.warning("verify.rollout_failed", task_id=rollout.task_id, error=str(exc))
            await self._verifying.newest(delivery).nak(delay_s=1.0)
        finally:
            self._verifying.end(delivery.id)
            limit.release_on_behalf_of(delivery.id)
