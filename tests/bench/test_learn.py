"""bench/learn.py: the spread of consecutive held-out rounds, the training rollouts' largest fall and the learner
overrides given on the command line."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.learn import ROOT, decoding_name, learner_overrides, spread, write_variant_spec


def test_spread_is_the_change_into_each_round_after_the_first_minute() -> None:
    curve = [{"t_s": t, "accuracy": a} for t, a in [(0, 0.4), (30, 0.9), (60, 0.6), (90, 0.7), (120, 0.5)]]
    gap = spread(curve)
    assert gap is not None
    assert gap["max"] == pytest.approx(0.3) and gap["mean"] == pytest.approx(0.2) and gap["pairs"] == 3
    assert gap["fall"] == pytest.approx(0.3)  # 0.9 → 0.6 lands after the minute; the rise 0.6 → 0.7 is not a fall
    rising = spread([{"t_s": t, "accuracy": a} for t, a in [(60, 0.2), (90, 0.3), (120, 0.5)]])
    assert rising is not None and rising["fall"] == 0.0 and rising["max"] == pytest.approx(0.2)
    assert spread(curve[:2]) is None  # no round past the first minute: no pair


def test_sampled_rounds_report_the_change_sampling_alone_would_make() -> None:
    # rounds of 400 completions at 50 %: two standard deviations of a difference are 2·sqrt(2·0.25/400) = 7.07 points
    curve = [{"t_s": t, "accuracy": a, "n": 400} for t, a in [(60, 0.5), (90, 0.55), (120, 0.4), (150, 0.45)]]
    gap = spread(curve, sampled=True)
    assert gap is not None
    assert gap["noise"] == pytest.approx(2 * math.sqrt(sum(a * (1 - a) / 400 for a in (0.55, 0.4))), rel=1e-9)
    assert gap["beyond"] == 1  # 5 and 5 points are within it, the 15-point fall is not
    assert "noise" not in (spread(curve) or {})  # greedy: the same prompts decoded the same way, no sampling noise


def test_learner_overrides_parse_their_values_as_yaml() -> None:
    assert learner_overrides(["lr=5e-5", "eval_temperature=[0, 1]", "normalize=group"]) == {
        "lr": 5e-5,
        "eval_temperature": [0, 1],
        "normalize": "group",
    }
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        learner_overrides(["lr"])


def test_decodings_are_named_by_temperature() -> None:
    assert [decoding_name(t) for t in (0.0, 1.0, 0.7)] == ["greedy", "sampled", "sampled at T=0.7"]


def test_a_variant_spec_carries_small_learning_rates_as_numbers(tmp_path: Path) -> None:
    import actors  # noqa: F401  # registers the kinds and sections the spec names
    from topology import load_spec

    spec = write_variant_spec(
        ROOT / "specs" / "embedded.yaml", {"actors": {"learner": learner_overrides(["lr=5e-5"])}}, tmp_path, "async"
    )
    assert load_spec(spec).actors["learner"].config.lr == pytest.approx(5e-5)


def test_drift_gives_gradient_norms_and_behavior_kl_per_window_of_steps() -> None:
    import polars as pl

    from bench.learn import drift

    steps = pl.DataFrame(
        {
            "ts": [1000.0, 1010.0, 1020.0, 1150.0, 1160.0, 1400.0],
            "grad_norm": [0.5, 1.5, 1.0, 3.0, 40.0, None],
            "behavior_kl": [0.001, 0.001, 0.004, 0.002, 0.006, 0.1],
        }
    )
    windows = drift(steps, window_s=100.0)
    assert [w["t_s"] for w in windows] == [0.0, 100.0]  # a row without a norm is left out
    first, second = windows
    assert first["steps"] == 3 and first["grad_norm_median"] == 1.0 and first["grad_norm_max"] == 1.5
    assert first["behavior_kl"] == pytest.approx(0.002)
    assert second["steps"] == 2 and second["grad_norm_p95"] == 40.0 and second["behavior_kl"] == pytest.approx(0.004)
    assert drift(steps.drop("grad_norm")) == []  # metrics of a learner that predates the column
    assert [w["behavior_kl"] for w in drift(steps.drop("behavior_kl"))] == [None, None]  # JSON has no NaN


def test_analyse_reports_the_learning_rate_the_learner_resolved(tmp_path: Path) -> None:
    from actors.learner import MetricsWriter
    from bench.learn import analyse

    first = MetricsWriter(tmp_path, "life-1")
    first.add("lifecycle", {"ts": 1.0, "event": "start", "step": 0, "version": 0, "lr": 2.65e-5, "params": 10_700_544})
    first.flush()
    later = MetricsWriter(tmp_path, "life-2")  # a resumed life reports the same; the first start is what counts
    later.add("lifecycle", {"ts": 9.0, "event": "resume", "step": 50, "version": 9, "lr": 1.0, "params": 1})
    later.flush()
    out = analyse(tmp_path)
    assert (out["lr"], out["params"]) == (2.65e-5, 10_700_544)
    assert "lr" not in analyse(tmp_path / "elsewhere")  # a run without lifecycle rows: nothing made up


def test_rollout_fall_is_the_largest_drop_of_the_rollouts_mean_after_the_first_minute() -> None:
    import polars as pl

    from bench.learn import rollout_fall

    # seconds since the post-warm-start round; a perfect first minute would be the highest mean of all if it counted
    seconds = [0, 30, *range(60, 72)]
    dip = [1.0, 1.0, 0.5, 0.5, 0.5, 0.6, 0.6, 0.6, 0.3, 0.3, 0.3, 0.7, 0.7, 0.7]
    rising = [0.0, 0.0, *(0.1 * i for i in range(12))]
    # a domain whose first group comes late: no value before it; a domain with too few rows for one window
    late = [None, None, None, None, None, None, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2]
    short = [0.9] * 4 + [None] * 10
    steps = pl.DataFrame(
        {
            "ts": [1000.0 + s for s in seconds],
            "accuracy.dip": dip,
            "accuracy.rising": rising,
            "accuracy.late": late,
            "accuracy.short": short,
            "reward.dip": dip,
        }
    ).sample(fraction=1.0, shuffle=True, seed=1)  # rows come from several files: order is the function's job
    falls = rollout_fall(steps, t0=1000.0, window=3)
    assert set(falls) == {"dip", "rising", "late"}
    dipped = falls["dip"]
    assert dipped["fall"] == pytest.approx(0.3) and dipped["window_steps"] == 3
    assert (dipped["peak"], dipped["trough"]) == (pytest.approx(0.6), pytest.approx(0.3))
    assert (dipped["peak_t_s"], dipped["trough_t_s"]) == (65, 68)  # a mean's time is its window's last row's
    assert falls["rising"]["fall"] == 0.0
    assert falls["rising"]["trough_t_s"] == 62  # no fall: the first mean
    assert falls["late"]["fall"] == 0.0 and falls["late"]["peak_t_s"] == 66  # its rows from 64 s: the first mean
    # without t0 seconds count from the first step row; a domain with fewer rows than the window is left out
    assert rollout_fall(steps, window=3)["dip"]["trough_t_s"] == 68
    assert rollout_fall(steps, t0=990.0, window=3)["dip"]["trough_t_s"] == 78
    assert rollout_fall(steps, t0=1000.0) == {}  # fewer rows past the minute than the default window
    assert rollout_fall(steps.clear()) == {}


def test_analyse_reports_the_rollouts_fall_on_the_rounds_clock(tmp_path: Path) -> None:
    from actors.learner import MetricsWriter
    from bench.learn import FALL_WINDOW_STEPS, analyse

    writer = MetricsWriter(tmp_path, "life-1")
    writer.add("eval", {"ts": 1000.0, "domain": "addition", "version": 0, "accuracy": 0.5, "n": 64})
    for i in range(2 * FALL_WINDOW_STEPS):  # 10 a second from 61 s after the round, the last 50 lower
        accuracy = 0.8 if i < FALL_WINDOW_STEPS else 0.6
        writer.add("step", {"ts": 1061.0 + i / 10, "step": i + 1, "samples": 64, "accuracy.addition": accuracy})
    writer.flush()
    fall = analyse(tmp_path)["rollout_fall"]["addition"]
    assert fall["fall"] == pytest.approx(0.2) and fall["window_steps"] == FALL_WINDOW_STEPS
    assert fall["trough_t_s"] == pytest.approx(61 + (2 * FALL_WINDOW_STEPS - 1) / 10, abs=0.01)


def test_source_counters_are_summed_over_replicas_from_their_stop_lines(tmp_path: Path) -> None:
    """`learn.py` records what the source did (tasks published, passed over with `skip_no_signal`): its counters at
    the stop, from each source replica's `stopped` log line (as the runtime writes it), summed; gauges left out."""
    import json

    from bench.learn import source_counters

    (tmp_path / "logs").mkdir()
    (tmp_path / "run.json").write_text(json.dumps({"kinds": {"prompts-a": "source", "learner": "learner"}}))
    line = (
        "18:15:50 [info     ] stopped                        actor=prompts-a counters={{'gc_freezes': 1, "
        "'in_flight': 32, 'backlog': 27, 'published.addition': {p}, 'passed_over.addition': {s}, 'published': {p}}} "
        "replica={r} topology=t\n"
    )
    (tmp_path / "logs" / "prompts-a-0.log").write_text("12:00:00 [info     ] running\n" + line.format(p=10, s=4, r=0))
    (tmp_path / "logs" / "prompts-a-1.log").write_text(line.format(p=1, s=1, r=1) + line.format(p=7, s=2, r=1))
    (tmp_path / "logs" / "learner-0.log").write_text(line.format(p=100, s=100, r=0))  # not a source
    assert source_counters(tmp_path) == {"published.addition": 17, "passed_over.addition": 6, "published": 17}
    assert source_counters(tmp_path / "absent") == {}
