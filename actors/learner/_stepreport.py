"""What one RL step reports: its ``step`` metrics row and the training counters of the live view.

Contract (:func:`report_step`):
- Counters: ``staleness.<n>`` counts the applied groups of each staleness, ``staleness_mean`` is the step's mean
  (training groups; production feedback's lag behind the gate is ``feedback_staleness_mean``, over a window); the
  step's loss statistics (``loss``, ``iw_*``, ``clipped_frac``, ``kl``, ``grad_norm``, ``behavior_kl``); every
  domain's running ``reward.<domain>`` and ``accuracy.<domain>`` (``_samples``' windows).
- The ``step`` row: step, version, staleness, the groups applied, ``step_s`` (the optimizer step alone), the mean and
  the slowest ``generate_s`` / ``verify_s`` of the applied groups (in sync mode a batch's groups are generated and
  verified together, so the slowest are the batch's times), every field of ``StepStats``, the running reward and
  accuracy per domain and the completions applied per domain.

Non-goals: the audit trail of what was applied (``_intake``), the held-out rounds (``_rounds``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from actors.learner._intake import Held
from actors.learner._metrics import MetricsWriter
from actors.learner._trainer import StepStats
from topology.runtime import ActorContext

__all__ = ["report_step"]


def report_step(
    ctx: ActorContext,
    metrics: MetricsWriter,
    stats: StepStats,
    applied: list[Held],
    *,
    step: int,
    version: int,
    step_s: float,
    staleness: Sequence[int],
    feedback_staleness: Sequence[int],
    rewards: Mapping[str, deque[tuple[float, float]]],
) -> None:
    """Report the step just taken (``staleness``: of its training groups; ``feedback_staleness``: of the latest
    production samples; ``rewards``: every domain's running window of (reward, accuracy))."""
    counters = ctx.counters
    for value in staleness:
        counters.inc(f"staleness.{value}")
    mean_staleness = sum(staleness) / max(len(staleness), 1)
    groups = max(len(applied), 1)
    # step_s: the optimizer step alone; generate_s / verify_s: mean per applied group (one prompt's rollout)
    row: dict[str, Any] = {
        "ts": time.time(),
        "step": step,
        "version": version,
        "staleness_mean": mean_staleness,
        "groups": len(applied),
        "step_s": step_s,
        "generate_s": sum(h.msg.generate_s or 0.0 for h in applied) / groups,
        "verify_s": sum(h.msg.verify_s or 0.0 for h in applied) / groups,
        # the slowest group: in sync mode a batch's groups are generated (and verified)
        # together, so these are the batch's generate and verify times (bench/learn.py)
        "generate_s_max": max((h.msg.generate_s or 0.0 for h in applied), default=0.0),
        "verify_s_max": max((h.msg.verify_s or 0.0 for h in applied), default=0.0),
        **{k: getattr(stats, k) for k in stats.__dataclass_fields__},
    }
    for name in (
        "loss",
        "iw_mean",
        "iw_max",
        "iw_truncated_frac",
        "clipped_frac",
        "kl",
        "grad_norm",
        "behavior_kl",
    ):
        counters.set(name, round(float(getattr(stats, name)), 5))
    counters.set("staleness_mean", round(mean_staleness, 3))
    if feedback_staleness:
        feedback = feedback_staleness
        counters.set("feedback_staleness_mean", round(sum(feedback) / len(feedback), 3))
    for domain, window in rewards.items():
        reward = sum(r for r, _ in window) / len(window)
        accuracy = sum(a for _, a in window) / len(window)
        counters.set(f"reward.{domain}", round(reward, 4))
        counters.set(f"accuracy.{domain}", round(accuracy, 4))
        row[f"reward.{domain}"], row[f"accuracy.{domain}"] = reward, accuracy
    for domain in {h.msg.domain for h in applied}:
        row[f"completions.{domain}"] = sum(h.size for h in applied if h.msg.domain == domain)
    metrics.add("step", row)
