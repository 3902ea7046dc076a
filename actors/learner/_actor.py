"""The learner actor: ``scored`` in, new weight versions out — off-policy RL with exactly-once sample accounting.

Lifecycle:
- ``start``: build the policy from the spec; if ``state_dir`` holds a checkpoint, restore model, optimizer, step,
  version, advantage statistics and the applied ledger from it (``_resume``: its meta, and what the spec changed since);
  otherwise, when the policy has no checkpoint and ``warm_start.steps > 0`` (by default only for builtin models), run
  the supervised warm start (``_warmstart``) and checkpoint it. Then publish the weights (``_publish``) as version
  ``max(checkpointed, current in KV, newest the run numbered) + 1`` — also after a restart, so generators drop weights
  the crash rolled back, and also when the bus lost the KV entry (a bus brought back without its store: a version
  number used twice would label other weights, and scored groups of the old ones would read as unpublished) — and,
  after a warm start, publish a
  held-out evaluation round (the baseline). The first RL step waits until that round is scored (or written off, see
  ``_rounds``): the round then reads the post-warm-start weights alone, not the first steps' too, which a large model's
  round could span (every gain is measured from it).
- ``run``: a consumer task takes ``scored`` deliveries in: held-out scores to ``_rounds`` (accounted and acked at once),
  training groups to ``_intake`` (buffered; duplicates, stale, greedy or foreign ones dropped or dead-lettered; in
  ``async`` mode a group's samples made as it arrives, one without signal consumed there and then — accounted like an
  applied one, never buffered). Consumed groups wait for a checkpoint to be acked; when they reach ``batch_size ×
  checkpoint_every_steps`` the learner checkpoints without waiting for those steps, so the bus's ack window never fills.
  The train loop builds batches by domain weight (``_batcher``), with each group's samples (``_samples`` with
  ``_advantages``: groups, or a per-domain running baseline for single samples), takes one RL step (``_trainer``) in a
  worker thread, reports it (``_stepreport``), and every K steps publishes weights (``_publish``: no sooner than
  ``publish_min_interval_s`` after the previous version; one still due when the loop waits for a batch goes out then,
  so does one the bus was away for, once it is back),
  checkpoints and evaluates (``_rounds``: the held-out prompts out are reported as ``eval_out``). With ``ema_decay``
  (the default) a round measures the weights' moving average (``_average``, updated after every step): it goes out as a
  version of its own, and no other version is published until the round is scored. On stop the current step finishes, a
  final checkpoint is taken (the average in it) and what it covers is acked; the export is the average.

Exactly-once (see ``_ledger``): a training message is acked only after a checkpoint containing its effect *and*
its id (in the applied ledger) was written. On restart, a redelivered message whose id is in the restored ledger
is acked without being applied; anything applied after that checkpoint was never acked and comes back (after
``ack_wait_s``), to be applied again to the restored weights or, older by then than ``max_staleness`` (a generated
rollout, with the defaults, most often), dropped as stale and counted. Within a life, a message is kept alive from
its delivery to its ack, and a redelivery of it (after ``ack_wait_s`` anyway: the process was stopped, the bus away)
replaces the delivery wherever the message is (``_intake``). Every applied message is also written to
``metrics/applied-*.parquet`` with the step and the learner's incarnation (flushed before each checkpoint), which is
the audit trail tests use.

Checkpoints taken by the train loop are written in the background: the state is copied while nothing steps it
(milliseconds for a small model), training goes on while the copy is written, and the messages it covers are acked
once it is on disk — a redelivery of one of them meanwhile is recognised and acked with them. A checkpoint waits for
the one before it, and a failed write fails the run (as one awaited would).

Requirements: one replica (the ledger is per process; a sibling would receive un-acked messages), and
``bus.max_ack_pending`` ≥ twice ``checkpoint_every_steps × batch_size`` plus the buffer (one checkpoint's groups
being written, the next one's applied meanwhile) — the learner passes ``max_ack_pending`` to its consumer
accordingly. Held messages are kept alive with ``in_progress``.

``mode: sync``: staleness 0, a batch trains as soon as ``batch_size`` completions are in (or, short of them, once its
first group waited ``_SYNC_SHORT_FIRST_S`` and then three times the step cycle: completions lost on the way — a
verifier error, a refused prompt — would otherwise stop the loop, since the source publishes one batch per version),
weights are published after every step (``actors.source._actor``).

Weights go out through the transport named by ``weight_transport`` (``_publish``: the transports, the cadence, the
fallback to the disk, a bus that is away).

This module is the orchestrator: the lifecycle, the train loop and the checkpoints, over the fields they share (step,
version, phase, the policy, its optimizer and average). Each other idea lives in a module of its own, named above,
which is handed what it needs.

Non-goals: data-parallel learners.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import torch

from actors.domains import Task, domains_from_spec
from actors.learner._advantages import AdvantageEstimator
from actors.learner._average import WeightAverage
from actors.learner._batcher import DomainBatcher
from actors.learner._checkpoint import Checkpointer, learner_state, staged
from actors.learner._config import LearnerConfig, lr_for_log
from actors.learner._eval import EvalTracker, eval_series
from actors.learner._intake import Held, Intake, group_staleness
from actors.learner._ledger import AppliedLedger
from actors.learner._metrics import (
    MetricsWriter,
    heldout_first_and_last,
    plot_heldout,
)
from actors.learner._publish import WeightsOut, unless_bus_away
from actors.learner._resume import load_meta, meta_json, say_what_changed
from actors.learner._rounds import HeldoutRounds
from actors.learner._samples import REWARD_WINDOW, SampleMaker
from actors.learner._stepreport import report_step
from actors.learner._trainer import StepStats, Trainer, TrainSample
from actors.learner._warmstart import run_warm_start
from actors.policy import Policy, encode_prompt, native_bfloat16
from actors.protocol import LearnerStatus, ScoredMsg, domains_of, policy_of
from actors.weights import weight_transports
from topology.bus import Delivery
from topology.runtime import Actor, ActorContext

__all__ = ["LearnerActor"]

_IDLE_RETRY_S = 1.0  # a publish while idle failed (the bus away): try again after this long
# sync mode without partial_batch_after_s: a version's batch short of batch_size (a completion the verifier failed on,
# a prompt a generator refused, a replica that crashed) trains once its first group waited this long — at first, then
# three times the recent median step cycle, at least a second; the source publishes one batch per version, so
# waiting for the rest waited for ever
_SYNC_SHORT_FIRST_S = 5.0
_SYNC_SHORT_MIN_S = 1.0


class LearnerActor(Actor[LearnerConfig]):
    # set by start()
    policy: Policy
    trainer: Trainer
    sample_maker: SampleMaker
    checkpointer: Checkpointer
    metrics: MetricsWriter
    weights_out: WeightsOut

    def __init__(self, ctx: ActorContext, config: LearnerConfig) -> None:
        super().__init__(ctx, config)
        self.step = 0
        self.version = 0
        self.phase = "init"
        self._unstarted = False  # stopped during the warm start: start() returned early, run() and drain() do nothing
        self.lr = 0.0  # the RL learning rate, resolved in start (`lr: auto` depends on the policy's size)
        self._restored_taken_ts: float | None = None  # when the state of the checkpoint resumed from was taken
        self._idle_retry_at = 0.0  # _publish_while_idle: not before then (a publish failed: the bus is away)
        self._short_logged = float("-inf")  # when a sync-mode short batch was last logged
        self.estimator = AdvantageEstimator(normalize=config.normalize, decay=config.baseline_decay)
        names = list(config.domains) if config.domains else list(domains_of(ctx.spec))
        self.domain_names = names
        # the source draws prompts by weight, each bringing group_size completions: batches take each domain's
        # completions in that proportion, or a domain with smaller groups would be owed credit it never fills
        weights = {
            n: float(domains_of(ctx.spec)[n].weight) * domains_of(ctx.spec)[n].group_size
            for n in names
            if n in domains_of(ctx.spec)
        }
        self.batcher: DomainBatcher[Held] = DomainBatcher(
            weights,
            config.batch_size,
            fill_wait_s=0.0 if config.mode == "sync" else config.fill_wait_s,
            partial_after_s=config.partial_batch_after_s or (_SYNC_SHORT_FIRST_S if config.mode == "sync" else None),
            buffer_size=config.buffer_size,
        )
        self.intake = Intake(ctx, config, self.batcher)  # the buffer, the ledger, every message held until its ack
        self._tasks: anyio.abc.TaskGroup | None = None  # run()'s: where a checkpoint is written in the background
        self._unacked_limit = config.batch_size * config.checkpoint_every_steps  # then checkpoint early (see run)
        self._staleness_last: list[int] = []
        self._feedback_staleness: deque[int] = deque(maxlen=REWARD_WINDOW)  # of the latest production samples
        self.incarnation = f"{int(time.time() * 1000):013d}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self._last_checkpoint_step = -1
        self._steps_t: deque[float] = deque(maxlen=20)
        self.average: WeightAverage | None = None  # the weights' moving average (ema_decay), what rounds measure
        self.rounds = HeldoutRounds(ctx, config)  # the held-out rounds out and their scores back
        self._restored_domains: set[str] | None = None  # the domains the checkpoint resumed from trained (None: unsaid)

    # ------------------------------------------------------------------ start
    async def start(self) -> None:
        """Policy and optimizer; restore the latest checkpoint, or warm start and checkpoint; publish the first
        version (and, on a fresh start, the baseline held-out round)."""
        ctx, config = self.ctx, self.config
        if ctx.actor_spec.replicas != 1:
            raise ValueError(
                f"actors.{ctx.actor}.replicas: a learner runs as exactly 1 replica, got {ctx.actor_spec.replicas}"
            )
        torch.set_num_threads(ctx.threads)
        policy_spec = policy_of(ctx.spec)
        self.policy = await anyio.to_thread.run_sync(lambda: Policy.from_spec(policy_spec, device=config.device))
        params = self.policy.num_parameters()
        self.lr = config.resolved_lr(params)
        native = native_bfloat16(self.policy.device)
        mixed = config.precision == "bfloat16-mixed" or (config.precision == "auto" and native)
        if config.precision == "bfloat16-mixed" and not native:
            ctx.log.warning(
                "learner.bfloat16_emulated",
                device=str(self.policy.device),
                hint="this device has no native bfloat16: the steps are correct but slower than float32",
            )
        self.trainer = Trainer(
            self.policy,
            lr=self.lr,
            weight_decay=config.weight_decay,
            grad_clip=config.grad_clip,
            ppo=config.ppo(),
            ppo_epochs=config.ppo_epochs,
            minibatches=config.minibatches,
            with_reference=config.kl_beta > 0,
            autocast=torch.bfloat16 if mixed else None,
        )
        self.sample_maker = SampleMaker(ctx, config, self.policy, self.estimator)
        if config.ema_decay is not None and config.mode == "async":
            self.average = WeightAverage(self.policy, config.ema_decay)
        ema_decay = self.average.decay if self.average is not None else None  # recorded and logged: what rounds measure
        self.checkpointer = Checkpointer(ctx.state_dir / "checkpoints")
        self.metrics = MetricsWriter(ctx.run_dir, self.incarnation)
        self.intake.attach(self.policy, self.sample_maker, self.metrics)
        domains = domains_from_spec(ctx.spec, [n for n in self.domain_names if n in domains_of(ctx.spec)])
        evals = EvalTracker(
            self._heldout_that_fits({n: d.source.heldout()[: config.eval_size] for n, d in domains.items()})
        )
        specs = domains_of(ctx.spec)
        series = {
            name: eval_series(tasks, specs[name].verifier, specs[name].verifier_config)
            for name, tasks in evals.tasks.items()
        }
        self.rounds.attach(evals, series, self.metrics, measures_average=self.average is not None)
        transport = weight_transports(ctx)[config.transport_name(ctx.spec.runtime.kind, ctx.spec)]
        self.weights_out = WeightsOut(ctx, config, transport, self.metrics)

        latest = self.checkpointer.latest()
        if latest is not None:
            self.phase = "restore"
            await anyio.to_thread.run_sync(self._restore, latest)
            self.metrics.add(
                "lifecycle",
                {
                    "ts": time.time(),
                    "event": "resume",
                    "step": self.step,
                    "version": self.version,
                    "checkpoint": latest.name,
                    "checkpoint_ts": self._restored_taken_ts,  # when its state was taken (older checkpoints: None)
                    "lr": self.lr,
                    "params": params,
                    "ema_decay": ema_decay,
                },
            )
            ctx.log.info(
                "learner.resumed",
                checkpoint=str(latest),
                step=self.step,
                version=self.version,
                ledger=len(self.intake.ledger),
            )
            # the run's held-out figures so far: `flywheel status` and the live view measure climbs from the run's
            # first round, not from this life's first
            before, eval_every = self._restored_domains, config.eval_every_steps
            await anyio.to_thread.run_sync(
                lambda: say_what_changed(ctx, self.rounds, before, self.domain_names, eval_every)
            )
            temperature = config.eval_temperatures[0]
            found = await anyio.to_thread.run_sync(heldout_first_and_last, ctx.run_dir, temperature, self.rounds.series)
            for domain, (first, last) in found.items():
                ctx.counters.set(f"heldout_acc_start.{domain}", round(first, 4))
                ctx.counters.set(f"heldout_acc.{domain}", round(last, 4))
        else:
            self.metrics.add(
                "lifecycle",
                {
                    "ts": time.time(),
                    "event": "start",
                    "step": 0,
                    "version": 0,
                    "lr": self.lr,
                    "params": params,
                    "ema_decay": ema_decay,
                },
            )
            steps = policy_spec.warm_start_steps
            if policy_spec.checkpoint is None and steps > 0:
                self.phase = "warmstart"
                if not await run_warm_start(
                    ctx, self.trainer, self.metrics, domains, steps, config.warm_start_log_every
                ):
                    self._unstarted = True  # stopped part-way: no checkpoint, so a resumed run warm-starts afresh
                    return
            if self.trainer.reference is not None:
                self.trainer.reset_reference()  # the KL anchor is the post-warm-start policy
            if self.average is not None:
                self.average.reset()  # the average starts at the post-warm-start policy
            await self.checkpoint()  # a crash from here on never repeats the warm start
        self.metrics.flush()
        self.version = await self.weights_out.numbered_past(self.version)
        await self.publish_weights()
        if latest is None and config.eval_every_steps > 0:
            await self.publish_eval(baseline=True)  # the warm-start baseline, read more closely
            self.rounds.baseline_out = self.rounds.out > 0
        ctx.log.info(
            "learner.ready",
            version=self.version,
            step=self.step,
            params=params,
            lr=lr_for_log(self.lr, config.lr),
            precision="bfloat16-mixed" if self.trainer.autocast is not None else "float32",
            ema_decay=ema_decay,
            device=str(self.policy.device),
            torch_threads=ctx.threads,
            mode=config.mode,
            normalize=config.normalize,
            max_staleness=self.intake.max_staleness,
            weight_transport=config.transport_name(ctx.spec.runtime.kind, ctx.spec),
        )

    def _state(self, taken: float | None = None) -> dict[str, Any]:
        """What a checkpoint holds (`learner_state`); ``taken``: when (its ``taken_ts``, the ledger's cut: every
        ``applied`` row up to it is in the checkpoint, none after — both are written on the event loop)."""
        reference = self.trainer.reference.weights if self.trainer.reference is not None else None
        meta = meta_json(
            step=self.step,
            version=self.version,
            phase=self.phase,
            estimator=self.estimator,
            domains=sorted(set(self.domain_names) & set(domains_of(self.ctx.spec))),
            average=self.average,
            counters=self.ctx.counters.snapshot(),
            taken=taken,
        )
        average = self.average.policy.weights if self.average is not None else None
        return learner_state(
            self.policy.weights,
            self.trainer.optimizer,
            reference,
            meta=meta,
            ledger=self.intake.ledger.dumps(),
            average=average,
        )

    def _restore(self, path: Path) -> None:
        state = self._state()
        # a checkpoint taken without ema_decay has no average: it starts over from the restored weights
        fresh_average = self.average is not None and not self.checkpointer.holds(path, "average")
        if fresh_average:
            del state["average"]
        self.checkpointer.restore(path, state)
        for group in self.trainer.optimizer.param_groups:  # the spec's rate, not the one the checkpoint was run at
            group["lr"] = self.lr
        resumed = load_meta(str(state["extra"]["meta"]), self.estimator, self.average, self.ctx.counters)
        self.step, self.version = resumed.step, resumed.version
        self._restored_domains, self._restored_taken_ts = resumed.domains, resumed.taken_ts
        self.intake.ledger = AppliedLedger.loads(str(state["extra"]["ledger"]))
        self._last_checkpoint_step = self.step
        if self.average is not None and fresh_average:
            self.average.reset()

    # ------------------------------------------------------------------ run
    async def run(self) -> None:
        if self._unstarted:
            return
        config = self.config
        channel = self.ctx.input_channel
        # un-acked at most: the buffer, the groups a checkpoint being written covers, and as many again applied
        # meanwhile (the next checkpoint waits for that one) plus a batch
        window = config.buffer_size + config.batch_size * (2 * config.checkpoint_every_steps + 1)
        max_ack_pending = max(window, self.ctx.spec.bus.max_ack_pending)
        async with (
            self.ctx.bus.consume(
                channel,
                self.ctx.actor,
                model=ScoredMsg,
                batch=min(256, config.batch_size),
                max_ack_pending=max_ack_pending,
            ) as scored,
            anyio.create_task_group() as tg,
        ):
            self._tasks = tg
            tg.start_soon(self._consume, scored)
            tg.start_soon(self.intake.keepalive)
            tg.start_soon(self._periodic)
            self.phase = "rl"
            await self._train_loop()
            await self.checkpoint()  # covers every step taken, then acks what it covers
            self._tasks = None
            tg.cancel_scope.cancel()

    async def drain(self) -> None:
        # run() already checkpointed and acked every applied message; buffered ones stay un-acked (redelivered).
        from actors.learner._export import export_safetensors

        if self._unstarted:  # weights part-way through the warm start: nothing to export
            return
        self.metrics.flush()
        await anyio.to_thread.run_sync(plot_heldout, self.ctx.run_dir)
        average = self.average
        exported = average.policy if average is not None else self.policy  # what the held-out rounds measured
        extra: dict[str, Any] = {"step": self.step, "version": self.version, "weights": "current"}
        if average is not None:
            extra.update(weights="average", ema_decay=average.decay)
        await anyio.to_thread.run_sync(lambda: export_safetensors(exported, self.ctx.run_dir / "export", extra=extra))
        self.ctx.log.info("learner.drained", step=self.step, version=self.version, held=len(self.intake.held))

    async def stop(self) -> None:
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.flush()
        weights_out = getattr(self, "weights_out", None)
        if weights_out is not None:
            weights_out.close()  # the shared-memory slots; a resumed run publishes again from its checkpoint

    def report(self) -> dict[str, Any]:
        counters: dict[str, Any] = dict(self.ctx.counters.snapshot())
        counters.update(
            phase=self.phase,
            step=self.step,
            version=self.version,
            buffered=self.batcher.completions,
            unacked=len(self.intake.unacked) + len(self.intake.writing),
            **LearnerStatus(buffered_groups=len(self.intake.held), eval_out=self.rounds.out).counters(),
        )
        if len(self._steps_t) >= 2:
            counters["steps_per_s"] = round(
                (len(self._steps_t) - 1) / max(self._steps_t[-1] - self._steps_t[0], 1e-9), 3
            )
        return counters

    # ------------------------------------------------------------------ consuming
    async def _consume(self, scored: Any) -> None:
        # cancelled by run() once the train loop has finished; a cancelled __anext__ loses nothing
        async for delivery in scored:
            if delivery.payload.heldout:
                await self.rounds.on_scored(delivery, self.version, self.step)
            else:
                await self.intake.on_delivery(delivery, self.version, self.step)
            while self.batcher.completions >= self.config.buffer_size and not self.ctx.stopping.is_set():
                with anyio.move_on_after(0.05):  # the buffer is full: stop pulling until a step frees room
                    await self.ctx.stopping.wait()

    async def _periodic(self) -> None:
        last_plot = time.monotonic()
        while True:
            await anyio.sleep(self.config.metrics_flush_s)
            await anyio.to_thread.run_sync(self.metrics.flush)
            try:
                await anyio.to_thread.run_sync(self.metrics.compact, self.config.metrics_compact_parts)
            except OSError as exc:  # a full disk, say: the parts stay as they are, readers read them all
                self.ctx.counters.inc("metrics_compact_errors")
                self.ctx.log.warning("learner.metrics_compact_failed", error=str(exc))
            if time.monotonic() - last_plot >= self.config.plot_every_s:
                last_plot = time.monotonic()
                await anyio.to_thread.run_sync(plot_heldout, self.ctx.run_dir)

    # ------------------------------------------------------------------ training
    async def _train_loop(self) -> None:
        rounds = self.rounds
        if rounds.baseline_out:
            self.ctx.log.info("learner.waiting_for_baseline_round", prompts=rounds.out)
        while not self.ctx.stopping.is_set():
            if rounds.baseline_out:
                rounds.scored(0)  # (writes off prompts lost on the way: a lost round never holds RL back)
                rounds.baseline_out = rounds.out > 0
            if rounds.baseline_out or not self.batcher.ready():
                await self._publish_while_idle()
                if len(self.intake.unacked) >= self._unacked_limit:  # consumed groups fill the ack window: ack them
                    await self.checkpoint(background=True)
                # woken by the next arrival (a batch may now be complete) or after 50 ms (readiness by waiting
                # time, stop requests)
                with anyio.move_on_after(0.05):
                    await self.intake.arrived.wait()
                self.intake.arrived = anyio.Event()
                continue
            await self.train_once()
            self.ctx.report_soon()  # buffered_groups fell by a batch: a source steering by max_in_flight reads it

    def _heldout_that_fits(self, heldout: dict[str, list[Task]]) -> dict[str, list[Task]]:
        """The held-out tasks whose prompt leaves the model room to answer. A generator refuses a longer one (and
        dead-letters it): its score never comes, and every round it is in waited ``_rounds``' write-off time (60 s)
        with no other version published, then was never reported. Those left out are counted and logged."""
        context, tokenizer = self.policy.max_context, self.policy.tokenizer
        fitting: dict[str, list[Task]] = {}
        for name, tasks in heldout.items():
            fits = [len(encode_prompt(tokenizer, task.prompt)) < context for task in tasks]
            fitting[name] = [task for task, ok in zip(tasks, fits, strict=True) if ok]
            left_out = [task for task, ok in zip(tasks, fits, strict=True) if not ok]
            if left_out:
                self.ctx.counters.set(f"heldout_too_long.{name}", len(left_out))
                self.ctx.log.warning(
                    "learner.heldout_too_long",
                    domain=name,
                    left_out=len(left_out),
                    of=len(tasks),
                    context=context,
                    prompts=[task.prompt[:60] for task in left_out[:3]],
                    note="prompts the model's context cannot hold (a generator refuses them): left out of the rounds",
                )
        return fitting

    async def _publish_while_idle(self) -> None:
        """What is due and did not go out at the last step — a version the bus was away for, or held back by
        ``publish_min_interval_s``; a round the bus was away for, or one that came due while the previous one was
        out — goes out while the learner waits for a batch, not at its next step: a sync-mode source sends no batch
        until it sees that version, so the next step would never come. After a failed try, the next waits a second."""
        if time.monotonic() < self._idle_retry_at:
            return
        sent = True
        if self.step and self._publish_due():
            sent = await unless_bus_away(self.ctx, self.publish_weights, "learner.publish_deferred", step=self.step)
        rounds = self.rounds
        if sent and rounds.due and not rounds.holds_weights:
            sent = await unless_bus_away(self.ctx, self.publish_eval, "learner.eval_deferred", step=self.step)
            rounds.due = not sent
        if not sent:
            self._idle_retry_at = time.monotonic() + _IDLE_RETRY_S

    async def train_once(self) -> StepStats | None:
        """Take one batch from the buffer and apply it (one RL step); None when nothing was trainable."""
        samples: list[TrainSample] = []
        applied: list[Held] = []
        consumed: list[Held] = []  # zero-signal groups: no effect on the weights, accounted like applied ones
        self._staleness_last = []
        intake = self.intake
        while len(samples) < self.config.batch_size:
            groups = self.batcher.take(self.config.batch_size - len(samples))
            if not groups:
                break
            for held in groups:
                del intake.held[held.delivery.id]
                if intake.is_stale(held.msg, self.version):
                    await intake.drop_stale(held.delivery)
                    continue
                group_samples = held.samples if held.samples is not None else self.sample_maker.make(held.msg)
                if group_samples is None:
                    consumed.append(held)
                    intake.stepping[held.delivery.id] = held
                    self.sample_maker.count_no_signal(held.msg)
                    continue
                samples.extend(group_samples)
                applied.append(held)
                intake.stepping[held.delivery.id] = held
                if held.msg.origin == "domain":  # production samples' staleness is the gate's lag: reported apart
                    self._staleness_last.append(group_staleness(held.msg, self.version))
                else:
                    self._feedback_staleness.append(group_staleness(held.msg, self.version))
        if not applied:
            intake.account([], consumed, self.step)
            if consumed and self.config.mode == "sync":
                await self.publish_weights()  # same weights, new version: the source waits for it to go on
            return None
        taken = sum(held.size for held in (*applied, *consumed))  # (groups without signal count: they came)
        if self.config.mode == "sync" and taken < self.config.batch_size:
            self._short_batch(taken)
        started = time.perf_counter()
        stats = await anyio.to_thread.run_sync(self._rl_step, samples)
        step_s = time.perf_counter() - started
        self.step += 1
        self._steps_t.append(time.monotonic())
        if self.config.mode == "sync" and self.config.partial_batch_after_s is None:
            self.batcher.partial_after_s = _sync_short_after_s(self._steps_t)
        intake.account(applied, consumed, self.step)
        report_step(
            self.ctx,
            self.metrics,
            stats,
            applied,
            step=self.step,
            version=self.version,
            step_s=step_s,
            staleness=self._staleness_last,
            feedback_staleness=self._feedback_staleness,
            rewards=self.sample_maker.rewards,
        )
        if self._publish_due():  # a version not announced stays due: _publish_due() says so again next step
            await unless_bus_away(self.ctx, self.publish_weights, "learner.publish_deferred", step=self.step)
        if self.step % self.config.checkpoint_every_steps == 0:
            await self.checkpoint(background=True)
        rounds = self.rounds
        if self.config.eval_every_steps and self.step % self.config.eval_every_steps == 0:
            rounds.due = True
        if rounds.due and not rounds.holds_weights:
            rounds.due = not await unless_bus_away(self.ctx, self.publish_eval, "learner.eval_deferred", step=self.step)
        elif rounds.out:
            rounds.scored(0)  # (writes off prompts lost on the way)
        return stats

    def _short_batch(self, completions: int) -> None:
        """A sync-mode batch trained short of ``batch_size`` completions: counted, logged at most once a minute."""
        self.ctx.counters.inc("sync_short_batches")
        now = time.monotonic()
        if now - self._short_logged >= 60.0:
            self._short_logged = now
            self.ctx.log.warning(
                "learner.sync_short_batch",
                completions=completions,
                batch_size=self.config.batch_size,
                waited_s=round(self.batcher.partial_after_s or 0.0, 2),
                why="completions of this version's batch were lost on the way (verifier errors, a refused prompt, "
                "a crashed replica): trained as it is rather than waiting for them",
            )

    def _rl_step(self, samples: list[TrainSample]) -> StepStats:
        """One RL step, then the weights' average follows it (in the same worker thread)."""
        stats = self.trainer.rl_step(samples)
        if self.average is not None:
            self.average.update()
        return stats

    # ------------------------------------------------------------------ weights, checkpoints, evals
    def _publish_due(self) -> bool:
        """A version is due (``_publish``) — and, with a weight average, no round of it is out: the generators hold
        the average until they have decoded the round."""
        if self.rounds.holds_weights:
            return False
        return self.weights_out.due(self.step)

    async def publish_weights(self, *, average: bool = False) -> None:
        """Publish the current weights (``average``: the weights' moving average) as the next version."""
        source = self.average.policy if average and self.average is not None else self.policy
        # the parameters themselves, not a copy: every transport copies (or sends) them before publish returns, and
        # nothing steps them meanwhile (the train loop awaits this)
        state = {name: t.detach() for name, t in source.state_dict().items()}
        self.version = max(self.version, await self.weights_out.newest()) + 1
        weights = "average" if source is not self.policy else "current"
        await self.weights_out.publish(self.version, state, step=self.step, weights=weights)

    async def checkpoint(self, *, background: bool = False) -> None:
        """Snapshot everything, then ack every message the snapshot covers. ``background`` (the train loop's, while
        run() runs): the state is copied while nothing steps it (``checkpoint_stage_s``) and written by a task of
        run()'s own while training goes on; the messages it covers are acked once it is on disk. A checkpoint
        first waits for the one still being written, so at most one is in flight; a failed write fails run()."""
        await self.intake.wait_written()
        if self.step == self._last_checkpoint_step and not self.intake.unacked:
            return
        self.metrics.flush(("applied", "step", "lifecycle"))  # the audit trail reaches disk before the snapshot
        step, version, self._last_checkpoint_step = self.step, self.version, self.step
        pending = self.intake.hand_to_checkpoint()  # from here on its write acks these
        # what the checkpoint holds is the state at this instant: its lifecycle row carries this time, so the audit
        # trail (`effective_applied`) counts what was applied after it as not covered, however long the write takes
        taken = time.time()
        state = self._state(taken)  # (on the event loop: the counters and the ledger are its own)
        tasks = self._tasks if background else None
        if tasks is None:
            await self._write_checkpoint(step, version, taken, state, pending)
            return
        started = time.perf_counter()
        state = await anyio.to_thread.run_sync(staged, state)
        self.ctx.counters.set("checkpoint_stage_s", round(time.perf_counter() - started, 4))
        tasks.start_soon(self._write_checkpoint, step, version, taken, state, pending)

    async def _write_checkpoint(
        self, step: int, version: int, taken: float, state: dict[str, Any], pending: dict[str, Delivery[ScoredMsg]]
    ) -> None:
        started = time.perf_counter()
        await anyio.to_thread.run_sync(self.checkpointer.save, step, state)
        self.metrics.add("lifecycle", {"ts": taken, "event": "checkpoint", "step": step, "version": version})
        self.ctx.counters.set("checkpoint_s", round(time.perf_counter() - started, 3))
        self.ctx.counters.set("last_checkpoint_step", step)
        await self.intake.ack_written(pending)

    async def publish_eval(self, *, baseline: bool = False) -> None:
        """Publish a held-out round (``_rounds``) labelled with the current version; with a weight average, the
        average goes out first as a version of its own, which the round measures (the baseline: the same weights)."""
        if not self.rounds.publishable:
            return
        if self.average is not None and not baseline:  # the round measures the average (the baseline: the same)
            await self.publish_weights(average=True)
        await self.rounds.publish(self.version, baseline=baseline)


def _sync_short_after_s(steps_t: deque[float]) -> float:
    """How long a sync-mode batch short of ``batch_size`` waits before it trains (see ``_SYNC_SHORT_FIRST_S``)."""
    cycles = [b - a for a, b in zip(steps_t, list(steps_t)[1:], strict=False)]
    if len(cycles) < 3:
        return _SYNC_SHORT_FIRST_S
    return max(_SYNC_SHORT_MIN_S, 3.0 * statistics.median(cycles))
