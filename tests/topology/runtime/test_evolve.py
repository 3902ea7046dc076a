"""What a resumed run's spec changed (`topology.runtime._evolve`): each change named once, by key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from topology.runtime._evolve import ResumeRefused, check_resumable, describe_changes, spec_changes

BEFORE = {
    "name": "t",
    "domains": {"a": {"weight": 1.0, "group_size": 4}, "b": {"weight": 1.0}},
    "actors": {"learner": {"lr": 1e-4, "eval": [1, 2]}},
}


def test_changes_are_named_by_key_path_and_an_entry_added_or_removed_whole_is_one_change() -> None:
    after = {
        "name": "t",
        "domains": {"a": {"weight": 2.0, "group_size": 4}, "c": {"weight": 1.0}},
        "actors": {"learner": {"lr": 1e-4, "eval": [1, 3], "ema_decay": 0.9}},
    }
    assert describe_changes(spec_changes(BEFORE, after)) == (
        "domains.a.weight: 1.0 → 2.0; domains.b: removed; domains.c: added; actors.learner.eval: [1,2] → [1,3]; "
        "actors.learner.ema_decay: added (0.9)"
    )
    replicas = {"actors": {"generator": {"replicas": 2}}}
    assert describe_changes(spec_changes(replicas, {"actors": {"generator": {}}})) == (
        "actors.generator.replicas: 2 → unset (the default)"  # not "removed", as if the replicas were
    )


def test_an_unchanged_spec_has_no_changes_whatever_its_containers() -> None:
    assert spec_changes(BEFORE, {**BEFORE, "actors": {"learner": {"lr": 1e-4, "eval": (1, 2)}}}) == []


def test_another_topology_name_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ResumeRefused) as refused:
        check_resumable(tmp_path, "old", BEFORE, spec_path=tmp_path / "s.yaml", name="new", after=BEFORE)
    message = str(refused.value)
    assert "the run is topology 'old', the spec is 'new'" in message
    assert "keep `name: old`" in message and f"flywheel up {tmp_path / 's.yaml'} (without --resume)" in message
