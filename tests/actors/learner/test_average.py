"""The learner's weight average (`ema_decay`): how it follows the weights, what a held-out round measures with it,
how it survives a restart, and what the export at stop holds."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import polars as pl
import pytest
import torch
from safetensors.torch import load_file

from actors.learner import read_metrics
from actors.learner._average import WeightAverage
from actors.policy import Policy
from tests.actors.learner._helpers import TINY, running_learner, score_round, scored, wait_until, write_spec
from topology.bus import EmbeddedNats


def tiny_policy() -> Policy:
    import yaml

    return Policy.from_spec({"model": "builtin:tiny-gpt", "config": yaml.safe_load(TINY)}, device="cpu")


def test_the_average_follows_the_weights_by_its_ramped_decay() -> None:
    policy = tiny_policy()
    average = WeightAverage(policy, 0.98)
    assert [round(average.decay_at(n), 4) for n in (1, 2, 10, 100, 1000)] == [0.1818, 0.25, 0.55, 0.9182, 0.98]
    start = {name: t.clone() for name, t in policy.state_dict().items()}
    with torch.no_grad():
        for p in policy.weights.parameters():
            p.add_(1.0)  # the live weights move by 1 everywhere
    average.update()
    for name, value in average.policy.state_dict().items():  # 1 - 2/11 of the way there, at the first update
        torch.testing.assert_close(value, start[name] + (1 - 2 / 11))
    for _ in range(200):
        average.update()
    for name, value in average.policy.state_dict().items():
        torch.testing.assert_close(value, start[name] + 1.0)
    with torch.no_grad():
        for p in policy.weights.parameters():
            p.sub_(1.0)
    average.updates = 500  # past the ramp: one update moves the average by 1 - decay
    average.update()
    for name, value in average.policy.state_dict().items():
        torch.testing.assert_close(value, start[name] + 0.98)
    average.reset()
    assert average.updates == 0
    for name, value in average.policy.state_dict().items():
        torch.testing.assert_close(value, start[name])
    assert all(not p.requires_grad for p in average.policy.weights.parameters())


def test_a_decay_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"decay in \(0, 1\)"):
        WeightAverage(tiny_policy(), 1.0)


def learner(extra: str = "", *, rounds: bool = False) -> str:
    """A learner block; ``rounds``: with a generator block, so that the learner publishes held-out prompts."""
    return (
        "    batch_size: 8\n    checkpoint_every_steps: 1\n    fill_wait_s: 0\n    metrics_flush_s: 0.2\n"
        f"    max_staleness: 100\n    publish_min_interval_s: 0\n{extra}"
        + ("  generator: {engine: torch, device: cpu}\n" if rounds else "")
    )


def publishes(run_dir: Path) -> pl.DataFrame:
    rows = read_metrics(run_dir, "lifecycle")
    return rows.filter(pl.col("event") == "publish").sort("ts").select("step", "version", "weights")


@pytest.mark.anyio
async def test_a_round_measures_the_average_and_no_other_version_goes_out_until_it_is_scored(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, learner("    eval_every_steps: 3\n    ema_decay: 0.9\n", rounds=True))
    run_dir = tmp_path / "run"

    async def steps(first: int, n: int) -> None:
        for i in range(first, first + 2 * n):  # two groups of 4 make a batch of 8
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=f"g{i}")

    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):
        assert actor.version == 1 and actor.report()["eval_out"] == 8  # the baseline round: the current weights
        await score_round(actor, bus, 1)
        await steps(0, 3)  # versions 2, 3, 4 of the steps, then the average (5) for the round labelled with it
        await wait_until(lambda: actor.step == 3 and actor.report()["eval_out"] == 8)
        assert actor.version == 5
        assert actor.average is not None and actor.average.updates == 3
        await steps(6, 2)  # two more steps while the round is out: the generators keep the average
        await wait_until(lambda: actor.step == 5)
        await anyio.sleep(0.3)
        assert actor.version == 5
        await score_round(actor, bus, 5)  # the round is in: the weights held back go out at once, no step needed
        await wait_until(lambda: actor.version == 6)
        assert actor.step == 5
        await steps(10, 1)  # the next step publishes its weights, then the next round's average
        await wait_until(lambda: actor.step == 6 and actor.version == 8)
        live = actor.policy.state_dict()
        assert any(not torch.equal(v, live[k]) for k, v in actor.average.policy.state_dict().items())  # it lags
        average = {k: v.clone() for k, v in actor.average.policy.state_dict().items()}
    rows = publishes(run_dir).rows()
    assert rows == [
        (0, 1, "current"),
        (1, 2, "current"),
        (2, 3, "current"),
        (3, 4, "current"),
        (3, 5, "average"),
        (5, 6, "current"),
        (6, 7, "current"),
        (6, 8, "average"),
    ]
    eval_rows = read_metrics(run_dir, "eval").sort("ts")
    assert eval_rows["version"].to_list() == [1, 5]  # each round under the version its prompts were decoded with
    exported = load_file(str(run_dir / "export" / "model.safetensors"))
    assert json.loads((run_dir / "export" / "flywheel.json").read_text())["weights"] == "average"
    for name, value in average.items():  # the export is the average the rounds measured
        torch.testing.assert_close(exported[name], value)


@pytest.mark.anyio
async def test_a_round_due_while_the_previous_one_is_out_waits_for_its_scores(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """Rounds that overlapped would each publish an average and hold the current weights back for as long as they kept
    overlapping: the generators would train on averages only. A round due meanwhile goes out once the one out is
    scored, with the learner idle (not only at its next step)."""
    spec = write_spec(tmp_path, learner("    eval_every_steps: 1\n    ema_decay: 0.9\n", rounds=True))

    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
        await score_round(actor, bus, 1)
        for i in range(6):  # three steps: the first sends a round out (its version 2, the average 3), two more wait
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=f"g{i}")
        await wait_until(lambda: actor.step == 3)
        await anyio.sleep(0.3)
        assert actor.version == 3 and actor.report()["eval_out"] == 8 and actor.ctx.counters.get("eval_rounds") == 2
        await score_round(actor, bus, 3)  # scored: the weights held back and the round that was due go out at once
        # eval_out counts a round's prompts from before its publish is acked (a source must not count them as
        # training meanwhile), eval_rounds once it is: wait for both
        await wait_until(
            lambda: (
                actor.version == 5 and actor.report()["eval_out"] == 8 and actor.ctx.counters.get("eval_rounds") == 3
            )
        )
        assert actor.step == 3
        for i in range(6, 8):  # a step while that round is out: no version, and the round it makes due waits
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=f"g{i}")
        await wait_until(lambda: actor.step == 4)
        await anyio.sleep(0.3)
        assert actor.version == 5 and actor.report()["eval_out"] == 8 and actor.ctx.counters.get("eval_rounds") == 3


@pytest.mark.anyio
async def test_the_average_survives_a_crash_and_starts_over_from_a_checkpoint_without_one(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    spec = write_spec(tmp_path, learner("    eval_every_steps: 0\n    ema_decay: null\n"), name="avg-resume")
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):
        assert actor.average is None
        for i in range(2):
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=f"g{i}")
        await wait_until(lambda: actor.step == 1 and actor.ctx.counters.get("last_checkpoint_step") == 1)
    average = learner("    eval_every_steps: 0\n    ema_decay: 0.9\n")  # the same run, now with an average
    spec = write_spec(tmp_path, average, name="avg-resume")
    async with running_learner(spec, embedded_nats.url, run_dir, crash=True) as (actor, bus):
        assert actor.step == 1 and actor.average is not None and actor.average.updates == 0
        for name, value in actor.average.policy.state_dict().items():  # started over from the restored weights
            assert torch.equal(value, actor.policy.state_dict()[name])
        for i in range(2, 6):
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=f"g{i}")
        await wait_until(lambda: actor.step == 3 and actor.ctx.counters.get("last_checkpoint_step") == 3)
        saved = {k: v.clone() for k, v in actor.average.policy.state_dict().items()}
        assert actor.average.updates == 2
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):  # killed after the checkpoint
        assert actor.step == 3 and actor.average is not None and actor.average.updates == 2
        for name, value in actor.average.policy.state_dict().items():
            assert torch.equal(value, saved[name])
        assert any(not torch.equal(v, actor.policy.state_dict()[k]) for k, v in saved.items())
