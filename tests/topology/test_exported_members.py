"""`topology.__all__` is exactly what we mean to export (helpers add theirs as they land)."""

from __future__ import annotations

import topology

SPEC_LAYER = {
    "ActorKind",
    "ActorNode",
    "ActorSpec",
    "BusSpec",
    "ChannelNode",
    "ChannelSpec",
    "DomainSpec",
    "Graph",
    "PolicySpec",
    "ResourcesSpec",
    "RestartSpec",
    "RuntimeSpec",
    "Spec",
    "SpecError",
    "SpecIssue",
    "SpecModel",
    "WarmStartSpec",
    "actor_kinds",
    "build_graph",
    "check_spec",
    "load_spec",
    "load_spec_text",
    "register_actor_kind",
    "resolve_factory",
}


def test_spec_layer_is_exported() -> None:
    assert set(topology.__all__) >= SPEC_LAYER


def test_every_exported_name_exists_and_is_public() -> None:
    for name in topology.__all__:
        assert hasattr(topology, name), name
        assert not name.startswith("_")
    assert len(set(topology.__all__)) == len(topology.__all__)


def test_importing_topology_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, topology; topology.actor_kinds(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
