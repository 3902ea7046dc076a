"""YAML layer: positions, duplicate keys, ${ENV} interpolation and include: merging."""

from __future__ import annotations

from pathlib import Path

import pytest

from topology._yaml import interpolate, load_document, parse_text


def test_positions_of_keys_and_values_are_one_based() -> None:
    doc = parse_text("name: x\nactors:\n  gen:\n    replicas: 2\n", "s.yaml", {})
    assert doc.data == {"name": "x", "actors": {"gen": {"replicas": 2}}}
    value = doc.value_loc(("actors", "gen", "replicas"))
    key = doc.key_loc(("actors", "gen", "replicas"))
    assert (value.file, value.line, value.col) == ("s.yaml", 4, 15)
    assert (key.line, key.col) == (4, 5)


def test_missing_path_falls_back_to_nearest_parent() -> None:
    doc = parse_text("actors:\n  gen: {}\n", "s.yaml", {})
    assert doc.value_loc(("actors", "gen", "nope")).line == 2


def test_duplicate_keys_are_errors_at_the_second_occurrence() -> None:
    doc = parse_text("a: 1\nb:\n  c: 1\n  c: 2\na: 3\n", "s.yaml", {})
    found = sorted((i.line, i.path) for i in doc.issues)
    assert found == [(4, "b.c"), (5, "a")]


def test_keys_are_taken_as_written() -> None:
    doc = parse_text("on: 1\n'no': 2\n", "s.yaml", {})
    assert doc.data == {"on": 1, "no": 2}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${A}", "1"),
        ("x-${A}-y", "x-1-y"),
        ("${MISSING:-dflt}", "dflt"),
        ("${EMPTY:-dflt}", "dflt"),
        ("$${A}", "${A}"),
        ("no dollars", "no dollars"),
        ("cost $5", "cost $5"),
    ],
)
def test_interpolation(text: str, expected: str) -> None:
    assert interpolate(text, {"A": "1", "EMPTY": ""}) == (expected, [])


@pytest.mark.parametrize("text", ["${MISSING}", "${1BAD}", "${OPEN", "${}"])
def test_interpolation_problems(text: str) -> None:
    _, problems = interpolate(text, {})
    assert problems


def test_unquoted_interpolation_is_retyped_quoted_stays_a_string() -> None:
    doc = parse_text('a: ${N:-2}\nb: "${N:-2}"\nc: ${T:-true}\n', "s.yaml", {})
    assert doc.data == {"a": 2, "b": "2", "c": True}


@pytest.mark.parametrize("flow", ["bus: {url: nats://h:4222, creds_file: ${NATS_CREDS}}", "ports: [${PORT}]"])
def test_an_unquoted_variable_in_a_flow_mapping_says_to_quote_it(flow: str) -> None:
    """The README's own `bus: {url: …, creds_file: ${NATS_CREDS}}` was only "invalid YAML: expected ',' or '}', but
    got '{'": YAML reads the `{` of `${` as a new mapping. The message says how to write it."""
    doc = parse_text(f"name: t\n{flow}\n", "t.yaml", {"NATS_CREDS": "/c.creds", "PORT": "1"})
    (issue,) = doc.issues
    assert (issue.line, issue.message.split(":")[0]) == (2, "invalid YAML")
    assert 'quote a ${VAR} ("${VAR}")' in issue.message
    quoted = parse_text('bus: {url: nats://h:4222, creds_file: "${NATS_CREDS}"}\n', "t.yaml", {"NATS_CREDS": "/c"})
    assert not quoted.issues and quoted.data == {"bus": {"url": "nats://h:4222", "creds_file": "/c"}}


def test_undefined_variable_is_an_error_at_its_scalar() -> None:
    doc = parse_text("bus:\n  url: ${NOPE_NOT_SET}\n", "s.yaml", {})
    (issue,) = doc.issues
    assert (issue.line, issue.col, issue.path) == (2, 8, "bus.url")
    assert "NOPE_NOT_SET" in issue.message


