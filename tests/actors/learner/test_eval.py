"""Held-out evaluation bookkeeping: rounds complete only when every completion is back; sampled rounds average."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from actors._messages import ScoredCompletion, ScoredMsg
from actors.learner._config import LearnerConfig
from actors.learner._eval import EvalTracker, eval_message_id
from actors.source import open_source


def scored(rewards: list[float], temperature: float) -> ScoredMsg:
    return ScoredMsg(task_id="t", domain="arith", prompt_ids=[1], heldout=True, temperature=temperature,
                     completions=[ScoredCompletion(text="x", token_ids=[2], logprobs=[0.0], versions=[3], reward=r, finish_reason="stop",
                                                   verdict="pass" if r == 1.0 else "fail") for r in rewards])


def test_a_sampled_round_is_the_mean_over_every_completion_and_counts_each_prompt_once() -> None:
    tasks = open_source("builtin:arithmetic", domain="arith", heldout=3).heldout()
    tracker = EvalTracker({"arith": tasks}, samples=2)
    assert tracker.expected("arith") == 6
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
