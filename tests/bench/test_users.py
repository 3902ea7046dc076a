"""bench/users.py: its variant specs validate and say what they mean; its arithmetic, against hand-computed values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.users import correct, production_rows, thin, variant_spec, zipf_weights
from topology import load_spec


@pytest.mark.parametrize("name", ["production", "mixed"])
def test_variant_specs_validate(tmp_path: Path, name: str) -> None:
    checkpoint = tmp_path / "warm.safetensors"
    checkpoint.write_bytes(b"")  # only its path is written into the spec
    path = variant_spec(name, checkpoint, tmp_path, {"actors": {"learner": {"lr": 3.0e-4}}})
    spec = load_spec(path)
    assert spec.actors["gateway"].config.port > 0  # type: ignore[attr-defined]  # fixed: a restart comes back there
    assert spec.runtime.metrics_port == 0 and spec.runtime.run_dir == tmp_path / "runs"
    assert spec.actors["learner"].config.lr == 3.0e-4  # type: ignore[attr-defined]
    data = json.loads(path.read_text())
    assert data["policy"]["checkpoint"] == str(checkpoint)
    task_actors = {"source", "generator", "verify"}
    if name == "production":  # feedback alone
        assert not task_actors & set(spec.actors) and list(data["domains"]) == ["production"]
        assert spec.actors["learner"].config.eval_every_steps == 0  # type: ignore[attr-defined]
    else:
        assert task_actors <= set(spec.actors) and {"arithmetic", "production"} <= set(data["domains"])
    rows, held = production_rows(path)
    assert held == 100 and len(rows) == 500  # users never ask a held-out prompt


def test_zipf_weights_are_cumulative_harmonic() -> None:
    assert zipf_weights(3) == pytest.approx([1.0, 1.5, 1.5 + 1 / 3])


def test_thin_keeps_the_first_and_the_last_and_spreads_the_rest() -> None:
    versions = {v: Path(f"v{v}") for v in range(1, 101)}
    kept = thin(versions, 5)
    assert sorted(kept) == [1, 26, 51, 75, 100]  # indices round(i * 99 / 4): 0, 25, 50, 74, 99
    assert thin({1: Path("a")}, 5) == {1: Path("a")}


def test_correct_is_the_math_verifier() -> None:
    assert correct("17", "17") and correct(" 17\n", "17") and not correct("71", "17") and not correct("", "17")