def test_include_deep_merges_and_keeps_positions(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "base.yaml").write_text("name: base\nbus:\n  max_deliver: 3\n  ack_wait_s: 9\nlist: [1, 2]\n")
    (tmp_path / "top.yaml").write_text("include: base/base.yaml\nbus:\n  max_deliver: 7\nlist: [3]\n")
    doc = load_document(tmp_path / "top.yaml", {})
    assert doc.issues == []
    assert doc.data == {"name": "base", "bus": {"max_deliver": 7, "ack_wait_s": 9}, "list": [3]}
    assert doc.value_loc(("bus", "ack_wait_s")).file.endswith("base.yaml")
    assert doc.value_loc(("bus", "ack_wait_s")).line == 4
    assert doc.value_loc(("bus", "max_deliver")).file.endswith("top.yaml")
    assert doc.value_loc(("list", 0)).file.endswith("top.yaml")
    assert ("list", 1) not in doc.values


def test_a_value_read_from_a_variable_is_set_there_until_a_file_writes_over_it(tmp_path: Path) -> None:
    """Messages that ask for another value name the variable to set (``Document.setting``): through includes, and
    not once the including file writes the value itself."""
    (tmp_path / "base.yaml").write_text("a:\n  port: ${PORT:-80}\n  host: ${HOST:-x}-${ZONE:-y}\n  n: 1\n")
    (tmp_path / "top.yaml").write_text("include: base.yaml\na:\n  host: h\n")
    doc = load_document(tmp_path / "top.yaml", {})
    assert doc.setting(("a", "port")) == "$PORT, which a.port reads"
    assert doc.setting(("a", "host")) == "a.host"  # top.yaml writes it: no variable is read any more
    assert doc.setting(("a", "n")) == "a.n"
    both = load_document(tmp_path / "base.yaml", {})
    assert both.setting(("a", "host")) == "$HOST or $ZONE, which a.host reads"


def test_null_over_an_included_mapping_removes_it(tmp_path: Path) -> None:
    """The way to clear what a base spec set: without it, an inherited option could only be overridden, never
    dropped (``source_options: {}`` merges into the base's, ``null`` was "expected a mapping")."""
    (tmp_path / "base.yaml").write_text(
        "name: base\ndomains:\n  a: {source: builtin:arithmetic, source_options: {digits: 2}, verifier: math}\n"
        "actors:\n  gate: {threshold: 0.1}\n  verify: {}\n"
    )
    (tmp_path / "top.yaml").write_text(
        "include: base.yaml\ndomains:\n  a: {source: 'builtin:arithmetic?digits=3', source_options: null}\n"
        "actors:\n  gate: null\n"
    )
    doc = load_document(tmp_path / "top.yaml", {})
    assert doc.issues == []
    assert doc.data == {
        "name": "base",
        "domains": {"a": {"source": "builtin:arithmetic?digits=3", "verifier": "math"}},
        "actors": {"verify": {}},
    }
    assert not [p for p in doc.values if p[:2] == ("actors", "gate") and len(p) > 2]  # the base's block is gone


def test_include_list_later_wins(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("x: 1\ny: 1\n")
    (tmp_path / "b.yaml").write_text("y: 2\n")
    (tmp_path / "top.yaml").write_text("include: [a.yaml, b.yaml]\nz: 3\n")
    assert load_document(tmp_path / "top.yaml", {}).data == {"x": 1, "y": 2, "z": 3}


def test_include_cycle_names_the_chain(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("include: b.yaml\n")
    (tmp_path / "b.yaml").write_text("x: 1\ninclude: a.yaml\n")
    doc = load_document(tmp_path / "a.yaml", {})
    (issue,) = doc.issues
    assert issue.file.endswith("b.yaml") and issue.line == 2
    assert "a.yaml → b.yaml → a.yaml" in issue.message


@pytest.mark.parametrize(
    ("content", "needle"),
    [(b"", "empty"), (b"\x00\x01binary", "binary"), (b"\xff\xfe\xfa", "UTF-8"), (b"- 1\n- 2\n", "got a list")],
)
def test_unusable_files_are_single_issues(tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(content)
    doc = load_document(path, {})
    assert len(doc.issues) == 1 and needle in doc.issues[0].message


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert "no such file" in load_document(tmp_path / "nope.yaml", {}).issues[0].message
    assert "directory" in load_document(tmp_path, {}).issues[0].message
