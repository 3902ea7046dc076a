"""What a learner checkpoint says about the learner besides its tensors, and what a resumed learner makes of it.

Contract:
- :func:`meta_json` is the ``meta`` a checkpoint holds (``_checkpoint``'s ``extra``): step, version, phase, the
  advantage statistics, the domains the learner trained, the weight average's update count, the cumulative counters
  a resumed learner goes on from (``dropped_stale*``, ``staleness.*``, ``samples_applied``, ``groups_applied``,
  ``duplicates_skipped``, ``eval_rounds``) and ``taken_ts``, when the state was taken (the ledger's cut: every
  ``applied`` row up to it is in the checkpoint, none after).
- :func:`load_meta` puts a checkpoint's meta back: the advantage statistics, the average's update count and the
  counters it restores in place; step, version, the domains trained and ``taken_ts`` it returns. A checkpoint
  written before a field existed reads as it did then (no ``domains``: unsaid; no average count: 0; no
  ``taken_ts``: None).
- :func:`say_what_changed`, once on a resume: the domains the spec added (``learner.domain_added``) or removed
  (``learner.domain_removed``) since the checkpoint, and the held-out series the spec ended
  (``learner.heldout_new_series``: another eval set, another verifier). A new series, or a new domain, gets a round
  soon: its first figure is then the resumed weights', not those of ``eval_every_steps`` steps later.

Non-goals: the checkpoint files (``_checkpoint``), restoring the tensors and the ledger (the learner).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from actors.learner._advantages import AdvantageEstimator
from actors.learner._average import WeightAverage
from actors.learner._metrics import heldout_series_changes
from actors.learner._rounds import HeldoutRounds
from actors.protocol import domains_of
from topology.runtime import ActorContext, Counters

__all__ = ["Resumed", "load_meta", "meta_json", "say_what_changed"]

_KEPT_COUNTERS = (
    "dropped_stale",
    "staleness.",
    "samples_applied",
    "groups_applied",
    "duplicates_skipped",
    "eval_rounds",
)  # the counters a checkpoint carries over (prefixes)


def meta_json(
    *,
    step: int,
    version: int,
    phase: str,
    estimator: AdvantageEstimator,
    domains: list[str],
    average: WeightAverage | None,
    counters: Mapping[str, Any],
    taken: float | None = None,
) -> str:
    """A checkpoint's meta (``taken``: when its state was taken, default now)."""
    meta = {
        "step": step,
        "version": version,
        "phase": phase,
        "estimator": estimator.state_dict(),
        "domains": domains,
        "average_updates": average.updates if average is not None else 0,
        "counters": {k: v for k, v in counters.items() if k.startswith(_KEPT_COUNTERS)},
    }
    return json.dumps({**meta, "taken_ts": time.time() if taken is None else taken})


@dataclass(frozen=True)
class Resumed:
    """What a checkpoint's meta says about the learner that took it."""

    step: int
    version: int
    domains: set[str] | None  # the domains it trained (None: a checkpoint that does not say)
    taken_ts: float | None  # when its state was taken (None: a checkpoint that does not say)


def load_meta(text: str, estimator: AdvantageEstimator, average: WeightAverage | None, counters: Counters) -> Resumed:
    """Restore the advantage statistics, the average's update count and the counters from a checkpoint's meta."""
    meta = json.loads(text)
    domains = set(meta["domains"]) if "domains" in meta else None
    step, version = int(meta["step"]), int(meta["version"])
    estimator.load_state_dict(meta["estimator"])
    if average is not None:
        average.updates = int(meta.get("average_updates", 0))
    for name, value in meta.get("counters", {}).items():
        counters.set(name, value)
    return Resumed(step=step, version=version, domains=domains, taken_ts=meta.get("taken_ts"))


def say_what_changed(
    ctx: ActorContext, rounds: HeldoutRounds, before: set[str] | None, trained: Iterable[str], eval_every_steps: int
) -> None:
    """Log what the spec changed since the checkpoint (``before``: the domains it trained; ``trained``: the domains
    this learner trains), and make a round due for a new domain or series."""
    log = ctx.log
    now = set(trained) & set(domains_of(ctx.spec))
    if before is not None:
        for name in sorted(now - before):
            log.info(
                "learner.domain_added",
                domain=name,
                note="new to this run: trained by RL alone (the warm start was before it), its held-out series "
                "starts at the next round",
            )
            rounds.due = rounds.due or (eval_every_steps > 0 and name in rounds.series)
        for name in sorted(before - now):
            log.info(
                "learner.domain_removed",
                domain=name,
                note="no longer in the spec: its groups still on the bus are dropped, counted in removed_domain",
            )
    for name, why in heldout_series_changes(ctx.run_dir, rounds.series).items():
        log.info(
            "learner.heldout_new_series",
            domain=name,
            changed=why,
            note=f"held-out accuracy of {name} starts a new series: its earlier rounds are not compared with it",
        )
        rounds.due = eval_every_steps > 0
