"""The learner's reports of which training tasks' groups carried signal, for the sources that drew them.

Contract:
- :meth:`OutcomeReporter.add` notes a domain group's outcome as :class:`~actors.learner._samples.SampleMaker` decided
  it: settled (no signal: every completion the same reward and no failed-group reference trained) or with signal.
  Groups without a task id (production traffic) are not noted: no source draws them. Nothing is noted, nor
  published, unless an actor of the spec listens (`task_outcomes_wanted`: a source with ``skip_no_signal``).
- :meth:`OutcomeReporter.flush_due` publishes what was noted as one `TaskOutcomes` on the core NATS subject
  `TASK_OUTCOMES` once ``every_s`` has passed since the previous report, or sooner when ``most`` tasks wait. A report
  the bus refuses (away, reconnecting) is dropped and counted in ``task_outcomes_lost``: it is a hint, and the
  source draws as before without it. ``task_outcomes_sent`` counts the tasks reported.

Non-goals: what a source does with it (`actors.source`); persistence (a restarted source learns again).
"""

from __future__ import annotations

import time

from actors.protocol import TASK_OUTCOMES, TaskOutcomes, task_outcomes_wanted
from topology.bus import BUS_AWAY
from topology.runtime import ActorContext

__all__ = ["OutcomeReporter"]


class OutcomeReporter:
    """Collects groups' outcomes by task id and publishes them now and then (see the module docstring)."""

    def __init__(self, ctx: ActorContext, *, every_s: float = 0.5, most: int = 512) -> None:
        self.ctx, self.every_s, self.most = ctx, every_s, most
        self.wanted = task_outcomes_wanted(ctx.spec)
        self.settled: list[str] = []
        self.signal: list[str] = []
        self.last = time.monotonic()

    def add(self, task_id: str, origin: str, *, settled: bool) -> None:
        if not self.wanted or origin != "domain" or not task_id:
            return
        (self.settled if settled else self.signal).append(task_id)

    async def flush_due(self) -> None:
        """Publish what waits when a report is due (see the module docstring)."""
        waiting = len(self.settled) + len(self.signal)
        if not waiting or (waiting < self.most and time.monotonic() - self.last < self.every_s):
            return
        report = TaskOutcomes(settled=self.settled, signal=self.signal)
        self.settled, self.signal, self.last = [], [], time.monotonic()
        try:
            await self.ctx.bus.publish_ephemeral(TASK_OUTCOMES, report.model_dump())
        except BUS_AWAY:
            self.ctx.counters.inc("task_outcomes_lost", waiting)
            return
        self.ctx.counters.inc("task_outcomes_sent", waiting)
