"""Held-out evaluation bookkeeping: rounds complete only when every completion is back; sampled rounds average."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from actors.domains import open_source
from actors.learner import EvalTracker, LearnerConfig, eval_message_id
from actors.protocol import VERIFIER_ERROR, ScoredCompletion, ScoredMsg


def scored(rewards: list[float], temperature: float, *, errors: int = 0) -> ScoredMsg:
    """A held-out score: one completion per reward, the last ``errors`` of them failed by the verifier (reward 0)."""
    return ScoredMsg(
        task_id="t",
        domain="arith",
        prompt_ids=[1],
        heldout=True,
        temperature=temperature,
        completions=[
            ScoredCompletion(
                text="x",
                token_ids=[2],
                logprobs=[0.0],
                versions=[3],
                reward=r,
                finish_reason="stop",
                verdict=VERIFIER_ERROR if i >= len(rewards) - errors else "pass" if r == 1.0 else "fail",
            )
            for i, r in enumerate(rewards)
        ],
    )


def test_a_sampled_round_is_the_mean_over_every_completion_and_counts_each_prompt_once() -> None:
    tasks = open_source("builtin:arithmetic", domain="arith", heldout=3).heldout()
    tracker = EvalTracker({"arith": tasks})
    assert tracker.expected("arith") == 3
    ids = [eval_message_id(3, t) for t in tasks]
    assert tracker.record(ids[0], scored([1.0, 0.0], 1.0)) is None
    assert tracker.record(ids[0], scored([1.0, 1.0], 1.0)) is None  # a redelivery: not counted twice
    assert tracker.record(ids[1], scored([1.0, 1.0], 1.0)) is None
    result = tracker.record(ids[2], scored([0.0, 0.0], 1.0))
    assert result is not None and result.version == 3 and result.n == 6
    assert result.accuracy == pytest.approx(3 / 6)


def test_several_eval_samples_need_a_temperature() -> None:
    with pytest.raises(ValidationError, match="eval_samples > 1 needs eval_temperature > 0"):
        LearnerConfig(eval_samples=2)
    assert LearnerConfig(eval_samples=2, eval_temperature=1.0).eval_samples == 2
    with pytest.raises(ValidationError, match="eval_baseline_samples > 1 needs eval_temperature > 0"):
        LearnerConfig(eval_baseline_samples=4)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, 1),
        ({"eval_temperature": 1.0}, 4),
        ({"eval_temperature": 1.0, "eval_samples": 8}, 8),
        ({"eval_temperature": 1.0, "eval_baseline_samples": 1}, 1),
    ],
)
def test_the_post_warm_start_round_reads_more_samples_when_sampled(given: dict[str, float], expected: int) -> None:
    assert LearnerConfig.model_validate(given).baseline_samples == expected


def test_a_round_completes_when_every_prompt_is_back_whatever_its_samples() -> None:
    """The post-warm-start round draws more completions per prompt than later ones: completeness counts prompts."""
    tasks = open_source("builtin:arithmetic", domain="arith", heldout=2).heldout()
    tracker = EvalTracker({"arith": tasks})
    assert tracker.record(eval_message_id(1, tasks[0]), scored([1.0, 0.0, 0.0, 0.0], 1.0)) is None
    baseline = tracker.record(eval_message_id(1, tasks[1]), scored([1.0, 1.0, 0.0, 0.0], 1.0))
    assert baseline is not None and baseline.n == 8 and baseline.accuracy == pytest.approx(3 / 8)
    assert tracker.record(eval_message_id(5, tasks[0]), scored([1.0], 1.0)) is None
    later = tracker.record(eval_message_id(5, tasks[1]), scored([0.0], 1.0))
    assert later is not None and later.n == 2 and later.accuracy == pytest.approx(0.5)


def test_the_eval_label_names_the_usual_count_and_the_baseline_round_apart() -> None:
    import polars as pl

    from actors.learner._metrics import eval_mode

    rows = pl.DataFrame({"ts": [1.0, 2.0, 3.0], "temperature": [1.0] * 3, "samples": [4, 1, 1]})
    assert eval_mode(rows) == "sampled at T=1, 1 per prompt (4 in the post-warm-start round)"
    assert eval_mode(rows.tail(2)) == "sampled at T=1, 1 per prompt"
    assert eval_mode(rows.with_columns(temperature=pl.lit(0.0))) == "greedy"


def test_greedy_and_sampled_rounds_of_one_version_are_separate_rounds() -> None:
    tasks = open_source("builtin:arithmetic", domain="arith", heldout=2).heldout()
    tracker = EvalTracker({"arith": tasks})
    assert tracker.record(eval_message_id(4, tasks[0]), scored([1.0], 0.0)) is None
    assert tracker.record(eval_message_id(4, tasks[0], 1.0), scored([0.0, 0.0], 1.0)) is None
    greedy = tracker.record(eval_message_id(4, tasks[1]), scored([1.0], 0.0))
    assert greedy is not None and (greedy.temperature, greedy.n, greedy.accuracy) == (0.0, 2, 1.0)
    sampled = tracker.record(eval_message_id(4, tasks[1], 1.0), scored([1.0, 0.0], 1.0))
    assert sampled is not None and (sampled.temperature, sampled.n, sampled.accuracy) == (1.0, 4, 0.25)


def test_a_list_of_temperatures_decodes_each_round_several_ways() -> None:
    config = LearnerConfig.model_validate({"eval_temperature": [0, 1.0], "eval_samples": 2})
    assert config.eval_temperatures == (0.0, 1.0)
    assert [config.eval_samples_at(t) for t in config.eval_temperatures] == [1, 2]
    assert [config.eval_samples_at(t, baseline=True) for t in config.eval_temperatures] == [1, 4]
    with pytest.raises(ValidationError, match="list of distinct ones"):
        LearnerConfig.model_validate({"eval_temperature": [1.0, 1.0]})
    with pytest.raises(ValidationError, match="eval_samples > 1 needs eval_temperature > 0"):
        LearnerConfig.model_validate({"eval_temperature": [0.0], "eval_samples": 2})


def test_completions_the_verifier_failed_on_are_counted_apart_not_as_wrong_answers() -> None:
    """A verifier error's reward 0 says nothing about the answer: a round's accuracy is over what was scored."""
    tasks = open_source("builtin:arithmetic", domain="arith", heldout=3).heldout()
    tracker = EvalTracker({"arith": tasks})
    assert tracker.record(eval_message_id(2, tasks[0]), scored([1.0, 0.0], 1.0, errors=1)) is None
    assert tracker.record(eval_message_id(2, tasks[1]), scored([1.0, 0.0], 1.0)) is None
    result = tracker.record(eval_message_id(2, tasks[2]), scored([0.0, 0.0], 1.0, errors=2))
    assert result is not None and (result.n, result.errors) == (3, 3)
    assert result.accuracy == pytest.approx(2 / 3) and result.reward_mean == pytest.approx(2 / 3)
    # every completion failed: no accuracy to report (n 0), not an accuracy of 0
    for task in tasks[:2]:
        assert tracker.record(eval_message_id(4, task), scored([0.0], 0.0, errors=1)) is None
    failed = tracker.record(eval_message_id(4, tasks[2]), scored([0.0], 0.0, errors=1))
    assert failed is not None and (failed.n, failed.errors) == (0, 3)
