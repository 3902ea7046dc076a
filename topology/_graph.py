"""The resolved topology graph: actors (with their replicas) and the channels between them.

Contract: `build_graph(spec)` is pure (no I/O) and deterministic (actors in spec order, channels sorted).
`Graph.table()` renders the plan as plain text (rich tables, no colour codes); `Graph.mermaid()` renders
a ``flowchart LR`` where actors are boxes, channels are stadium-shaped nodes, and edges follow messages.

Non-goals: placement (which host runs what) — that is the runtime's decision.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from topology._errors import SpecIssue
from topology._names import replica_id
from topology._registry import actor_kinds
from topology._spec import ResourcesSpec, Spec


@dataclass(frozen=True)
class ActorNode:
    """One actor and its replicas."""

    name: str
    kind: str
    replicas: int
    resources: ResourcesSpec
    consumes: tuple[str, ...]
    publishes: tuple[str, ...]
    summary: str = ""

    @property
    def replica_ids(self) -> tuple[str, ...]:
        """``("generator/0", "generator/1")`` — how logs, heartbeats and status name replicas."""
        return tuple(replica_id(self.name, i) for i in range(self.replicas))


@dataclass(frozen=True)
class ChannelNode:
    """One channel and who is on each end of it."""

    name: str
    subject: str
    durable: bool
    external: bool
    producers: tuple[str, ...]
    consumers: tuple[str, ...]


@dataclass(frozen=True)
class Graph:
    """The resolved graph of a validated spec."""

    name: str
    actors: tuple[ActorNode, ...]
    channels: tuple[ChannelNode, ...]
    warnings: tuple[SpecIssue, ...] = ()

    def actor(self, name: str) -> ActorNode:
        for node in self.actors:
            if node.name == name:
                return node
        raise KeyError(name)

    def channel(self, name: str) -> ChannelNode:
        for node in self.channels:
            if node.name == name:
                return node
        raise KeyError(name)

    @property
    def edges(self) -> tuple[tuple[str, str, str], ...]:
        """``(producer actor, channel, consumer actor)`` for every message path."""
        return tuple((p, c.name, q) for c in self.channels for p in c.producers for q in c.consumers)

    def table(self, width: int = 120) -> str:
        """The plan as plain text: actors, channels, then warnings."""
        console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
        actors = Table(title=f"topology {self.name}: actors", title_justify="left")
        for column in ("actor", "kind", "replicas", "cpus", "gpus", "consumes", "publishes"):
            actors.add_column(column, justify="right" if column in ("replicas", "cpus", "gpus") else "left")
        for node in self.actors:
            actors.add_row(
                node.name,
                node.kind,
                str(node.replicas),
                f"{node.resources.num_cpus:g}",
                f"{node.resources.num_gpus:g}",
                ", ".join(node.consumes) or "-",
                ", ".join(node.publishes) or "-",
            )
        channels = Table(title="channels", title_justify="left")
        for column in ("channel", "subject", "durable", "producers", "consumers"):
            channels.add_column(column)
        for channel in self.channels:
            producers = ", ".join(channel.producers) or ("(external)" if channel.external else "-")
            channels.add_row(
                channel.name,
                channel.subject,
                "yes" if channel.durable else "no",
                producers,
                ", ".join(channel.consumers) or "-",
            )
        console.print(actors)
        console.print(channels)
        total_cpus = sum(n.resources.num_cpus * n.replicas for n in self.actors)
        total_gpus = sum(n.resources.num_gpus * n.replicas for n in self.actors)
        replicas = sum(n.replicas for n in self.actors)
        console.print(
            f"{len(self.actors)} actors, {replicas} replicas, {len(self.channels)} channels; "
            f"asks for {total_cpus:g} CPUs and {total_gpus:g} GPUs in total"
        )
        if self.warnings:
            console.print("warnings:")
            for warning in self.warnings:
                console.print(f"  {warning}", markup=False, highlight=False, soft_wrap=True)
        out = console.file
        assert isinstance(out, io.StringIO)
        return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"

    def mermaid(self) -> str:
        """A mermaid ``flowchart LR`` of actors (boxes) and channels (stadiums)."""
        lines = ["flowchart LR"]
        for node in self.actors:
            replicas = f" ×{node.replicas}" if node.replicas > 1 else ""
            resources = f"{node.resources.num_cpus:g} cpu"
            if node.resources.num_gpus:
                resources += f", {node.resources.num_gpus:g} gpu"
            label = f"{node.name}{replicas}<br/><small>{node.kind} · {resources}</small>"
            lines.append(f'    {_id("a", node.name)}["{label}"]')
        for channel in self.channels:
            style = "" if channel.durable else " (core)"
            lines.append(f'    {_id("c", channel.name)}(["{channel.name}{style}"])')
        for channel in self.channels:
            for producer in channel.producers:
                lines.append(f"    {_id('a', producer)} --> {_id('c', channel.name)}")
            for consumer in channel.consumers:
                lines.append(f"    {_id('c', channel.name)} --> {_id('a', consumer)}")
            if channel.external and not channel.producers:
                lines.append(f'    {_id("x", channel.name)}(("outside")) -.-> {_id("c", channel.name)}')
        return "\n".join(lines) + "\n"


def _id(prefix: str, name: str) -> str:
    return f"{prefix}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}"


def build_graph(spec: Spec) -> Graph:
    """Resolve a validated spec into its graph."""
    kinds = actor_kinds()
    actors = tuple(
        ActorNode(
            name=a.name,
            kind=a.kind,
            replicas=a.replicas,
            resources=a.resources,
            consumes=a.consumes,
            publishes=a.publishes,
            summary=kinds[a.kind].summary if a.kind in kinds else "",
        )
        for a in spec.actors.values()
    )
    channels = tuple(
        ChannelNode(
            name=c.name,
            subject=c.subject,
            durable=c.durable,
            external=c.external,
            producers=tuple(a.name for a in actors if c.name in a.publishes),
            consumers=tuple(a.name for a in actors if c.name in a.consumes),
        )
        for c in sorted(spec.channels.values(), key=lambda c: c.name)
    )
    return Graph(name=spec.name, actors=actors, channels=channels, warnings=spec.warnings)


__all__ = ["ActorNode", "ChannelNode", "Graph", "build_graph"]
