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
    rng = random.Random(1)
    passed = 0
    draws = 20_000
    for _ in range(draws):
        tasks = SettledTasks(skip, rng)
        for _ in range(run):
            tasks.update(TaskOutcomes(settled=["a"]))
        passed += tasks.passes_over("a")
    assert passed / draws == pytest.approx(expected, abs=0.015)  # 4 standard deviations at worst (p = 1/2)
    assert not any(tasks.passes_over("unknown") for _ in range(100))


def test_each_pass_uses_up_one_of_the_run_so_a_settled_task_is_drawn_again_within_its_run() -> None:
    """Whatever the draws, a task with a run of k is passed over at most k times before it is drawn; then it is
    ordinary until its next settled group is reported."""
    for seed in range(200):
        tasks = SettledTasks(0.5, random.Random(seed))
        for _ in range(MAX_RUN + 1):
            tasks.update(TaskOutcomes(settled=["a"]))
        passes = 0
        while tasks.passes_over("a"):
            passes += 1
        assert passes <= MAX_RUN
        assert tasks.runs.get("a", 0) == MAX_RUN - passes
    tasks = SettledTasks(0.5, random.Random(0))
    tasks.update(TaskOutcomes(settled=["a"]))
    while "a" in tasks.runs:
        tasks.passes_over("a")
    assert not any(tasks.passes_over("a") for _ in range(100))


def test_past_max_tasks_the_longest_unreported_are_forgotten() -> None:
    tasks = SettledTasks(0.5, random.Random(0), max_tasks=3)
    tasks.update(TaskOutcomes(settled=["a", "b", "c"]))
    tasks.update(TaskOutcomes(settled=["a"]))  # reported again: now the newest
    tasks.update(TaskOutcomes(settled=["d"]))
    assert tasks.runs == {"c": 1, "a": 2, "d": 1}


def test_a_skip_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"skip: expected a probability in \[0, 1\), got 1"):
        SettledTasks(1, random.Random(0))
