"""What a source remembers of the learners' `TaskOutcomes`: which tasks' latest groups were settled, and how many in a
row (a task's run), so that it can pass over them now and then.

Contract:
- :meth:`SettledTasks.update` takes one report: a task in ``signal`` is forgotten (it teaches again); one in
  ``settled`` counts one more settled group in a row. A task in both lists of one report counts as ``signal``.
- :meth:`SettledTasks.passes_over` decides one draw: a task with a run of ``k`` is passed over with probability
  ``1 − (1 − skip)^k`` (``skip`` = 0.5: one in two at 1, three in four at 2, seven in eight at 3, ``MAX_RUN``), and
  each pass uses up one of its run: a settled task is passed over at most ``k`` times in a row before it is drawn
  again, and its next group says whether it came unsettled (a solved task forgotten, a failed one now within reach)
  soon enough to train on it. ``skip`` 0 passes over nothing.
- At most ``max_tasks`` tasks are remembered; past it the longest unreported ones are forgotten (drawn as before).

Non-goals: where the reports come from (the learner's `_outcomes`), redrawing (the source).
"""

from __future__ import annotations

import random

from actors.protocol import TaskOutcomes

__all__ = ["MAX_RUN", "SettledTasks"]

MAX_RUN = 3  # the longest run: settled groups in a row beyond it pass a task over no more often, nor more times


class SettledTasks:
    """Settled-group runs by task id (see the module docstring)."""

    def __init__(self, skip: float, rng: random.Random, *, max_tasks: int = 200_000) -> None:
        if not 0 <= skip < 1:
            raise ValueError(f"skip: expected a probability in [0, 1), got {skip!r}")
        self.skip, self.rng, self.max_tasks = skip, rng, max_tasks
        self.runs: dict[str, int] = {}  # task id -> its run (insertion order: oldest report first)

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
        if not run or not self.skip or self.rng.random() >= 1.0 - (1.0 - self.skip) ** run:
            return False
        if run > 1:
            self.runs[task_id] = run - 1
        else:
            del self.runs[task_id]
        return True
