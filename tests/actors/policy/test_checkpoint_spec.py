"""`policy.checkpoint` must hold weights the model can load: `flywheel up` says so at the key's line before anything
starts (the learner and every generator crash-looped on them until the topology gave up, ending in a traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import actors  # noqa: F401  (registers the kinds and sections)
from actors.learner import export_safetensors
from actors.policy import Policy, write_tiny_hf_model
from topology import SpecError, load_spec
from topology.cli import main

pytestmark = pytest.mark.timeout(120)

SPEC = """name: ck
policy:
  model: MODEL
  checkpoint: CHECKPOINT
domains:
  arithmetic: {source: builtin:arithmetic, verifier: math}
actors: {source: {}, generator: {}, verify: {}, learner: {}}
runtime: {run_dir: runs}
"""


def starting_errors(folder: Path, model: str, checkpoint: Path) -> list[str]:
    spec = folder / "spec.yaml"
    spec.write_text(SPEC.replace("MODEL", model).replace("CHECKPOINT", str(checkpoint)))
    load_spec(spec)  # validate's view: the file is there, that is all it asks
    try:
        load_spec(spec, starting=True)
    except SpecError as exc:
        assert all((e.path, e.line) == ("policy.checkpoint", 4) for e in exc.errors), exc
        return [e.message for e in exc.errors]
    return []


def test_weights_of_another_model_are_refused_at_the_checkpoint_line(tmp_path: Path) -> None:
    llama = write_tiny_hf_model(tmp_path / "llama", arch="llama")
    wider = write_tiny_hf_model(tmp_path / "wider", arch="llama", n_embd=32, n_head=2)
    [other_kind] = starting_errors(tmp_path, "builtin:tiny-gpt", llama)
    assert "expected weights of builtin:tiny-gpt" in other_kind and "missing (e.g. 'wte.weight')" in other_kind
    [other_size] = starting_errors(tmp_path, f"hf:{llama}", wider)
    assert f"expected weights of hf:{llama}" in other_size and ": shape (" in other_size
    [not_weights] = starting_errors(tmp_path, f"hf:{llama}", llama / "config.json")
    assert "cannot be read as one" in not_weights
    result = CliRunner().invoke(main, ["up", str(tmp_path / "spec.yaml"), "--duration", "5"])
    assert result.exit_code == 1 and "cannot be read as one" in result.output and "nothing was started" in result.output
    assert not (tmp_path / "runs").exists()


def test_an_export_loads_back_as_the_checkpoint_of_its_model(tmp_path: Path) -> None:
    """What the learner exports at stop is what `policy.checkpoint` takes, for a builtin model and an hf: one."""
    llama = write_tiny_hf_model(tmp_path / "llama", arch="llama")
    hf_export = export_safetensors(Policy.from_spec({"model": f"hf:{llama}"}), tmp_path / "hf-export")
    assert starting_errors(tmp_path, f"hf:{llama}", hf_export) == []
    assert starting_errors(tmp_path, f"hf:{hf_export}", llama) == []
    builtin_export = export_safetensors(Policy.from_spec({"model": "builtin:tiny-gpt"}), tmp_path / "builtin-export")
    assert starting_errors(tmp_path, "builtin:tiny-gpt", builtin_export) == []
