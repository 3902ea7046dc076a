"""Every example spec in specs/ validates (warnings about this machine's resources are allowed) and its domains open
(sources and their options, JSONL files): what the source actor does first when the topology comes up."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.protocol import domains_of, policy_of
from topology import build_graph, check_spec

SPECS = sorted((Path(__file__).parents[2] / "specs").glob("*.yaml"))


def test_the_documented_examples_exist() -> None:
    names = {p.name for p in SPECS}
    assert {"embedded.yaml", "multi-domain.yaml", "sglang-gpu.yaml", "vllm-gpu.yaml", "ray-cluster.yaml"} <= names


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_example_spec_validates(path: Path) -> None:
    spec, issues = check_spec(path)
    errors = [str(i) for i in issues if i.is_error]
    assert errors == [] and spec is not None
    assert build_graph(spec).actors


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_example_spec_domains_open(path: Path) -> None:
    from actors.domains import domains_from_spec

    spec, _ = check_spec(path)
    assert spec is not None
    assert set(domains_from_spec(spec)) == set(domains_of(spec))


def test_embedded_default_fits_two_cores_and_has_the_three_domains() -> None:
    spec, _ = check_spec(SPECS[0].parent / "embedded.yaml")
    assert spec is not None
    assert set(domains_of(spec)) == {"arithmetic", "pyexpr", "extract"}
    assert {d.verifier for d in domains_of(spec).values()} == {"math", "python-expr", "json-fields"}
    assert set(spec.actors) == {"source", "generator", "verify", "learner"}
    assert spec.bus.embedded and policy_of(spec).model == "builtin:tiny-gpt"
    assert sum(a.resources.num_cpus * a.replicas for a in spec.actors.values()) <= 2
