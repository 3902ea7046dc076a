"""bench/vs_trl.py: the speedup arithmetic, against hand-computed values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.vs_trl import compare, final_mean, smooth, time_to_reach


def test_smooth_is_a_centred_three_point_mean_that_keeps_the_times_and_the_start() -> None:
    smoothed = smooth([(0, 0.3), (10, 0.6), (20, 0.3), (30, 0.9)])
    assert [t for t, _ in smoothed] == [0, 10, 20, 30]
    assert [a for _, a in smoothed] == pytest.approx([0.3, 0.4, 0.6, 0.6])


def test_time_to_reach_interpolates_between_rounds_and_says_never() -> None:
    curve = [(0.0, 0.4), (10.0, 0.5), (20.0, 0.7)]
    assert time_to_reach(curve, 0.6) == pytest.approx(15.0)
    assert time_to_reach(curve, 0.3) == 0.0
    assert time_to_reach(curve, 0.71) is None


def test_final_mean_takes_the_last_rounds_within_the_common_time() -> None:
    curve = [(0.0, 0.1), (10.0, 0.2), (20.0, 0.3), (30.0, 0.4), (40.0, 0.9)]
    assert final_mean(curve, until=30.0) == pytest.approx(0.3)
    assert math.isnan(final_mean(curve, until=-1.0))


def test_a_curve_three_times_faster_gives_a_3x_speedup() -> None:
    # TRL climbs 1 point per 3 s, flywheel the same points 3x sooner: every target is reached at a third of the time
    trl = [(float(t), 0.40 + t / 300) for t in range(0, 181, 15)]
    flywheel = [(float(t), 0.40 + t / 100) for t in range(0, 121, 10)]
    result = compare(flywheel, trl)
    assert result["median_speedup"] == pytest.approx(3.0)
    assert result["min_speedup"] == pytest.approx(3.0)
    assert result["not_reached"] == 0
    assert result["common_s"] == 120.0
    assert result["final_flywheel"] > result["final_trl"]


def test_targets_beyond_the_flywheel_run_are_counted_as_not_reached() -> None:
    trl = [(0.0, 0.4), (15.0, 0.5), (30.0, 0.6), (45.0, 0.7)]
    flywheel = [(0.0, 0.4), (10.0, 0.5), (20.0, 0.6)]  # smoothed: 0.4, 0.5, 0.55; TRL's: 0.4, 0.5, 0.6, 0.65
    result = compare(flywheel, trl)
    assert result["rows"][0]["speedup"] == pytest.approx(1.5)
    assert result["not_reached"] == 2
    assert [r["flywheel_s"] is None for r in result["rows"]] == [False, True, True]


def test_a_target_below_flywheels_start_has_no_speedup() -> None:
    trl = [(0.0, 0.40), (15.0, 0.42), (30.0, 0.60)]  # smoothed: 0.40, 0.473, 0.51
    flywheel = [(0.0, 0.48), (10.0, 0.50), (20.0, 0.70)]  # smoothed: 0.48, 0.56, 0.60
    result = compare(flywheel, trl)
    assert result["rows"][0]["flywheel_s"] == 0.0 and result["rows"][0]["speedup"] is None
    assert result["rows"][1]["flywheel_s"] == pytest.approx(10 * (0.51 - 0.48) / (0.56 - 0.48))
    assert result["median_speedup"] == result["min_speedup"] == pytest.approx(30 / (10 * 0.03 / 0.08))


def test_fixed_targets_are_timed_on_both_smoothed_curves() -> None:
    trl = [(0.0, 0.40), (30.0, 0.60), (60.0, 0.80), (90.0, 0.80)]  # smoothed: 0.40, 0.60, 0.733, 0.80
    flywheel = [(0.0, 0.40), (10.0, 0.60), (20.0, 0.80), (30.0, 0.80)]
    fixed = compare(flywheel, trl, targets=(0.70, 0.90))["targets"]
    assert fixed[0]["trl_s"] == pytest.approx(30 + 30 * 0.10 / (0.8 * 11 / 12 - 0.6))
    assert fixed[0]["speedup"] == pytest.approx(3.0)
    assert fixed[1]["trl_s"] is None and fixed[1]["flywheel_s"] is None and fixed[1]["speedup"] is None


def test_the_flywheel_side_carries_the_learning_rate_it_resolved(tmp_path: Path) -> None:
    import json

    from bench.vs_trl import load_flywheel

    curve = [{"t_s": 0.0, "accuracy": 0.4}, {"t_s": 10.0, "accuracy": 0.6}]
    run = {"decodings": {"greedy": {"curves": {"addition": curve}}}, "samples_per_s": 500.0, "overrides": {}}
    path = tmp_path / "learn.json"
    path.write_text(json.dumps({"variants": {"async": {**run, "lr": 2e-4, "params": 811_008}}}))
    domain, curves, rate, overrides, resolved = load_flywheel(path, "async", None)
    assert (domain, rate, overrides, resolved) == ("addition", 500.0, {}, {"lr": 2e-4, "params": 811_008})
    assert curves["greedy"] == [(0.0, 0.4), (10.0, 0.6)]
    path.write_text(json.dumps({"variants": {"async": run}}))  # a run of an older tree: nothing resolved recorded
    assert load_flywheel(path, "async", None)[4] == {}


def test_the_peer_side_says_when_its_sweeps_best_rate_sat_at_an_end_of_the_range(tmp_path: Path) -> None:
    import json

    from bench.vs_trl import load_trl

    evals = [{"rl_s": 0.0, "greedy": 0.4, "sampled": 0.2}, {"rl_s": 15.0, "greedy": 0.6, "sampled": 0.3}]
    run = {"evals": evals, "lr": 4e-4, "lr_chosen_by": "sweep", "prompts": 16, "group": 8, "samples_per_s": 600.0}
    path = tmp_path / "trl_grpo.json"
    path.write_text(json.dumps({**run, "best_at_edge": True}))
    assert load_trl(path)[3]["best_at_edge"] is True
    path.write_text(json.dumps(run))  # a run of an older tree: nothing recorded, nothing claimed
    assert load_trl(path)[3]["best_at_edge"] is False
