"""What a source remembers of the learners' `TaskOutcomes`: which tasks' latest groups were settled, and how many in a
row, so that it can pass over them now and then.

Contract:
- :meth:`SettledTasks.update` takes one report: a task in ``signal`` is forgotten (it teaches again); one in
  ``settled`` counts one more settled group in a row. A task in both lists of one report counts as ``signal``.
- :meth:`SettledTasks.passes_over` decides one draw: a task with ``k`` settled groups in a row is passed over with
  probability ``1 − (1 − skip)^min(k, MAX_RUN)`` (``skip`` = 0.5: one in two after one settled group, three in four
  after two, seven in eight from three on), so a settled task is still drawn now and then and its next group says
  whether it came unsettled (a solved task forgotten, a failed one now within reach). ``skip`` 0 passes over nothing.
- At most ``max_tasks`` tasks are remembered; past it the longest unreported ones are forgotten (drawn as before).

Non-goals: where the reports come from (the learner's `_outcomes`), redrawing (the source).
"""

from __future__ import annotations

import random

from actors.protocol import TaskOutcomes

__all__ = ["MAX_RUN", "SettledTasks"]

MAX_RUN = 3  # settled groups in a row beyond which a task is passed over no more often


class SettledTasks:
    """Settled-group runs by task id (see the module docstring)."""

    def __init__(self, skip: float, rng: random.Random, *, max_tasks: int = 200_000) -> None:
        if not 0 <= skip < 1:
            raise ValueError(f"skip: expected a probability in [0, 1), got {skip!r}")
        self.skip, self.rng, self.max_tasks = skip, rng, max_tasks
        self.runs: dict[str, int] = {}  # task id -> settled groups in a row (insertion order: oldest report first)

    def update(self, report: TaskOutcomes) -> None:
        runs = self.runs
        signal = set(report.signal)
        for task_id in report.settled:
            if task_id not in signal:
                run = runs.pop(task_id, 0)
                runs[task_id] = min(run + 1, MAX_RUN)  # re-inserted: the newest report
        for task_id in signal:
            runs.pop(task_id, None)
        while len(runs) > self.max_tasks:
            del runs[next(iter(runs))]

    def passes_over(self, task_id: str) -> bool:
        """Whether to pass over this draw of ``task_id`` (see the module docstring)."""
        run = self.runs.get(task_id)
        if not run or not self.skip:
            return False
        return self.rng.random() < 1.0 - (1.0 - self.skip) ** run
