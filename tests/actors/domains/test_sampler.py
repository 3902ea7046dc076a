"""Weighted sampling over domains and the public surface of the package."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from actors.domains import Domain, DomainSampler, SourceError, domains_from_spec, open_source
from actors.protocol import domains_of


def test_domain_weights_are_respected() -> None:
    weights = {"a": 1.0, "b": 3.0, "c": 6.0}
    domains = {
        name: Domain(name=name, source=open_source("builtin:arithmetic", domain=name), weight=w)
        for name, w in weights.items()
    }
    sampler = DomainSampler(domains, random.Random(0))
    counts = Counter(sampler.next()[0].name for _ in range(10_000))
    for name, w in weights.items():
        assert abs(counts[name] / 10_000 - w / 10) < 0.03, counts


def test_sampler_tasks_carry_their_domain_and_are_deterministic() -> None:
    domains = {
        "math": Domain(name="math", source=open_source("builtin:arithmetic", domain="math")),
        "ext": Domain(name="ext", source=open_source("builtin:extract", domain="ext"), verifier="json-fields"),
    }

    def run(seed: int) -> list[tuple[str, str]]:
        sampler = DomainSampler(domains, random.Random(seed))
        return [(d.name, t.id) for d, t in (sampler.next() for _ in range(50))]

    assert run(5) == run(5) != run(6)
    s = DomainSampler(domains, random.Random(5))
    assert all(d.name == t.domain for d, t in (s.next() for _ in range(200)))


def test_bad_weights_or_no_domains_are_errors() -> None:
    with pytest.raises(SourceError, match="declare at least one"):
        DomainSampler({}, random.Random(0))
    src = open_source("builtin:arithmetic", domain="a")
    with pytest.raises(SourceError, match=r"domains\.a\.weight: expected a number > 0, got 0"):
        DomainSampler({"a": Domain(name="a", source=src, weight=0)}, random.Random(0))


def test_domains_from_spec_opens_each_domain_relative_to_the_spec(tmp_path: Path) -> None:
    (tmp_path / "mine.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    entry = SimpleNamespace
    domains_section = {
        "arithmetic": entry(
            source="builtin:arithmetic", verifier="math", verifier_config={}, weight=2, group_size=8, heldout=20
        ),
        "mine": entry(
            source="jsonl:mine.jsonl",
            verifier="pkg.mod:check",
            verifier_config={"x": 1},
            weight=1.0,
            group_size=1,
            heldout=1,
        ),
    }
    spec = SimpleNamespace(source_path=tmp_path / "spec.yaml", sections={"domains": domains_section})
    domains = domains_from_spec(spec)
    assert domains["arithmetic"].weight == 2.0 and domains["arithmetic"].group_size == 8
    assert len(domains["arithmetic"].source.heldout()) == 20
    assert domains["mine"].verifier == "pkg.mod:check" and domains["mine"].verifier_config == {"x": 1}
    domains_of(spec)["mine"] = entry(source="jsonl:missing.jsonl", verifier="math", weight=1.0, group_size=1, heldout=0)
    with pytest.raises(SourceError, match=r"^domains\.mine: .*missing\.jsonl: file not found"):
        domains_from_spec(spec)
