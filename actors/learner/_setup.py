"""Bringing a learner up: policy, optimizer, restore-or-warm-start, first weights version, checkpoint contents.

Split from ``_actor`` to keep the actor's loop readable. ``setup_learner`` is the body of ``LearnerActor.start``;
``app_state`` is what every checkpoint holds (the same keys restore into):

- ``model`` — the policy's weights module; ``optim`` — the RL optimizer (AdamW state);
- ``reference`` — the frozen KL reference (only when ``kl_beta > 0``: it is the post-warm-start policy, which a
  restart could not rebuild otherwise);
- ``extra`` — a ``torchsnapshot.StateDict`` with ``meta`` (JSON: step, version, phase, advantage statistics,
  cumulative counters) and ``ledger`` (the applied message ids, newline separated).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import torch

from actors.domains import domains_from_spec
from actors.learner._checkpoint import Checkpointer
from actors.learner._eval import EvalTracker
from actors.learner._ledger import AppliedLedger
from actors.learner._loss import PPOConfig
from actors.learner._metrics import MetricsWriter
from actors.learner._trainer import Trainer
from actors.learner._warmstart import warm_start
from actors.policy import Policy
from actors.weights import WeightPublisher, WeightTransport

if TYPE_CHECKING:
    from actors.learner._actor import LearnerActor

__all__ = ["app_state", "setup_learner"]


def app_state(actor: LearnerActor) -> dict[str, Any]:
    from torchsnapshot import StateDict

    state: dict[str, Any] = {
        "model": actor.policy.weights,
        "optim": actor.trainer.optimizer,
        "extra": StateDict(meta=_json(actor.meta()), ledger=actor.ledger.dumps()),
    }
    if actor.trainer.reference is not None:
        state["reference"] = actor.trainer.reference.weights
    return state


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


async def setup_learner(actor: LearnerActor) -> None:
    ctx, config = actor.ctx, actor.config
    threads = max(1, math.ceil(ctx.spec.actors[ctx.actor].resources.num_cpus or 1))
    torch.set_num_threads(threads)
    device = config.device
    policy = await anyio.to_thread.run_sync(lambda: Policy.from_spec(ctx.spec.policy, device=device))
    actor.policy = policy
    actor.trainer = Trainer(
        policy,
        lr=config.lr,
        weight_decay=config.weight_decay,
        grad_clip=config.grad_clip,
        ppo=PPOConfig(
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            iw_cap=config.iw_cap,
            kl_coef=config.kl_beta,
            aggregate=config.loss_aggregation,
        ),
        ppo_epochs=config.ppo_epochs,
        minibatches=config.minibatches,
        with_reference=config.kl_beta > 0,
    )
    actor.checkpointer = Checkpointer(ctx.state_dir / "checkpoints")
    actor.metrics = MetricsWriter(ctx.run_dir, actor.incarnation)
    domains = domains_from_spec(ctx.spec, [n for n in actor.domain_names if n in ctx.spec.domains])
    actor.evals = EvalTracker({name: d.source.heldout()[: config.eval_size] for name, d in domains.items()})
    actor.publisher = WeightPublisher(ctx.bus, ctx.topology, _transport(actor))

    latest = actor.checkpointer.latest()
    fresh = latest is None
    if latest is not None:
        actor.phase = "restore"
        await anyio.to_thread.run_sync(_restore, actor, latest)
        actor.metrics.add(
            "lifecycle",
            {
                "ts": time.time(),
                "event": "resume",
                "step": actor.step,
                "version": actor.version,
                "checkpoint": latest.name,
            },
        )
        ctx.log.info(
            "learner.resumed", checkpoint=str(latest), step=actor.step, version=actor.version, ledger=len(actor.ledger)
        )
    else:
        actor.metrics.add("lifecycle", {"ts": time.time(), "event": "start", "step": 0, "version": 0})
        warm = ctx.spec.policy.warm_start
        steps = ctx.spec.policy.warm_start_steps
        if ctx.spec.policy.checkpoint is None and steps > 0:
            await _warm_start(actor, domains, steps, warm.lr, warm.batch_size)
        if actor.trainer.reference is not None:
            actor.trainer.reset_reference()  # the KL anchor is the post-warm-start policy
        await actor.checkpoint()  # a crash from here on never repeats the warm start
    actor.metrics.flush()
    await actor.publish_weights()
    if fresh and config.eval_every_steps > 0:
        await actor.publish_eval(config.baseline_samples)  # the warm-start baseline, read more closely
    ctx.log.info(
        "learner.ready",
        version=actor.version,
        step=actor.step,
        params=policy.num_parameters(),
        device=str(policy.device),
        torch_threads=threads,
        mode=config.mode,
        normalize=config.normalize,
        max_staleness=actor.max_staleness,
        weight_transport=config.transport_name(ctx.spec.runtime.kind),
    )


def _transport(actor: LearnerActor) -> WeightTransport:
    """The generators' own transports (``weight_transports``), so both sides agree on bucket and directory."""
    from actors.generator._actor import weight_transports

    return weight_transports(actor.ctx)[actor.config.transport_name(actor.ctx.spec.runtime.kind)]


def _restore(actor: LearnerActor, path: Any) -> None:
    from torchsnapshot import StateDict

    extra = StateDict(meta="", ledger="")
    state = app_state(actor)
    state["extra"] = extra
    actor.checkpointer.restore(path, state)
    actor.load_meta(str(extra["meta"]))
    actor.ledger = AppliedLedger.loads(str(extra["ledger"]))
    actor._last_checkpoint_step = actor.step


async def _warm_start(actor: LearnerActor, domains: Any, steps: int, lr: float, batch_size: int) -> None:
    ctx, config = actor.ctx, actor.config
    actor.phase = "warmstart"
    started = time.perf_counter()

    def on_step(step: int, loss: float) -> None:
        ctx.counters.set("warmstart_step", step)
        ctx.counters.set("warmstart_loss", round(loss, 4))
        actor.metrics.add("warmstart", {"ts": time.time(), "step": step, "loss": loss})
        if step == 1 or step % config.warm_start_log_every == 0 or step == steps:
            ctx.log.info("learner.warmstart", step=step, of=steps, loss=round(loss, 4))

    result = await anyio.to_thread.run_sync(
        lambda: warm_start(actor.trainer, domains, steps=steps, lr=lr, batch_size=batch_size, seed=0, on_step=on_step)
    )
    if result.skipped_reason:
        ctx.log.warning("learner.warmstart_skipped", reason=result.skipped_reason, steps_done=result.steps)
    actor.metrics.add(
        "lifecycle",
        {
            "ts": time.time(),
            "event": "warmstart",
            "step": 0,
            "version": 0,
            "warmstart_steps": result.steps,
            "warmstart_loss": result.losses[-1] if result.losses else None,
            "seconds": time.perf_counter() - started,
        },
    )
    ctx.log.info(
        "learner.warmstart_done",
        steps=result.steps,
        seconds=round(time.perf_counter() - started, 2),
        first_loss=round(result.losses[0], 4) if result.losses else None,
        last_loss=round(result.losses[-1], 4) if result.losses else None,
    )
