"""The held-out split: fixed, seed-independent, and disjoint from what training samples."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from actors.domains import SourceError, heldout_bucket, open_source

BUILTINS = ["builtin:arithmetic", "builtin:pyexpr", "builtin:extract"]


@pytest.mark.parametrize("source", BUILTINS)
def test_heldout_is_disjoint_from_10k_training_samples(source: str) -> None:
    src = open_source(source, domain="d", heldout=200)
    held = src.heldout()
    assert len(held) == 200 == len({t.key for t in held}) == len({t.prompt for t in held})
    assert all(src.is_heldout(t) for t in held)
    rng = random.Random(7)
    train = [src.sample(rng) for _ in range(10_000)]
    assert not any(src.is_heldout(t) for t in train)
    assert not {t.key for t in train} & {t.key for t in held}
    assert not {t.prompt for t in train} & {t.prompt for t in held}


@pytest.mark.parametrize("source", BUILTINS)
def test_heldout_is_fixed_and_a_prefix_of_larger_sets(source: str) -> None:
    a = open_source(source, domain="d", heldout=50).heldout()
    b = open_source(source, domain="d", heldout=120).heldout()
    assert a == b[:50]


def test_heldout_fraction_roughly_matches_the_share_of_the_task_space() -> None:
    src = open_source("builtin:arithmetic", domain="d", heldout=0, options={"heldout_fraction": 0.25})
    rng = random.Random(0)
    # Sampling rejects held-out keys; the rejected share of raw draws is the held-out fraction.
    from actors.domains._arithmetic import ArithmeticGenerator, ArithmeticOptions

    gen = ArithmeticGenerator(ArithmeticOptions())
    draws = [gen.draw(rng) for _ in range(4000)]
    share = sum(heldout_bucket(d.key) < 0.25 for d in draws) / len(draws)
    assert 0.2 < share < 0.3
    assert all(not src.is_heldout(src.sample(rng)) for _ in range(1000))


def test_too_many_heldout_tasks_for_a_small_space_is_a_clear_error() -> None:
    with pytest.raises(SourceError, match=r"asked for 500 held-out tasks but only \d+ distinct ones exist"):
        open_source("builtin:pyexpr?terms=2&operators=+", domain="d", heldout=500)


def test_builtin_with_a_heldout_file_excludes_its_prompts_from_training(tmp_path: Path) -> None:
    src0 = open_source("builtin:arithmetic?digits=1&ops=1&operators=+", domain="d", heldout=0)
    rng = random.Random(0)
    chosen = {src0.sample(rng).prompt for _ in range(30)}
    path = tmp_path / "held.jsonl"
    path.write_text("".join(f'{{"prompt": "{p}", "reference": "x"}}\n' for p in sorted(chosen)))
    src = open_source(
        "builtin:arithmetic?digits=1&ops=1&operators=+", domain="d", heldout="jsonl:held.jsonl", base_dir=tmp_path
    )
    assert sorted(t.prompt for t in src.heldout()) == sorted(chosen)
    rng = random.Random(1)
    assert not {src.sample(rng).prompt for _ in range(3000)} & chosen
