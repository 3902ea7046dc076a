"""A user's ``module:function`` verifier that cannot be called as the verify actor calls it is refused at start: by
``build_verifier`` with one line, and by ``flywheel up`` at the domain's spec line, before anything starts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

import actors  # noqa: F401  (registers the kinds and sections)
from actors.domains import VerifierError, build_verifier
from topology import SpecError, load_spec
from topology.cli import main

pytestmark = pytest.mark.timeout(60)

VERIFIERS = """
def plain(completion, task):
    return float(completion.strip() == task["want"])

def configured(completion, task, config):
    return float(completion.strip() == task["want"]) * config["scale"]

def reads_config(completion, task, config):
    return float(completion.strip() == task["want"]) * config.get("scale", 1.0)

def one_argument(completion):
    return 1.0

def text_reward(completion, task):
    return {"reward": "1", "detail": "a number in a string"}

def text(completion, task):
    return "1"
"""

SPEC = """
name: mine
policy: {model: "builtin:tiny-gpt"}
domains:
  reverse:
    source: jsonl:tasks.jsonl
    verifier: VERIFIER
    verifier_config: CONFIG
    heldout: 1
actors:
  source: {}
  generator: {}
  verify: {}
  learner: {}
runtime: {run_dir: runs}
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    name = f"user_verifiers_{tmp_path.name.replace('-', '_')}"  # a module name of this test's own
    (tmp_path / f"{name}.py").write_text(VERIFIERS)
    (tmp_path / "tasks.jsonl").write_text("".join(f'{{"prompt": "rev {w}=", "answer": "{w[::-1]}"}}\n' for w in "abc"))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / f"{name}.py"


def test_a_signature_that_cannot_take_the_call_is_refused_when_built(module: Path) -> None:
    name = module.stem
    # verifier_config goes to it as config=: a function without one failed on every answer (internal_error, reward 0)
    with pytest.raises(VerifierError, match=r"plain\(completion, task\) takes no 'config' argument"):
        build_verifier(f"{name}:plain", {"scale": 1.0})
    with pytest.raises(VerifierError, match=r"expected a function taking \(completion_text, task\)"):
        build_verifier(f"{name}:one_argument")
    configured = build_verifier(f"{name}:configured", {"scale": 0.5})
    assert asyncio.run(configured.verify("ab", {"want": "ab"})).reward == 0.5
    # a function that declares config gets {} when the domain sets no verifier_config, rather than being refused
    reads_config = build_verifier(f"{name}:reads_config")
    assert asyncio.run(reads_config.verify("ab", {"want": "ab"})).reward == 1.0
    assert asyncio.run(build_verifier(f"{name}:plain").verify("ab", {"want": "ab"})).reward == 1.0


@pytest.mark.parametrize(
    ("target", "config", "message"),
    [
        ("plain", "{scale: 1}", "takes no 'config' argument"),
        ("nosuch", "{}", "has no callable 'nosuch'"),
        ("one_argument", "{}", "expected a function taking (completion_text, task)"),
    ],
)
def test_up_refuses_a_verifier_function_at_its_spec_line(module: Path, target: str, config: str, message: str) -> None:
    """The verify actor crash-looped on these at start until the topology gave up, its traceback printed; `up` now
    says it at the verifier's line and starts nothing. `validate` still imports no user module."""
    spec = module.parent / "spec.yaml"
    spec.write_text(SPEC.replace("VERIFIER", f"{module.stem}:{target}").replace("CONFIG", config))
    load_spec(spec)  # validate's view: fine
    with pytest.raises(SpecError) as raised:
        load_spec(spec, starting=True)
    [error] = raised.value.errors
    assert (error.path, error.line) == ("domains.reverse.verifier", 7) and message in error.message
    result = CliRunner().invoke(main, ["up", str(spec), "--duration", "5"])
    assert result.exit_code == 1 and message in result.output and "nothing was started" in result.output
    assert not (module.parent / "runs").exists()


def test_a_reward_that_is_not_a_number_is_an_error_in_a_mapping_too(module: Path) -> None:
    """A bare "1" was refused but {"reward": "1"} scored full marks: both are the verifier's mistake now."""
    for target in ("text", "text_reward"):
        result = asyncio.run(build_verifier(f"{module.stem}:{target}").verify("ab", {"want": "ab"}))
        assert (result.reward, result.verdict) == (0.0, "internal_error") and "str, expected a float" in result.detail


def test_up_says_so_when_a_verifier_module_is_slow_to_import(
    module: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """`up` imports the user's module before anything starts; one that loads a model (or hangs) made it print nothing
    at all for as long as that took."""
    import actors.domains._checks as checks

    monkeypatch.setattr(checks, "_SLOW_IMPORT_S", 0.2)
    slow = module.parent / f"{module.stem}_slow.py"
    slow.write_text("import time\ntime.sleep(1.0)\n" + VERIFIERS)
    spec = module.parent / "spec.yaml"
    spec.write_text(SPEC.replace("VERIFIER", f"{slow.stem}:plain").replace("CONFIG", "{}"))
    load_spec(spec, starting=True)
    assert f"importing {slow.stem} (domain reverse's verifier) has taken 0.2 s so far" in capfd.readouterr().err
