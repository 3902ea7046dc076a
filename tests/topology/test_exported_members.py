"""`topology.__all__` is exactly the framework's public surface; each framework package's `__all__` is what it
binds publicly, documented; the framework never imports its application."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import types

import pytest

import topology
from tests.conftest import ROOT

_FUTURE_FEATURE = type(annotations)  # `from __future__ import annotations` binds a name too

SURFACE = {
    # spec → graph
    "ActorSpec", "BusSpec", "ChannelSpec", "KeyPath", "ResourcesSpec", "RestartSpec", "RuntimeSpec", "Spec",
    "SpecError", "SpecIssue", "SpecModel", "check_spec", "load_spec", "load_spec_text", "show",
    "ActorNode", "ChannelNode", "Graph", "build_graph",
    # what an application registers
    "ActorKind", "Command", "PluginError", "ResumeConflict", "SectionCheck", "SpecSection", "actor_kinds", "commands",
    "register_actor_kind", "register_command", "register_live_view", "register_spec_section", "resolve_factory",
    "spec_sections", "lazy_exports",
    # names, built once
    "bucket_name", "channel_subject", "consumer_name", "ephemeral_subject", "replica_id", "stream_name",
    "torch_threads",
    # the machine
    "bind_problem", "visible_gpus",
    # runtime
    "Actor", "ActorContext", "Counters", "LocalRuntime", "RunResult", "Runtime", "SingleProcessRuntime",
}  # fmt: skip


def test_the_public_surface_is_exactly_what_we_mean_to_export() -> None:
    assert set(topology.__all__) == SURFACE
    assert len(set(topology.__all__)) == len(topology.__all__)
    for name in topology.__all__:
        assert getattr(topology, name) is not None, name


@pytest.mark.parametrize("package", ["topology", "topology.bus", "topology.runtime"])
def test_a_package_exports_what_it_binds_and_documents_it(package: str) -> None:
    """A name imported into ``__init__`` but not listed, a listed name that does not resolve, one that comes from
    outside the framework or a class or function without a docstring each fail here."""
    module = importlib.import_module(package)
    exported = list(module.__all__)
    assert len(set(exported)) == len(exported), "a name listed twice"
    bound = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType | _FUTURE_FEATURE)
    }
    assert bound - set(exported) == set(), "bound in __init__ but not exported"
    for name in exported:
        value = getattr(module, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.split(".")[0] == "topology", f"{name} comes from {value.__module__}"
            assert (value.__doc__ or "").strip(), f"{package}.{name} has no docstring"


def test_no_module_of_the_framework_imports_the_application() -> None:
    offenders = []
    for path in sorted((ROOT / "topology").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] == "actors"]
    assert offenders == []


def test_importing_topology_does_not_import_torch() -> None:
    code = "import sys, topology; topology.actor_kinds(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
