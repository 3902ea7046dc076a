"""The whole system killed and resumed: `flywheel up` of the learning loop (source → generator → verify → learner, a
tiny GPT, real processes), SIGKILL of its process group mid-run, then `flywheel up --resume`.

The properties, read from what the run leaves on disk: nothing the learner applied is applied twice (its audit
trail, lineage by lineage), its steps continue from the checkpoint it resumed from, and weight versions continue
past every version published before the kill — generators never see a version number twice.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from actors.learner import read_metrics
from tests.actors.learner._helpers import effective_applied
from tests.test_loop import SPEC

ROOT = Path(__file__).resolve().parents[1]


def up(cwd: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "topology.cli", "up", "--every", "1", *args],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )


def learner_counters(run_dir: Path) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "topology.cli", "status", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        return {}
    rows = [r for r in doc.get("replicas", []) if r["actor"] == "learner" and r["state"] == "running"]
    return dict(rows[0]["counters"]) if doc.get("live") and rows else {}


def wait_learner(run_dir: Path, ok: Any, timeout_s: float = 150) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counters = learner_counters(run_dir)
        if counters and ok(counters):
            return counters
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for the learner in {run_dir}")


def refused_resume(spec: Path, run_dir: Path) -> str:
    """`flywheel up SPEC --resume RUN_DIR` refused before anything started: its one error line (which says how to
    start a new run instead), no traceback, no replica started."""
    result = subprocess.run(
        [sys.executable, "-m", "topology.cli", "up", str(spec), "--resume", str(run_dir), "--duration", "5"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=90,
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr
    assert "start a new run: flywheel up" in errors[0] and "Traceback" not in result.stderr, errors[0]
    assert not list((run_dir / "logs").iterdir())  # no replica started
    return errors[0]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sigkill_of_the_whole_loop_then_resume_applies_nothing_twice_and_versions_continue(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("MODE", "async"))
    first = up(tmp_path, str(spec))
    try:
        run_dir = (tmp_path / "runs" / "latest").resolve()
        for _ in range(600):
            if (run_dir / "run.json").exists():
                break
            time.sleep(0.2)
            run_dir = (tmp_path / "runs" / "latest").resolve()
        # past a checkpoint (every 5 steps) and some steps beyond it, whose effect the kill rolls back
        before = wait_learner(run_dir, lambda c: c.get("phase") == "rl" and c.get("step", 0) >= 7)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    time.sleep(1)  # every replica dies with the supervisor (PR_SET_PDEATHSIG)
    second = up(tmp_path, "--resume", str(run_dir))
    try:
        after = wait_learner(
            run_dir, lambda c: c.get("phase") == "rl" and c.get("step", 0) >= before["step"] + 5 and c["version"] > 0
        )
    finally:
        second.send_signal(signal.SIGINT)
        assert second.wait(120) == 0
    info = json.loads((run_dir / "run.json").read_text())
    assert info["resumes"] == 1 and info["exit"] == "ok"
    resumes = read_metrics(run_dir, "lifecycle").filter(event="resume")
    steps = read_metrics(run_dir, "step").sort("ts")
    # from a checkpoint the first life wrote (every 5 steps, or sooner when groups without signal pile up unacked):
    # a learner writes its step rows before each checkpoint, so the first life's rows reach the step resumed from
    assert resumes.height == 1 and resumes["step"].item() > 0
    # when its checkpoint's state was taken: the audit trail's cut (groups consumed at that step after it, rolled back)
    assert resumes["checkpoint_ts"].item() is not None
    first_life = steps.filter(steps["incarnation"] != resumes["incarnation"].item())
    assert resumes["step"].item() in first_life["step"].to_list()
    ids = effective_applied(run_dir)
    assert ids and not [mid for mid, n in Counter(ids).items() if n > 1]  # nothing applied twice
    assert after["version"] > before["version"]
    versions = steps["version"].to_list()
    assert versions == sorted(versions)  # never back, across the kill and the resume


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (("n_embd: 32", "n_embd: 48"), "policy.config.n_embd: 32 → 48"),
        (
            (
                "model: builtin:tiny-gpt\n  config: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2, seed: 0}",
                "model: hf:./hf",
            ),
            'policy.model: "builtin:tiny-gpt" → "hf:./hf"',
        ),
    ],
)
def test_a_resume_with_another_model_is_refused_before_anything_starts(
    tmp_path: Path, edit: tuple[str, str], key: str
) -> None:
    """The run's checkpoints hold the weights of the model it started with: a learner restoring them into another
    shape crashed at every restart, and one with another tokenizer would train its weights on other token ids."""
    from actors.policy import write_tiny_hf_model
    from topology import load_spec
    from topology.runtime._rundir import RunInfo, create_run_dir, write_run_info

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("MODE", "async"))
    run_dir = create_run_dir(tmp_path / "runs", "loop-test")
    data = load_spec(spec).data
    assert data is not None
    info = RunInfo("loop-test", "nats://127.0.0.1:1", 1, str(spec), 0.0, 1.0, spec=dict(data), exit="ok")
    write_run_info(run_dir, info)
    write_tiny_hf_model(tmp_path / "hf")
    spec.write_text(SPEC.replace("MODE", "async").replace(*edit))
    assert key in refused_resume(spec, run_dir)


def test_how_the_model_runs_may_change_on_resume_what_it_is_may_not(tmp_path: Path) -> None:
    """`policy.config.native_forward` picks which forward runs inference, not what the weights are: a resume with it
    changed goes on (and says so), while another n_embd is refused."""
    import actors  # noqa: F401 — registers the policy section and the keys it fixes
    from topology.runtime._evolve import ResumeRefused, check_resumable, describe_changes

    def policy(**config: Any) -> dict[str, Any]:
        return {"name": "t", "policy": {"model": "hf:./m", "config": {"dtype": "float32", **config}}}

    before = policy(native_forward=True)
    changes = check_resumable(tmp_path, "t", before, spec_path=None, name="t", after=policy(native_forward=False))
    assert describe_changes(changes) == "policy.config.native_forward: true → false"
    with pytest.raises(ResumeRefused, match=r"policy\.config\.dtype: \"float32\" → \"bfloat16\""):
        check_resumable(
            tmp_path, "t", before, spec_path=None, name="t", after=policy(native_forward=True, dtype="bfloat16")
        )


def test_what_only_draws_or_uses_the_weights_may_change_on_resume_what_shapes_them_may_not(tmp_path: Path) -> None:
    """Each key of `policy.config` is judged by what it means to the run's weights: another `seed` (which draws a
    fresh model's first weights) or `block_size` (the longest sequence the model is used with) goes on, logged as a
    change; another `n_layer` is refused, naming the key and why. Every key either kind of model takes is judged."""
    import actors  # noqa: F401 — registers the policy section and the keys it fixes
    from actors.policy._gpt_config import BUILTIN_CONFIG_KEYS, CONFIG_ON_RESUME, HF_CONFIG_KEYS
    from topology.runtime._evolve import ResumeRefused, check_resumable, describe_changes

    def policy(**config: Any) -> dict[str, Any]:
        spec: dict[str, Any] = {"name": "t", "policy": {"model": "builtin:tiny-gpt"}}
        return {**spec, "policy": {**spec["policy"], "config": config}} if config else spec

    def resume(before: dict[str, Any], after: dict[str, Any]) -> str:
        return describe_changes(check_resumable(tmp_path, "t", before, spec_path=None, name="t", after=after))

    before = policy(preset="tiny", seed=0, block_size=256)
    after = policy(preset="tiny", seed=1, block_size=512)
    assert resume(before, after) == "policy.config.seed: 0 → 1; policy.config.block_size: 256 → 512"
    assert resume(policy(seed=3), policy()) == "policy.config: removed"  # the whole config, key by key: a seed
    with pytest.raises(ResumeRefused) as refused:
        resume(before, policy(preset="tiny", seed=0, block_size=256, n_layer=2))
    message = str(refused.value)
    assert (
        "policy.config.n_layer changed since the run last started (policy.config.n_layer: 5 → 2; as the spec writes "
        "it: policy.config.n_layer: added (2))"
    ) in message
    assert "the run's checkpoints hold weights of the shape it gives the model" in message
    assert set(CONFIG_ON_RESUME) == {*BUILTIN_CONFIG_KEYS, *HF_CONFIG_KEYS}


def test_a_builtin_config_is_compared_on_resume_by_the_model_it_makes_not_by_its_keys(tmp_path: Path) -> None:
    """A run started with no `preset` (which is `preset: tiny`), or with a preset's sizes written out, was refused
    when the spec then wrote the same model the other way (`policy.config.preset: added`): the keys were compared, not
    the model they make. Now the resolved config is: the same model resumes (the change is logged, as the spec
    wrote it), another one is refused at the key whose value differs, saying what the spec changed. The spec of a run
    recorded before any record was kept reads the same way."""
    import actors  # noqa: F401 — registers the policy section, its keys and its view
    from actors.policy._gpt_config import PRESETS
    from topology.runtime._evolve import ResumeRefused, check_resumable, describe_changes

    def policy(model: str = "builtin:tiny-gpt", **config: Any) -> dict[str, Any]:
        return {"name": "t", "policy": {"model": model, **({"config": config} if config else {})}}

    def resume(before: dict[str, Any], after: dict[str, Any]) -> str:
        return describe_changes(check_resumable(tmp_path, "t", before, spec_path=None, name="t", after=after))

    tiny = PRESETS["tiny"]
    assert resume(policy(), policy(preset="tiny")) == "policy.config: added"  # logged as the spec wrote it
    assert resume(policy(seed=0), policy(seed=0, preset="tiny")) == 'policy.config.preset: added ("tiny")'
    assert resume(policy(preset="tiny"), policy(**tiny, dtype="float32")) == (
        'policy.config.preset: "tiny" → unset (the default); policy.config.n_layer: added (5); '
        'policy.config.n_head: added (4); policy.config.n_embd: added (128); policy.config.dtype: added ("float32")'
    )
    assert resume(policy(**tiny), policy(preset="small", **tiny)) == 'policy.config.preset: added ("small")'
    assert resume(policy("hf:./m"), policy("hf:./m", dtype="float32")) == "policy.config: added"
    with pytest.raises(ResumeRefused) as refused:
        resume(policy(preset="tiny"), policy(preset="small"))
    assert (
        "policy.config.n_layer changed since the run last started (policy.config.n_layer: 5 → 6; "
        'as the spec writes it: policy.config.preset: "tiny" → "small")'
    ) in str(refused.value)
    with pytest.raises(ResumeRefused, match=r"policy\.config\.n_embd: 128 → 64"):
        resume(policy(), policy(preset="tiny", n_embd=64))
    with pytest.raises(ResumeRefused, match=r"policy\.config\.dtype: \"float32\" → \"bfloat16\""):
        resume(policy(preset="tiny"), policy(dtype="bfloat16"))


def test_a_builtin_config_that_resolves_to_other_weights_than_recorded_is_refused(tmp_path: Path) -> None:
    """The run records what its builtin config resolved to when it started: a spec that reads the same but stands for
    other weights now (a preset or default redefined by another flywheel) is refused at the key, before the learner
    would crash-loop restoring its checkpoint; the same weights resume, and so does a run recorded without one."""
    import actors  # noqa: F401 — registers the policy section and its record
    from topology import load_spec
    from topology.runtime._evolve import ResumeRefused, check_records, section_records

    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC.replace("MODE", "async"))
    spec = load_spec(spec_path)
    records = section_records(spec)
    assert records["policy"]["builtin_config"] == {
        "vocab_size": 101, "block_size": 512, "n_layer": 1, "n_head": 2, "n_embd": 32, "rope_theta": 10000.0,
        "dtype": "float32",
    }  # fmt: skip
    assert check_records(tmp_path, records, spec) == [] and check_records(tmp_path, {"policy": {}}, spec) == []
    records["policy"]["builtin_config"]["n_layer"] = 2
    with pytest.raises(ResumeRefused, match=r"policy\.config\.n_layer is 1 as the spec resolves now, 2 when the run"):
        check_records(tmp_path, records, spec)


@pytest.mark.timeout(120)
def test_a_model_directory_replaced_under_the_same_path_is_refused_on_resume(tmp_path: Path) -> None:
    """`policy.model: hf:./hf` reads the same after the directory was replaced by another model: the resume passed
    the spec check, and the learner crash-looped restoring its checkpoint into the new shape. The run records a hash
    of the model's config.json at every start; a resume whose model differs is refused, naming the key and the
    directory. The same model (saved again by another transformers, too), or a run recorded before records were kept,
    resumes."""
    from actors.policy import write_tiny_hf_model
    from topology import load_spec
    from topology.runtime._evolve import check_records, section_records
    from topology.runtime._rundir import RunInfo, create_run_dir, write_run_info

    spec_path = tmp_path / "spec.yaml"
    text = SPEC.replace("MODE", "async").replace(
        "model: builtin:tiny-gpt\n  config: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2, seed: 0}",
        "model: hf:./hf",
    )
    spec_path.write_text(text)
    write_tiny_hf_model(tmp_path / "hf", n_embd=64)
    spec = load_spec(spec_path)
    run_dir = create_run_dir(tmp_path / "runs", "loop-test")
    records = section_records(spec)
    assert records["policy"]["model_dir"] == str(tmp_path / "hf")
    assert check_records(run_dir, records, spec) == [] and check_records(run_dir, None, spec) == []
    config_file = tmp_path / "hf" / "config.json"
    saved_again = dict(reversed(json.loads(config_file.read_text()).items()), transformers_version="99.0.0")
    config_file.write_text(json.dumps(saved_again, indent=4))  # the same model saved again by another transformers
    assert check_records(run_dir, records, spec) == []
    assert spec.data is not None
    info = RunInfo("loop-test", "nats://127.0.0.1:1", 1, str(spec_path), 0.0, 1.0, spec=dict(spec.data), exit="ok")
    info.records = records
    write_run_info(run_dir, info)
    shutil.rmtree(tmp_path / "hf")
    write_tiny_hf_model(tmp_path / "hf", n_embd=32)
    error = refused_resume(spec_path, run_dir)
    assert f"policy.model is another model than the run started with: the config.json in {tmp_path / 'hf'}" in error


@pytest.mark.timeout(120)
def test_a_tokenizer_replaced_under_the_same_path_is_refused_on_resume(tmp_path: Path) -> None:
    """Another tokenizer's files put in the model's directory (or in `policy.tokenizer`'s) left the spec and the
    config.json as they were: the resume went on, and the checkpoint's weights trained on other token ids. The run
    records a hash of the tokenizer's vocabulary at every start; a resume whose token ids or special tokens differ is
    refused, naming the key and the directory. The same tokenizer saved again resumes."""
    from actors.policy import write_tiny_hf_model
    from topology import load_spec
    from topology.runtime._evolve import ResumeRefused, check_records, section_records
    from topology.runtime._rundir import RunInfo, create_run_dir, write_run_info

    tokenizer_files = ("tokenizer.json", "tokenizer_config.json")
    write_tiny_hf_model(tmp_path / "hf", n_embd=64)
    write_tiny_hf_model(tmp_path / "other", n_embd=64, bos=True)  # a <bos> token: every other id moves by one
    (tmp_path / "tok").mkdir()
    for name in tokenizer_files:
        shutil.copy(tmp_path / "hf" / name, tmp_path / "tok" / name)
    model = "model: builtin:tiny-gpt\n  config: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2, seed: 0}"
    spec_path, separate_path = tmp_path / "spec.yaml", tmp_path / "separate.yaml"
    spec_path.write_text(SPEC.replace("MODE", "async").replace(model, "model: hf:./hf"))
    separate_path.write_text(SPEC.replace("MODE", "async").replace(model, "model: hf:./hf\n  tokenizer: ./tok"))
    spec, separate = load_spec(spec_path), load_spec(separate_path)
    records, separate_records = section_records(spec), section_records(separate)
    assert records["policy"]["tokenizer_dir"] == str(tmp_path / "hf")
    assert separate_records["policy"]["tokenizer_dir"] == str(tmp_path / "tok")
    config = tmp_path / "hf" / "tokenizer_config.json"
    kept = config.read_text()
    config.write_text(kept.replace('"eos_token": "<eos>"', '"eos_token": "<pad>"'))  # another eos id, same vocabulary
    with pytest.raises(ResumeRefused, match=r"policy\.model has another tokenizer than the run started with"):
        check_records(tmp_path, records, spec)
    config.write_text(kept)
    for name in tokenizer_files:
        shutil.copy(tmp_path / "other" / name, tmp_path / "tok" / name)
    with pytest.raises(ResumeRefused) as refused:
        check_records(tmp_path, separate_records, separate)
    assert (
        f"policy.tokenizer has another tokenizer than the run started with: the vocabulary in {tmp_path / 'tok'}"
        in (str(refused.value))
    )
    assert check_records(tmp_path, records, spec) == []  # the model's own tokenizer is the one it started with
    run_dir = create_run_dir(tmp_path / "runs", "loop-test")
    assert spec.data is not None
    info = RunInfo("loop-test", "nats://127.0.0.1:1", 1, str(spec_path), 0.0, 1.0, spec=dict(spec.data), exit="ok")
    info.records = records
    write_run_info(run_dir, info)
    for name in tokenizer_files:
        shutil.copy(tmp_path / "other" / name, tmp_path / "hf" / name)
    error = refused_resume(spec_path, run_dir)
    assert f"policy.model has another tokenizer than the run started with: the vocabulary in {tmp_path / 'hf'}" in error


@pytest.mark.timeout(120)
def test_policy_tokenizer_is_judged_on_resume_by_the_vocabulary_it_names_not_by_its_text(tmp_path: Path) -> None:
    """A run started without `policy.tokenizer` was refused on resume once the spec named the model's own directory
    there (the same tokenizer, written out): the key was fixed by its text. It is judged by the vocabulary it names:
    the model's own directory or a copy of its tokenizer resumes (the change is logged), another vocabulary is
    refused; where no vocabulary can be read (a model that is not on this machine), its text is compared still."""
    import actors  # noqa: F401 — registers the policy section
    from actors.policy import write_tiny_hf_model
    from actors.policy._fingerprint import record_policy, resume_policy
    from actors.protocol import PolicySpec
    from topology import ResumeConflict, load_spec
    from topology.runtime._evolve import (
        ResumeRefused,
        check_records,
        check_resumable,
        describe_changes,
        section_records,
    )

    write_tiny_hf_model(tmp_path / "hf", n_embd=64)
    write_tiny_hf_model(tmp_path / "other", n_embd=64, bos=True)  # a <bos> token: every other id moves by one
    for name, source in (("tok", "hf"), ("tok-other", "other")):
        (tmp_path / name).mkdir()
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tmp_path / source / file, tmp_path / name / file)
    model = "model: builtin:tiny-gpt\n  config: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2, seed: 0}"

    def spec_with(tokenizer: str | None) -> Any:
        path = tmp_path / f"spec-{tokenizer or 'none'}.yaml".replace("/", "")
        written = "model: hf:./hf" + (f"\n  tokenizer: {tokenizer}" if tokenizer else "")
        path.write_text(SPEC.replace("MODE", "async").replace(model, written))
        return load_spec(path)

    first = spec_with(None)
    records = section_records(first)
    assert records["policy"]["tokenizer"] is None
    for tokenizer in ("./hf", "hf", "./tok"):
        later = spec_with(tokenizer)
        changes = check_resumable(tmp_path, "loop-test", first.data, spec_path=None, name="loop-test", after=later.data)
        assert describe_changes(changes) == f'policy.tokenizer: added ("{tokenizer}")'
        assert check_records(tmp_path, records, later) == []
    with pytest.raises(ResumeRefused, match=r"policy\.tokenizer has another tokenizer than the run started with"):
        check_records(tmp_path, records, spec_with("./tok-other"))

    missing, absent = f"hf:{tmp_path / 'missing'}", str(tmp_path / "absent")  # a model and tokenizer not here
    elsewhere = {"tokenizer": absent}  # what such a model records: no directory, no vocabulary
    assert record_policy(("policy",), PolicySpec(model=missing, tokenizer=absent)) == elsewhere
    assert resume_policy(("policy",), elsewhere, PolicySpec(model=missing, tokenizer=absent)) == []
    with pytest.raises(ResumeConflict) as refused:
        resume_policy(("policy",), elsewhere, PolicySpec(model=missing))
    assert f"policy.tokenizer changed since the run last started ({absent!r} → None)" in str(refused.value)
