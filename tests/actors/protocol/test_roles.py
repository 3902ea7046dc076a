"""The roles other kinds read off an actor's config, on specs written as users write them."""

from __future__ import annotations

from pathlib import Path

import actors  # noqa: F401  (registers the kinds)
from actors.protocol import runs_on_cpu, serving_replicas, weight_receivers
from topology import load_spec

SPEC = """
name: roles
bus: {embedded: true}
policy: {model: "hf:model"}  # an SGLang engine serves a Hugging Face model
domains:
  arithmetic: {source: builtin:arithmetic, verifier: math}
actors:
  source: {}
  generator: {replicas: 2, weight_sync: distributed, device: cpu}
  serving: {kind: generator, replicas: 3, serve: true, consumes: []}
  remote: {kind: generator, engine: sglang, url: "http://127.0.0.1:1"}
  verify: {}
  learner: {weight_transport: distributed}
  gateway: {}
  joiner: {consumes: [traffic, feedback]}
"""


def test_roles_are_read_from_the_configs_that_have_them(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    spec = load_spec(path)
    assert serving_replicas(spec) == 3
    # the torch generator's replicas join the group; an SGLang one never does (validate refuses it)
    assert weight_receivers(spec) == [("generator", 0), ("generator", 1)]
    assert runs_on_cpu(spec.actors["generator"].config)
    assert not runs_on_cpu(spec.actors["serving"].config)  # device: auto
    assert not runs_on_cpu(spec.actors["gateway"].config)  # no device at all
