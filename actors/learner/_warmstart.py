"""The supervised warm start: a short phase of real SFT steps on the domains' reference answers.

Used when the policy has no checkpoint (``policy.checkpoint: null``) and ``policy.warm_start.steps > 0`` (by default
200 for a builtin model and 0 for an ``hf:`` model, whose own weights are the starting point):
batches of ``(prompt, reference)`` pairs are drawn from the *training* split of the learner's domains (domain by
sampling weight, as the source does; held-out tasks are never drawn), and each step minimizes the cross-entropy of
the reference completion tokens (``Trainer.sft_step``) with AdamW. Tasks without a reference are skipped; when no
domain yields references the warm start is skipped with a reason.

Learning rate (:func:`lr_at`): a linear warmup over the first ``WARMUP_FRACTION`` of the steps to ``warm_start.lr``,
then a cosine decay to ``FINAL_LR_FRACTION`` of it at the last step. With a few hundred steps on a tiny model the
decay is what turns a low loss into greedy answers that are exactly right (a constant rate leaves the weights
bouncing around the minimum).

The learner's phase (:func:`run_warm_start`) runs it in a worker thread and reports it: ``warmstart_steps``,
``warmstart_step`` and ``warmstart_loss`` counters (the live view shows "warm start step 37/200", not "step 0"), a
``warmstart`` metrics row per step, a ``learner.warmstart`` log line every ``warm_start_log_every`` steps, and a
``warmstart`` row in the ``lifecycle`` metrics at the end. A stop request ends it within a step (a drain, not a kill
after the drain timeout); the learner then takes no checkpoint, so a resumed run warm-starts afresh.

Non-goals: epochs over a fixed dataset, evaluation (the learner publishes a held-out evaluation right after the
warm start).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import anyio.to_thread

from actors.domains import Domain, DomainSampler
from actors.learner._config import lr_for_log, warm_start_lr
from actors.learner._metrics import MetricsWriter
from actors.learner._trainer import Trainer, adamw
from actors.protocol import policy_of
from topology.runtime import ActorContext

__all__ = ["WarmStartResult", "lr_at", "reference_pairs", "run_warm_start", "warm_start"]

_MAX_EMPTY_DRAWS = 200  # draws without any reference before giving up on the warm start
WARMUP_FRACTION = 0.05  # of the steps, linear warmup from ~0 to the peak rate
FINAL_LR_FRACTION = 0.05  # the cosine ends at this fraction of the peak rate


def lr_at(step: int, steps: int, peak: float) -> float:
    """Learning rate of 1-based ``step`` of ``steps``: linear warmup, then cosine decay to a small floor."""
    warmup = max(1, round(steps * WARMUP_FRACTION))
    if step <= warmup:
        return peak * step / warmup
    progress = (step - warmup) / max(steps - warmup, 1)
    floor = peak * FINAL_LR_FRACTION
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


@dataclass
class WarmStartResult:
    steps: int = 0
    losses: list[float] = field(default_factory=list)
    skipped_reason: str = ""
    stopped: bool = False  # should_stop() said so before the last step: the weights are part-way


def reference_pairs(sampler: DomainSampler, count: int, max_len: int | None = None) -> list[tuple[str, str]]:
    """``count`` (prompt, reference) pairs from the training split (fewer only when no task has a reference)."""
    pairs: list[tuple[str, str]] = []
    misses = 0
    while len(pairs) < count and misses < _MAX_EMPTY_DRAWS:
        _, task = sampler.next()
        if not task.reference or (max_len is not None and len(task.prompt) + len(task.reference) + 2 > max_len):
            misses += 1
            continue
        pairs.append((task.prompt, task.reference))
    return pairs


def warm_start(
    trainer: Trainer,
    domains: Mapping[str, Domain],
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> WarmStartResult:
    """Run ``steps`` supervised steps; ``on_step(step, loss)`` after each (1-based); ``should_stop()`` before each:
    True ends it there (``stopped``)."""
    result = WarmStartResult()
    if steps <= 0:
        result.skipped_reason = "warm_start.steps is 0"
        return result
    sampler = DomainSampler(domains, random.Random(seed))
    optimizer = adamw(trainer.params, lr=lr, weight_decay=0.0)
    for step in range(1, steps + 1):
        if should_stop is not None and should_stop():
            result.stopped = True
            return result
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr)
        pairs = reference_pairs(sampler, batch_size, trainer.policy.max_context)
        if not pairs:
            result.skipped_reason = "no task of the learner's domains has a reference answer"
            return result
        loss = trainer.sft_step(optimizer, pairs)
        result.steps, result.losses = step, [*result.losses, loss]
        if on_step is not None:
            on_step(step, loss)
    return result


async def run_warm_start(
    ctx: ActorContext,
    trainer: Trainer,
    metrics: MetricsWriter,
    domains: Mapping[str, Domain],
    steps: int,
    log_every: int,
) -> bool:
    """The learner's warm start of ``steps`` steps, reported (see the module docstring); False when a stop request
    ended it part-way."""
    warm = policy_of(ctx.spec).warm_start
    started = time.perf_counter()
    lr = warm_start_lr(warm.lr, trainer.policy.num_parameters())
    ctx.log.info("learner.warmstart_start", steps=steps, lr=lr_for_log(lr, warm.lr))
    ctx.counters.set("warmstart_steps", steps)  # the live view shows "warm start step 37/200", not "step 0"

    def on_step(step: int, loss: float) -> None:
        ctx.counters.set("warmstart_step", step)
        ctx.counters.set("warmstart_loss", round(loss, 4))
        metrics.add("warmstart", {"ts": time.time(), "step": step, "loss": loss})
        if step == 1 or step % log_every == 0 or step == steps:
            ctx.log.info("learner.warmstart", step=step, of=steps, loss=round(loss, 4))

    stopping = ctx.stopping
    result = await anyio.to_thread.run_sync(
        lambda: warm_start(
            trainer,
            domains,
            steps=steps,
            lr=lr,
            batch_size=warm.batch_size,
            seed=0,
            on_step=on_step,
            should_stop=stopping.is_set,  # Ctrl-C: a drain within a step, not a kill after the drain timeout
        )
    )
    if result.stopped:
        ctx.log.info("learner.warmstart_stopped", steps_done=result.steps, of=steps)
        return False
    if result.skipped_reason:
        ctx.log.warning("learner.warmstart_skipped", reason=result.skipped_reason, steps_done=result.steps)
    seconds = time.perf_counter() - started
    last_loss = result.losses[-1] if result.losses else None
    metrics.add(
        "lifecycle",
        {
            "ts": time.time(),
            "event": "warmstart",
            "step": 0,
            "version": 0,
            "warmstart_steps": result.steps,
            "warmstart_loss": last_loss,
            "seconds": seconds,
        },
    )
    ctx.log.info("learner.warmstart_done", steps=result.steps, seconds=round(seconds, 2), last_loss=last_loss)
    return True
