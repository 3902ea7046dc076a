"""Replay: reproduces a recorded run at its version, is deterministic with a seed, shows other versions differ."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pytest
import torch

from actors.policy import Policy
from actors.protocol import VERIFIER_ERROR
from actors.replay import (
    Outcome,
    Replayer,
    ReplayRun,
    build_report,
    load_items,
    mean_reward,
    resolve_weights,
    write_report,
)
from actors.replay._run import TEXT_ONLY
from tests.actors.replay._support import PROMPTS, other_weights, record_run, replay_spec
from topology import load_spec
from topology.bus import EmbeddedNats

pytestmark = pytest.mark.anyio


async def test_replay_at_the_recorded_version_reproduces_the_verifier_outcomes(tmp_path: Path) -> None:
    spec = replay_spec(tmp_path)
    await record_run(spec, tmp_path, version=1)
    items = load_items(tmp_path / "recordings")
    assert len(items) == len(PROMPTS) and all(i.verifier_fields for i in items)
    weights = await resolve_weights("v1", run_dir=tmp_path)
    async with Replayer(spec) as replayer:
        run = await replayer.run(items, weights.state_dict, label=weights.label, version=1, concurrency=5)
    report = build_report(items, run, seed=0)
    row = report["domains"]["echo"]
    assert row["agreement"] == 1.0 and row["text_match"] == 1.0
    assert row["recorded_mean_reward"] == row["replayed_mean_reward"] == 1.0


async def test_code_is_rescored_under_the_limits_of_the_specs_verify_actor(tmp_path: Path) -> None:
    # a correct answer that needs more memory than the spec's sandbox allows failed in the run: replayed, it must fail
    # the same way, or the report shows an outcome "changed" by the replay's own limits rather than by the weights
    fields = {"tests": "assert f(1) == 2"}
    (tmp_path / "code.jsonl").write_text(orjson.dumps({"prompt": "f(x) = x+1", "verifier_fields": fields}).decode())
    path = tmp_path / "spec.yaml"
    path.write_text(
        "name: rp-limits\npolicy: {model: builtin:tiny-gpt, config: {n_layer: 1, n_head: 2, n_embd: 32}}\n"
        "domains:\n  code: {source: 'jsonl:code.jsonl', verifier: python-tests, heldout: 0}\n"
        "actors:\n  verify: {sandbox: {workers: 1, memory_mb: 64}}\nchannels:\n  rollouts: {external: true}\n"
    )
    answer = "block = bytearray(160 << 20)\ndef f(x):\n    return x + 1\n"
    async with Replayer(load_spec(path)) as replayer:
        assert replayer._scorer is not None
        result = await replayer._scorer.score("code", answer, fields)
        assert (result.verdict, result.reward) == ("memory_limit", 0.0), result
        assert (await replayer._scorer.score("code", answer.split("\n", 1)[1], fields)).reward == 1.0


async def test_same_weights_and_seed_give_the_same_samples_whatever_the_concurrency(tmp_path: Path) -> None:
    spec = replay_spec(tmp_path)
    await record_run(spec, tmp_path, temperature=1.0)
    items = load_items(tmp_path / "recordings")
    async with Replayer(spec) as replayer:
        first = await replayer.run(items, None, label="initial", version=0, seed=3, concurrency=8)
        again = await replayer.run(items, None, label="initial", version=0, seed=3, concurrency=3)
        other_seed = await replayer.run(items, None, label="initial", version=0, seed=4, concurrency=8)
    texts = [o.text for o in first.outcomes]
    assert texts == [o.text for o in again.outcomes]
    assert [o.reward for o in first.outcomes] == [o.reward for o in again.outcomes]
    assert texts != [o.text for o in other_seed.outcomes]


async def test_another_version_shows_its_difference_in_the_report(tmp_path: Path) -> None:
    spec = replay_spec(tmp_path)
    await record_run(spec, tmp_path, version=1)
    items = load_items(tmp_path / "recordings")
    other = await resolve_weights(str(other_weights(tmp_path / "ckpt" / "other.safetensors")))
    async with Replayer(spec) as replayer:
        raw = await replayer.raw_throughput(items, None, version=1, greedy=True)
        run = await replayer.run(items, None, label="v1", version=1, greedy=True)
        against = await replayer.run(items, other.state_dict, label=other.label, version=-1, greedy=True)
    report = build_report(items, run, against, seed=0, raw=raw)
    row = report["domains"]["echo"]
    assert row["replayed_mean_reward"] == 1.0
    assert row["against_mean_reward"] is not None and row["against_mean_reward"] < 0.5
    assert row["changed_vs_against"] > len(PROMPTS) // 2
    # which samples changed, as the README says: every one in report.json, with both versions' answers
    changed = report["changed"]
    assert len(changed) == row["changed_vs_against"]
    assert all(c["weights"]["verdict"] != c["against"]["verdict"] for c in changed)
    assert {c["prompt"] for c in changed} <= set(PROMPTS)
    assert report["throughput"]["engine_tokens"] == report["throughput"]["replay_tokens"]
    paths = write_report(report, tmp_path / "out")
    assert [p.name for p in paths] == ["report.json", "report.md", "report.png"]
    assert "| echo |" in paths[1].read_text() and paths[2].read_bytes()[:4] == b"\x89PNG"
    assert f"## {len(changed)} samples changed outcome" in paths[1].read_text()
    assert f"| echo | `{changed[0]['prompt']}` | pass: " in paths[1].read_text()


async def test_a_version_only_a_shared_memory_slot_still_holds_is_found_and_copied(tmp_path: Path) -> None:
    import torch

    from actors.replay import WeightsNotFound
    from actors.weights import SharedMemoryTransport, shm_root

    slots = SharedMemoryTransport(shm_root(tmp_path), owner=tmp_path, max_slots=2)
    state = {"w": torch.arange(6.0).view(2, 3), "b": torch.ones(3, dtype=torch.bfloat16)}
    try:
        await slots.put(7, state)
        found = await resolve_weights("v7", run_dir=tmp_path)
        assert found.label == "v7" and found.state_dict is not None
        assert all(torch.equal(found.state_dict[n], state[n]) for n in state)
        for version in (8, 9):  # the learner goes on: v9 is written into v7's slot, the copy stays as it was
            await slots.put(version, {n: t + version for n, t in state.items()})
        assert torch.equal(found.state_dict["w"], state["w"])
        with pytest.raises(WeightsNotFound, match=r"version 7 not found \(searched: .*shared-memory slots"):
            await resolve_weights("v7", run_dir=tmp_path)
    finally:
        slots.close()


async def test_current_and_serving_name_the_live_runs_versions(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    """A small model's learner publishes several versions a second and keeps a few: a number read from `flywheel
    status` was gone by the time `flywheel replay --weights vN` asked (a helper's three tries of three on a live
    service). `current` and `serving` read the weights bucket at the moment of the call."""
    from actors.protocol import SERVING
    from actors.replay import WeightsNotFound
    from actors.weights import SafetensorsDirTransport, WeightPublisher
    from topology.bus import Bus

    spec = replay_spec(tmp_path)
    policy = Policy.from_spec(spec.sections["policy"])
    async with await Bus.connect(embedded_nats.url, topology=spec.name, name="test") as bus:
        with pytest.raises(WeightsNotFound, match=r"^current: the run has no current version yet$"):
            await resolve_weights("current", run_dir=tmp_path, bus=bus)
        publisher = WeightPublisher(bus, spec.name, SafetensorsDirTransport(tmp_path / "weights", keep_versions=5))
        first = await publisher.publish(1, policy.state_dict())
        await publisher.publish(2, {k: v + 1 for k, v in policy.state_dict().items()})
        await publisher.point(first, SERVING)
        current = await resolve_weights("current", run_dir=tmp_path, bus=bus)
        serving = await resolve_weights("serving", run_dir=tmp_path, bus=bus)
    assert (current.label, serving.label) == ("v2", "v1")
    assert current.state_dict is not None and serving.state_dict is not None
    name = next(iter(serving.state_dict))
    assert torch.equal(current.state_dict[name], serving.state_dict[name] + 1)
    with pytest.raises(WeightsNotFound, match=r"^serving: the run is not live"):
        await resolve_weights("serving", run_dir=tmp_path)


def test_the_plot_leaves_a_missing_mean_out_instead_of_drawing_it_as_zero() -> None:
    """A domain with nothing recorded (or nothing scored) has no mean: its bar was drawn at 0, which reads as a mean
    reward of 0."""
    from actors.replay._report import plot_series

    def row(recorded: float | None, replayed: float | None) -> dict[str, float | None]:
        return {"recorded_mean_reward": recorded, "replayed_mean_reward": replayed, "against_mean_reward": None}

    report = {"weights": {"label": "v3"}, "against": None, "domains": {"math": row(0.5, 0.75), "chat": row(None, 0.0)}}
    (recorded, xs, heights, missing), (replayed, xs2, heights2, missing2) = plot_series(report)
    assert (recorded, xs, heights, missing) == ("recorded", [0.0], [0.5], [1.0])
    assert (replayed, xs2, heights2, missing2) == ("v3", [0.4, 1.4], [0.75, 0.0], [])  # a real 0 is drawn


@pytest.mark.filterwarnings("error::UserWarning")
def test_the_plot_makes_room_for_a_long_label(tmp_path: Path) -> None:
    """Weights named by a checkpoint's path gave a legend too wide for the figure: matplotlib warned on the user's
    console that it could not lay the plot out (and squeezed it)."""
    from actors.replay._report import _plot

    def row(value: float) -> dict[str, float | None]:
        return {"recorded_mean_reward": value, "replayed_mean_reward": value, "against_mean_reward": value}

    path = "/home/someone/runs/2026-12-07-a-long-experiment-name/checkpoints/step-000120000/weights.safetensors"
    report = {"weights": {"label": path}, "against": {"label": "v12"}, "domains": {"arithmetic": row(0.5)}}
    _plot(report, tmp_path / "report.png")
    assert (tmp_path / "report.png").stat().st_size > 0


async def test_served_prompts_that_are_no_task_say_so_not_that_the_domain_lacks_a_verifier(tmp_path: Path) -> None:
    """`flywheel replay --from traffic` on the service's recordings noted "no verifier" for the production domain,
    which has one (math): users' prompts that are no row of its file have no answer to check against."""
    spec = replay_spec(tmp_path)
    await record_run(spec, tmp_path, version=1)
    items = load_items(tmp_path / "recordings")
    domain = items[0].domain
    run = ReplayRun("v1", 1, [Outcome(i.key, domain, "", 1, None, TEXT_ONLY) for i in items], len(items), 1.0)
    row = build_report(items, run, seed=0)["domains"][domain]
    assert row["note"] == "prompts that are no task of the domain: compared by text only"


async def test_a_verifier_that_fails_scores_nothing_instead_of_zero(tmp_path: Path) -> None:
    """A verifier error is no answer's outcome: replayed or recorded, it is left out of the means (the gate compares
    them) and of agreement, and counted per domain — a 0 would read as the version answering worse."""
    spec = replay_spec(tmp_path, verifier="broken")
    await record_run(spec, tmp_path, version=1)
    items = load_items(tmp_path / "recordings")
    async with Replayer(spec) as replayer:
        run = await replayer.run(items, None, label="v1", version=1, greedy=True)
    assert {(o.reward, o.verdict) for o in run.outcomes} == {(None, VERIFIER_ERROR)}
    assert mean_reward(run) is None
    row = build_report(items, run, seed=0)["domains"]["echo"]
    assert (row["verifier_errors"], row["scored"], row["replayed_mean_reward"]) == (len(PROMPTS), 0, None)
    assert "the verifier failed on" in row["note"]
    # recorded: a sample the verifier failed on when it was recorded has no outcome to compare with
    ok = dataclasses.replace(items[0], key="ok", recorded_reward=1.0, recorded_verdict="pass")
    failed = dataclasses.replace(items[1], key="failed", recorded_reward=0.0, recorded_verdict=VERIFIER_ERROR)
    good = ReplayRun("v1", 1, [Outcome(k, "echo", "", 1, 1.0, "pass") for k in ("ok", "failed")], 2, 1.0)
    recorded = build_report([ok, failed], good, seed=0)["domains"]["echo"]
    assert (recorded["recorded_mean_reward"], recorded["agreement"]) == (1.0, 1.0)
