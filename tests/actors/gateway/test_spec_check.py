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


def test_up_refuses_a_port_another_process_listens_on_at_once(tmp_path: Path) -> None:
    """Each start of the gateway crashed on a port another process held, until the topology gave up (~30 s): `up`
    loads the spec as `starting` and says so before anything starts, at the port's line; so does the metrics port.
    `validate` does not look (a spec may be checked while its own run listens there)."""
    import socket

    from click.testing import CliRunner

    from topology import SpecError
    from topology.cli import main

    with socket.socket() as other, socket.socket() as metrics:
        for listener in (other, metrics):
            listener.bind(("127.0.0.1", 0))
            listener.listen()
        port, metrics_port = other.getsockname()[1], metrics.getsockname()[1]
        spec = tmp_path / "spec.yaml"
        spec.write_text(
            BASE.replace("gateway: {api_keys_file: keys.txt}", f"gateway: {{port: {port}}}")
            + f"runtime: {{metrics_port: {metrics_port}, run_dir: runs}}\n"
        )
        load_spec(spec)  # validate's view: fine
        try:
            load_spec(spec, starting=True)
        except SpecError as exc:
            found = {(e.path, e.line): e.message for e in exc.errors}
        else:
            raise AssertionError("a taken port passed")
        taken = f"expected a port free on this machine, but 127.0.0.1:{port} is in use by another process"
        assert found[("actors.gateway.port", 11)].startswith(taken), found
        assert f"127.0.0.1:{metrics_port} is in use by another process" in found[("runtime.metrics_port", 13)]
        result = CliRunner().invoke(main, ["up", str(spec), "--duration", "5"])
        assert result.exit_code == 1 and taken in result.output and "nothing was started" in result.output
        assert not (tmp_path / "runs").exists()
    load_spec(spec, starting=True)  # both closed: free again


def test_a_taken_port_read_from_an_environment_variable_names_the_variable(tmp_path: Path) -> None:
    """The shipped service spec reads its ports from ``${FLYWHEEL_GATEWAY_PORT:-8000}`` and
    ``${FLYWHEEL_METRICS_PORT:-9464}``: "set another port" sent its users to a file whose value they were not meant
    to edit. The error names the variable to set (and the key that reads it); a port written as a number, its key."""
    import socket

    from topology import SpecError

    service = Path(__file__).resolve().parents[3] / "specs" / "service.yaml"
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = str(other.getsockname()[1])
        found: dict[str, str] = {}
        for environ in ({"FLYWHEEL_GATEWAY_PORT": port}, {"FLYWHEEL_METRICS_PORT": port, "FLYWHEEL_GATEWAY_PORT": "0"}):
            try:
                load_spec(service, environ, starting=True)
            except SpecError as exc:
                found |= {e.path: e.message for e in exc.errors if port in e.message}
        assert (
            "set another port in $FLYWHEEL_GATEWAY_PORT, which actors.gateway.port reads"
            in found["actors.gateway.port"]
        ), found
        assert (
            "set another port in $FLYWHEEL_METRICS_PORT, which runtime.metrics_port reads"
            in found["runtime.metrics_port"]
        ), found
        written = tmp_path / "spec.yaml"
        written.write_text(BASE.replace("gateway: {api_keys_file: keys.txt}", f"gateway: {{port: {port}}}"))
        try:
            load_spec(written, {}, starting=True)
        except SpecError as exc:
            [message] = [e.message for e in exc.errors if e.path == "actors.gateway.port"]
        else:
            raise AssertionError("a taken port passed")
        assert "set another port in actors.gateway.port;" in message and "$" not in message
