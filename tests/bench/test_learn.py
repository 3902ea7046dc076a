"""bench/learn.py: the spread of consecutive held-out rounds and the learner overrides given on the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.learn import ROOT, decoding_name, learner_overrides, spread, write_variant_spec


def test_spread_is_the_change_between_neighbouring_rounds_after_the_first_minute() -> None:
    curve = [{"t_s": t, "accuracy": a} for t, a in [(0, 0.4), (30, 0.9), (60, 0.6), (90, 0.7), (120, 0.5)]]
    gap = spread(curve)
    assert gap is not None
    assert gap["max"] == pytest.approx(0.2) and gap["mean"] == pytest.approx(0.15) and gap["pairs"] == 2
    assert spread(curve[:3]) is None  # one round past the first minute: no pair


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
