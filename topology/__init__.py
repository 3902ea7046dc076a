"""flywheel's framework: spec → graph → runtime, for any application that registers into it.

``load_spec(path)`` reads a YAML topology spec (with ``include:`` and ``${ENV}``), validates it into typed,
frozen models and raises `SpecError` listing every issue (``file:line:col: key.path: message``);
``build_graph(spec)`` resolves actors, replicas and channels; the runtimes run it. The framework knows no RL: an
application registers its actor kinds, spec sections, commands and live view (`register_actor_kind`,
`register_spec_section`, `register_command`, `register_live_view`) and is found through the ``flywheel.plugins``
entry points. Every name on the bus is built by the functions of `topology._names` (re-exported here).

Layering: nothing under ``topology/`` imports the application (``actors/``); `just lint` checks it. Importing
this package never imports torch.
"""

from topology._check import check_spec, load_spec, load_spec_text
from topology._errors import SpecError, SpecIssue
from topology._graph import ActorNode, ChannelNode, Graph, build_graph
from topology._lazy import lazy_exports
from topology._machine import bind_problem, visible_gpus
from topology._names import (
    bucket_name,
    channel_subject,
    consumer_name,
    ephemeral_subject,
    replica_id,
    stream_name,
    torch_threads,
)
from topology._registry import (
    ActorKind,
    Command,
    PluginError,
    ResumeConflict,
    SectionCheck,
    SpecSection,
    actor_kinds,
    commands,
    register_actor_kind,
    register_command,
    register_live_view,
    register_spec_section,
    resolve_factory,
    spec_sections,
)
from topology._spec import (
    ActorSpec,
    BusSpec,
    ChannelSpec,
    ResourcesSpec,
    RestartSpec,
    RuntimeSpec,
    Spec,
    SpecModel,
    show,
)
from topology._yaml import KeyPath
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
    "Command",
    "Counters",
    "Graph",
    "KeyPath",
    "LocalRuntime",
    "PluginError",
    "ResourcesSpec",
    "RestartSpec",
    "ResumeConflict",
    "RunResult",
    "Runtime",
    "RuntimeSpec",
    "SectionCheck",
    "SingleProcessRuntime",
    "Spec",
    "SpecError",
    "SpecIssue",
    "SpecModel",
    "SpecSection",
    "actor_kinds",
    "bind_problem",
    "bucket_name",
    "build_graph",
    "channel_subject",
    "check_spec",
    "commands",
    "consumer_name",
    "ephemeral_subject",
    "lazy_exports",
    "load_spec",
    "load_spec_text",
    "register_actor_kind",
    "register_command",
    "register_live_view",
    "register_spec_section",
    "replica_id",
    "resolve_factory",
    "show",
    "spec_sections",
    "stream_name",
    "torch_threads",
    "visible_gpus",
]
