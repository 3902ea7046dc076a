"""`SettledTasks`: runs of settled groups per task, the draw that passes over them, the bound on what it remembers."""

from __future__ import annotations

import random

import pytest

from actors.protocol import TaskOutcomes
from actors.source._settled import MAX_RUN, SettledTasks


def test_runs_count_settled_reports_in_a_row_up_to_the_cap_and_signal_clears_them() -> None:
    tasks = SettledTasks(0.5, random.Random(0))
    for _ in range(MAX_RUN + 2):
        tasks.update(TaskOutcomes(settled=["a", "b"]))
    tasks.update(TaskOutcomes(settled=["c"], signal=["b"]))
    tasks.update(TaskOutcomes(settled=["d"], signal=["d"]))  # both in one report: signal
    assert tasks.runs == {"a": MAX_RUN, "c": 1}


@pytest.mark.parametrize(("run", "skip", "expected"), [(1, 0.5, 0.5), (2, 0.5, 0.75), (3, 0.5, 0.875), (2, 0.0, 0.0)])
def test_a_task_is_passed_over_at_one_minus_the_chance_to_keep_it_per_settled_group(
    run: int, skip: float, expected: float
) -> None:
    tasks = SettledTasks(skip, random.Random(1))
    for _ in range(run):
        tasks.update(TaskOutcomes(settled=["a"]))
    draws = 20_000
    share = sum(tasks.passes_over("a") for _ in range(draws)) / draws
    assert share == pytest.approx(expected, abs=0.015)  # 4 standard deviations at worst (p = 1/2)
    assert not any(tasks.passes_over("unknown") for _ in range(100))


def test_past_max_tasks_the_longest_unreported_are_forgotten() -> None:
    tasks = SettledTasks(0.5, random.Random(0), max_tasks=3)
    tasks.update(TaskOutcomes(settled=["a", "b", "c"]))
    tasks.update(TaskOutcomes(settled=["a"]))  # reported again: now the newest
    tasks.update(TaskOutcomes(settled=["d"]))
    assert tasks.runs == {"c": 1, "a": 2, "d": 1}


def test_a_skip_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"skip: expected a probability in \[0, 1\), got 1"):
        SettledTasks(1, random.Random(0))
