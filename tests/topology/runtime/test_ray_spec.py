"""The Ray fields of `runtime:` (placement, colocate) are validated like every other spec field — no Ray needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.topology.runtime._helpers import write_spec
from topology import ResourcesSpec, SpecError, load_spec
from topology.runtime._ray import bundle_for


def _spec(tmp_path: Path, runtime: str) -> Path:
    path = write_spec(tmp_path)
    path.write_text(path.read_text().replace("runtime:\n  run_dir: runs\n", f"runtime:\n  run_dir: runs\n{runtime}"))
    return path


def _errors(path: Path) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    return [f"{i.path}: {i.message}" for i in caught.value.issues if i.is_error]


def test_placement_and_colocate_load(kinds_env: None, tmp_path: Path) -> None:
    spec = load_spec(_spec(tmp_path, "  kind: ray\n  placement: pack\n  colocate: [[ticker, tally]]\n"))
    assert spec.runtime.placement == "pack"
    assert spec.runtime.colocate == [["ticker", "tally"]]


def test_colocate_names_an_unknown_actor(kinds_env: None, tmp_path: Path) -> None:
    errors = _errors(_spec(tmp_path, "  kind: ray\n  colocate: [[ticker, learner]]\n"))
    assert errors == ["runtime.colocate[0][1]: expected an actor name (ticker, tally), got 'learner'"]


def test_ray_fields_need_kind_ray(kinds_env: None, tmp_path: Path) -> None:
    errors = _errors(_spec(tmp_path, "  placement: spread\n"))
    assert len(errors) == 1 and "expected no placement with kind: local" in errors[0]


def test_an_actor_is_in_one_colocate_group_at_most(kinds_env: None, tmp_path: Path) -> None:
    errors = _errors(_spec(tmp_path, "  kind: ray\n  colocate: [[ticker], [tally, ticker]]\n"))
    assert len(errors) == 1 and "'ticker' twice" in errors[0]


def test_bundles_carry_every_resource_and_are_never_empty() -> None:
    full = ResourcesSpec(num_cpus=2, num_gpus=0.5, memory_mb=1024, custom={"learner_node": 1})
    assert bundle_for(full, in_group=True) == {"CPU": 2.0, "GPU": 0.5, "memory": 2.0**30, "learner_node": 1.0}
    assert bundle_for(ResourcesSpec(num_cpus=0), in_group=True) == {"CPU": 0.01}
    assert bundle_for(ResourcesSpec(num_cpus=0), in_group=False) == {"CPU": 0.0}
