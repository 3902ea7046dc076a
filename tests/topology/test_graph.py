"""The resolved graph: nodes, edges, the plan table and the mermaid diagram."""

from __future__ import annotations

from topology import build_graph, load_spec_text

SPEC = """\
name: g
policy: {model: builtin:tiny-gpt}
domains:
  arithmetic: {source: builtin:arithmetic, verifier: math}
actors:
  source: {}
  generator: {replicas: 3, serve: true}
  verify: {}
  learner: {resources: {num_cpus: 1, num_gpus: 1}}
  gateway: {}
  joiner: {}
  recorder: {}
"""


def test_graph_nodes_replicas_and_edges() -> None:
    graph = build_graph(load_spec_text(SPEC, "g.yaml", {}))
    assert [a.name for a in graph.actors] == [
        "source",
        "generator",
        "verify",
        "learner",
        "gateway",
        "joiner",
        "recorder",
    ]
    assert graph.actor("generator").replica_ids == ("generator/0", "generator/1", "generator/2")
    traffic = graph.channel("traffic")
    assert traffic.producers == ("gateway",)
    assert traffic.consumers == ("joiner", "recorder")
    assert set(graph.channel("scored").producers) == {"verify", "joiner"}
    assert ("source", "prompts", "generator") in graph.edges
    assert ("joiner", "scored", "learner") in graph.edges


def test_table_lists_actors_channels_and_totals() -> None:
    table = build_graph(load_spec_text(SPEC, "g.yaml", {})).table()
    assert "generator" in table and "fw.g.traffic" in table
    assert "7 actors, 9 replicas, 5 channels" in table
    assert "\x1b[" not in table  # plain text, no colour codes


def test_mermaid_is_a_flowchart_with_every_edge() -> None:
    graph = build_graph(load_spec_text(SPEC, "g.yaml", {}))
    text = graph.mermaid()
    assert text.startswith("flowchart LR\n")
    assert "a_generator --> c_rollouts" in text and "c_rollouts --> a_verify" in text
    assert "generator ×3" in text
    edge_lines = [line for line in text.splitlines() if "-->" in line]
    assert len(edge_lines) == sum(len(c.producers) + len(c.consumers) for c in graph.channels)
