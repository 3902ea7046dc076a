"""A learner rides out a bus that stops answering (its nats-server frozen with SIGSTOP): a version due meanwhile waits
for the bus, counted in ``bus_waits``, and goes out once it is back, with no other step needed (a sync-mode source sends
no batch until it sees that version) — it used to crash the learner (the announcement's KV put timed out), which then
redid every step since its last checkpoint."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.actors.learner._helpers import running_learner, score_round, scored, wait_until, write_spec
from topology.bus import EmbeddedNats

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

LEARNER = (
    "    batch_size: 64\n    partial_batch_after_s: 1\n    publish_every_steps: 1\n    checkpoint_every_steps: 1\n"
    "    eval_every_steps: 0\n    fill_wait_s: 0\n"
)


async def test_a_version_due_while_the_bus_is_frozen_waits_for_it_and_training_goes_on(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, LEARNER, ack_wait_s=30.0)
    with EmbeddedNats(tmp_path / "nats") as server:  # its own server: this test freezes it
        assert server.pid is not None
        async with running_learner(spec, server.url, tmp_path / "run") as (actor, bus):
            first = actor.version
            for i in range(2):  # half a batch: trained once it waited partial_batch_after_s
                await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 1.0, 0.0]), id=f"before-{i}")
            await wait_until(lambda: actor.batcher.completions == 8)
            os.kill(server.pid, signal.SIGSTOP)
            try:  # the step comes, its version cannot be announced
                await wait_until(lambda: (actor.ctx.counters.get("bus_waits") or 0) >= 1, timeout_s=60)
                assert actor.step == 1
            finally:
                os.kill(server.pid, signal.SIGCONT)
            # the idle learner tried again: a version of step 1 went out (weights_out.step: the last announced one's)
            await wait_until(lambda: actor.weights_out.step == 1, timeout_s=60)
            assert actor.step == 1 and actor.version > first and await actor.weights_out.newest() == actor.version
            for i in range(2):  # and training goes on
                await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 1.0, 0.0]), id=f"after-{i}")
            await wait_until(lambda: actor.step == 2 and actor.version > first + 1, timeout_s=60)
            assert await actor.weights_out.newest() == actor.version


async def test_a_heldout_round_due_while_the_bus_is_frozen_goes_out_after_it(tmp_path: Path) -> None:
    """The round (its average's weights first, then its prompts) cannot go out while the bus is frozen: it stays due
    and goes out once the bus is back, the learner idle — it used to crash the learner like the version did."""
    config = LEARNER.replace("    eval_every_steps: 0\n", "    eval_every_steps: 1\n") + (
        "  generator: {engine: torch, device: cpu}\n"  # with a generator, the learner publishes held-out prompts
    )
    spec = write_spec(tmp_path, config, ack_wait_s=30.0)
    with EmbeddedNats(tmp_path / "nats") as server:
        assert server.pid is not None
        async with running_learner(spec, server.url, tmp_path / "run") as (actor, bus):
            js = bus.nc.jetstream()

            async def published_is(n: int) -> bool:
                return int((await js.stream_info(bus.stream("prompts"))).state.messages) == n

            assert await published_is(8)  # the baseline round: 8 held-out tasks
            await score_round(actor, bus, 1)  # the baseline round scored: the first step need not wait for it
            for i in range(2):
                await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 1.0, 0.0]), id=f"before-{i}")
            await wait_until(lambda: actor.batcher.completions == 8)
            os.kill(server.pid, signal.SIGSTOP)
            try:  # the step comes; neither its version nor its round can go out
                await wait_until(lambda: (actor.ctx.counters.get("bus_waits") or 0) >= 2, timeout_s=90)
                assert actor.step == 1 and actor.report()["eval_out"] == 0
            finally:
                os.kill(server.pid, signal.SIGCONT)
            await wait_until(lambda: published_is(16), timeout_s=60)  # the round went out after the freeze
            assert actor.step == 1 and actor.report()["eval_out"] == 8
