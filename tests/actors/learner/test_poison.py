"""A `scored` group no producer of this policy could have sent — token ids past its vocabulary, per-token lists
of different lengths, a reward outside [0, 1] — is dead-lettered with the reason; the learner keeps training."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from tests.actors.learner._helpers import effective_applied, running_learner, scored, wait_until, write_spec
from topology.bus import DEADLETTER, EmbeddedNats

pytestmark = pytest.mark.anyio

LEARNER = "    batch_size: 8\n    checkpoint_every_steps: 1\n    eval_every_steps: 0\n    fill_wait_s: 0\n"


def _hostile() -> dict[str, dict[str, Any]]:
    """Groups that pass the payload's JSON shape but that no generator of the tiny policy produces."""
    past_vocab = scored("arithmetic", [0.0, 1.0, 1.0, 0.0])
    past_vocab["completions"][1]["token_ids"][0] = 10**9
    prompt_past_vocab = scored("arithmetic", [0.0, 1.0, 1.0, 0.0])
    prompt_past_vocab["prompt_ids"][0] = 101
    negative = scored("arithmetic", [0.0, 1.0, 1.0, 0.0])
    negative["completions"][0]["token_ids"][0] = -3
    misaligned = scored("arithmetic", [0.0, 1.0, 1.0, 0.0])
    misaligned["completions"][2]["logprobs"] = [-1.0]
    huge_reward = scored("arithmetic", [0.0, 1.0, 1.0, 0.0])
    huge_reward["completions"][0]["reward"] = 1e308
    return {
        "past_vocab": past_vocab,
        "prompt_past_vocab": prompt_past_vocab,
        "negative": negative,
        "misaligned": misaligned,
        "huge_reward": huge_reward,
    }


async def test_groups_no_generator_could_send_are_dead_lettered_and_training_goes_on(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, LEARNER)
    hostile = _hostile()
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
        for name, payload in hostile.items():
            await bus.publish("scored", "scored", payload, id=f"hostile-{name}")
        for i in range(2):  # one batch of good groups after them
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 1.0, 0.0]), id=f"good-{i}")
        await wait_until(lambda: actor.ctx.counters.get("last_checkpoint_step") == 1)
        reasons: dict[str, str] = {}
        with anyio.fail_after(30):
            async with bus.consume(DEADLETTER, "inspect") as letters:
                async for letter in letters:
                    await letter.ack()
                    raw = orjson.loads(letter.payload["raw"])
                    reasons[raw["id"]] = letter.payload["reason"]
                    if len(reasons) == len(hostile):
                        break
        assert actor.step == 1 and "good-0" in actor.intake.ledger and "good-1" in actor.intake.ledger
    assert "1000000000" in reasons["hostile-past_vocab"] and "vocabulary of 101" in reasons["hostile-past_vocab"]
    assert "prompt_ids" in reasons["hostile-prompt_past_vocab"]
    assert "greater than or equal to 0" in reasons["hostile-negative"]
    assert "one entry per token" in reasons["hostile-misaligned"]
    assert "reward" in reasons["hostile-huge_reward"]


async def test_heldout_scores_of_versions_never_published_leave_the_real_round_alone(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """Sixteen held-out scores labelled with versions this learner never published (a foreign client's, or rounds
    of weights a resume rolled back) made the tracker forget the oldest round in progress — the real one — which then
    never completed, so no held-out accuracy was reported again. They are counted and left out now."""
    config = LEARNER.replace("    eval_every_steps: 0\n", "") + "    eval_every_steps: 100\n"
    spec = write_spec(tmp_path, config + "  generator: {engine: torch, device: cpu}\n")
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):

        async def score(message_id: str) -> None:
            payload = scored("arithmetic", [1.0], heldout=True, temperature=0.0)
            await bus.publish("scored", "scored", payload, id=message_id)

        await score("eval-1-t0.r.s")  # the baseline round (version 1), first score
        for i in range(16):
            await score(f"eval-{10**9 + i}-t0.r.s")
        for i in range(1, 8):
            await score(f"eval-1-t{i}.r.s")
        await wait_until(lambda: "heldout_acc.arithmetic" in actor.ctx.counters.snapshot(), timeout_s=30)
        assert actor.ctx.counters.get("heldout_unknown_version") == 16


async def test_tokens_of_a_version_never_published_are_dead_lettered_and_those_from_before_a_crash_train(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """A group whose tokens carried a weight version newer than the learner's (an SGLang or vLLM server left running by
    another run reports that run's version) was trained on, its staleness negative. After a crash the learner numbers
    on past every version it published (a generator may still hold one its checkpoint predates): tokens of such a
    version train; tokens of a version it never published are dead-lettered with the reason and counted."""
    config = LEARNER.replace("checkpoint_every_steps: 1", "checkpoint_every_steps: 100")
    spec = write_spec(tmp_path, config + "    max_staleness: 100\n    publish_min_interval_s: 0\n")
    run_dir = tmp_path / "run"
    async with running_learner(spec, embedded_nats.url, run_dir, crash=True) as (actor, bus):
        for i in range(4):  # two steps, each published; the only checkpoint is the start's (version 0)
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 1.0, 0.0]), id=f"before-{i}")

        async def announced() -> bool:  # the version is counted before its publish is announced on the bus
            return actor.step == 2 and await actor.weights_out.newest() == 3

        await wait_until(announced)  # a crash before v3 is announced leaves it to the next life (no generator has it)
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):
        assert actor.step == 0 and actor.version == 4  # past v3, which generators may still hold
        for i in range(2):  # from a generator still holding v3, published before the crash
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 1.0, 0.0], versions=3), id=f"v3-{i}")
        foreign = scored("arithmetic", [0.0, 1.0, 1.0, 0.0], versions=[4, 57])
        await bus.publish("scored", "scored", foreign, id="foreign")
        # the groups of before the crash come back (no checkpoint covered them) and train again, with the v3 ones
        await wait_until(lambda: actor.ctx.counters.get("groups_applied") == 6)
        with anyio.fail_after(30):
            async with bus.consume(DEADLETTER, "inspect") as letters:
                async for letter in letters:
                    await letter.ack()
                    if orjson.loads(letter.payload["raw"])["id"] == "foreign":
                        reason = letter.payload["reason"]
                        break
        assert actor.ctx.counters.get("unpublished_version") == 1
    # the learner's newest version when it looked: v4, or past it if the v3 groups made a step before the foreign one
    newest = re.search(r"has published \(v(\d+)\)", reason)
    assert "version 57" in reason and newest is not None and 4 <= int(newest.group(1)) < 57
    assert sorted(effective_applied(run_dir)) == [*(f"before-{i}" for i in range(4)), "v3-0", "v3-1"]
