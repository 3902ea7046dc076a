"""flywheel's topology layer: spec → graph → runtime.

``load_spec(path)`` reads a YAML topology spec (with ``include:`` and ``${ENV}``), validates it into typed,
frozen models and raises `SpecError` listing every issue (``file:line:col: key.path: message``);
``build_graph(spec)`` resolves actors, replicas and channels. Importing this package never imports torch.
"""

from topology._check import check_spec, load_spec, load_spec_text
from topology._errors import SpecError, SpecIssue
from topology._graph import ActorNode, ChannelNode, Graph, build_graph
from topology._lazy import lazy_exports
from topology._registry import ActorKind, actor_kinds, register_actor_kind, resolve_factory
from topology._spec import (
    ActorSpec,
    BusSpec,
    ChannelSpec,
    DomainSpec,
    PolicySpec,
    ResourcesSpec,
    RestartSpec,
    RuntimeSpec,
    Spec,
    SpecModel,
    WarmStartSpec,
)
from topology.runtime import (
    Actor,
    ActorContext,
    Counters,
    LocalRuntime,
    RunResult,
    Runtime,
    SingleProcessRuntime,
)

__all__ = [
    "Actor",
    "ActorContext",
    "ActorKind",
    "ActorNode",
    "ActorSpec",
    "BusSpec",
    "ChannelNode",
    "ChannelSpec",
    "Counters",
    "DomainSpec",
    "Graph",
    "LocalRuntime",
    "PolicySpec",
    "ResourcesSpec",
    "RestartSpec",
    "RunResult",
    "Runtime",
    "RuntimeSpec",
    "SingleProcessRuntime",
    "Spec",
    "SpecError",
    "SpecIssue",
    "SpecModel",
    "WarmStartSpec",
    "actor_kinds",
    "build_graph",
    "check_spec",
    "lazy_exports",
    "load_spec",
    "load_spec_text",
    "register_actor_kind",
    "resolve_factory",
]
