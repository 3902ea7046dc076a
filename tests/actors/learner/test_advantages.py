"""Group and per-domain advantages and the staleness filter, against hand-computed values."""

from __future__ import annotations

import math

import pytest

from actors.learner import AdvantageEstimator, RunningStats, is_stale, staleness


def test_grpo_group_advantages() -> None:
    est = AdvantageEstimator(normalize="group", eps=0.0)
    adv = est.group("math", [1.0, 0.0, 0.0, 1.0])
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0])  # mean 0.5, std 0.5


def test_all_equal_group_is_skipped_and_counted() -> None:
    est = AdvantageEstimator()
    assert est.group("math", [1.0, 1.0, 1.0]) is None
    assert est.group("math", [0.0, 0.0]) is None
    assert est.groups_skipped == 2


def test_unnormalized_group_is_centred_raw_rewards() -> None:
    est = AdvantageEstimator(normalize="none")
    assert est.group("extract", [0.1, 0.0]) == pytest.approx([0.05, -0.05])


def test_domain_normalization_puts_domains_in_comparable_units() -> None:
    est = AdvantageEstimator(normalize="domain", decay=0.9)
    for _ in range(100):
        big = est.group("binary", [1.0, 0.0])
        small = est.group("partial", [0.2, 0.0])
    assert big is not None and small is not None
    # raw, the binary domain would pull 5× harder; in domain units both are ~1
    assert big[0] == pytest.approx(1.0, rel=0.1)
    assert small[0] == pytest.approx(1.0, rel=0.1)


def test_single_sample_uses_running_baseline_of_its_domain() -> None:
    est = AdvantageEstimator(normalize="none", decay=0.5)
    assert est.single("feedback", 1.0) == 0.0  # first sample is its own baseline
    # baseline is now 1.0; a reward of 0 is 1 below it
    assert est.single("feedback", 0.0) == pytest.approx(-1.0)
    # baseline moved halfway: 0.5
    assert est.single("feedback", 1.0) == pytest.approx(0.5)


def test_running_stats_roundtrip_through_state_dict() -> None:
    est = AdvantageEstimator()
    est.group("a", [1.0, 0.0, 1.0])
    est.group("b", [1.0, 1.0])
    clone = AdvantageEstimator()
    clone.load_state_dict(est.state_dict())
    assert clone.state_dict() == est.state_dict()


def test_running_stats_track_mean_and_std() -> None:
    stats = RunningStats(decay=0.9)
    stats.update([1.0, 0.0] * 200)
    assert stats.mean == pytest.approx(0.5, abs=0.06)
    assert stats.std == pytest.approx(0.5, abs=0.06)
    assert not math.isnan(stats.std)


def test_staleness_counts_from_the_oldest_token() -> None:
    assert staleness(7, [5, 6, 7]) == 2
    assert staleness(7, []) == 0
    assert is_stale(7, [3, 7], max_staleness=2)
    assert not is_stale(7, [5, 7], max_staleness=2)
