"""The gateway kind's check of its actors in a spec (`actors.gateway._config._check`)."""

from __future__ import annotations

from pathlib import Path

import actors  # noqa: F401  (registers the kinds)
from actors.gateway import GatewayConfig
from topology import load_spec

BASE = """
name: gw
policy: {model: "builtin:tiny-gpt"}
domains:
  arithmetic: {source: "builtin:arithmetic", verifier: math}
actors:
  source: {}
  generator: {serve: true}
  verify: {}
  learner: {}
  gateway: {api_keys_file: keys.txt}
  recorder: {}
"""


def test_api_keys_file_is_found_beside_the_spec_file_that_names_it(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "spec.yaml").write_text(BASE)
    (tmp_path / "base" / "keys.txt").write_text("a-key\n")
    (tmp_path / "run.yaml").write_text("include: base/spec.yaml\n")
    config = load_spec(tmp_path / "run.yaml").actors["gateway"].config
    assert isinstance(config, GatewayConfig)
    assert config.api_keys_file == str((tmp_path / "base" / "keys.txt").resolve())
