"""The learner actor in-process against a real nats-server: exactly-once across a crash, stale samples dropped,
held-out scores evaluated and never trained on, redelivered applied messages skipped."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import anyio
import orjson
import polars as pl
import pytest
import structlog

from actors.learner import Checkpointer, read_metrics
from actors.learner._actor import LearnerActor
from actors.learner._intake import Intake
from actors.learner._trainer import Trainer
from actors.protocol import TASK_OUTCOMES, TaskOutcomes
from actors.testing import actor_context
from tests.actors.learner._helpers import (
    effective_applied,
    learner_config,
    running_learner,
    score_round,
    scored,
    wait_until,
    write_spec,
)
from topology.bus import Bus, EmbeddedNats

pytestmark = pytest.mark.anyio

VERIFIED = {"reference": "3", "reference_reward": 1.0}  # a reference the verify actor scored correct


def learner(checkpoint_every_steps: int = 2, extra: str = "") -> str:
    return (
        f"    batch_size: 8\n    checkpoint_every_steps: {checkpoint_every_steps}\n    eval_every_steps: 0\n"
        f"    fill_wait_s: 0\n    metrics_flush_s: 0.2\n{extra}"
    )


async def test_crash_then_resume_applies_every_sample_exactly_once(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, learner(2, "    max_staleness: 100\n"))  # samples say version 1
    run_dir = tmp_path / "run"
    async with running_learner(spec, embedded_nats.url, run_dir, crash=True) as (actor, bus):
        for i in range(6):  # 3 steps of 2 groups; the checkpoint at step 2 covers g0..g3
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=f"g{i}")
        # the checkpoint at step 2 is written in the background: on disk once its counter says so
        await wait_until(lambda: actor.step == 3 and actor.ctx.counters.get("last_checkpoint_step") == 2)
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):
        assert actor.step == 2  # resumed from the checkpoint; g4, g5 come back (never acked) and apply again
        for i in range(6, 8):
            await bus.publish("scored", "scored", scored("arithmetic", [1.0, 0.0, 0.0, 0.0]), id=f"g{i}")
        await wait_until(lambda: actor.step == 4)
    ids = effective_applied(run_dir)
    assert sorted(ids) == [f"g{i}" for i in range(8)]  # each once: none lost, none doubled
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):
        await anyio.sleep(spec.bus.ack_wait_s * 2)  # nothing is redelivered: everything was acked
        assert actor.step == 4 and actor.batcher.completions == 0
        assert not actor.ctx.counters.get("duplicates_skipped")  # (the ledger would skip a redelivered one)
        consumer = await bus.nc.jetstream().consumer_info(bus.stream("scored"), "learner")
    assert consumer.num_pending == 0 and consumer.num_ack_pending == 0  # none undelivered, none unacked


@pytest.mark.parametrize(
    ("learner_mode", "domain_mode"), [("skip", None), ("reference", None), ("skip", "reference"), ("reference", "skip")]
)
async def test_failed_groups_are_skipped_or_guided_by_the_reference(
    embedded_nats: EmbeddedNats, tmp_path: Path, learner_mode: str, domain_mode: str | None
) -> None:
    config = (
        "    batch_size: 4\n    checkpoint_every_steps: 1\n    eval_every_steps: 0\n    fill_wait_s: 0\n"
        f"    metrics_flush_s: 0.2\n    max_staleness: 100\n    failed_groups: {learner_mode}\n"
    )
    override = "" if domain_mode is None else f", failed_groups: {domain_mode}"
    domains = f"  arithmetic: {{source: builtin:arithmetic, verifier: math, group_size: 4, heldout: 8{override}}}\n"
    spec = write_spec(tmp_path, config, domains=domains)  # a batch is one group of 4: each is judged on its own
    mode = domain_mode or learner_mode  # the domain's setting wins
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
        for i in range(2):  # all wrong, with the task's reference answer (verified): only guidance gives them signal
            await bus.publish("scored", "scored", {**scored("arithmetic", [0.0] * 4), **VERIFIED}, id=f"f{i}")
        await bus.publish("scored", "scored", scored("arithmetic", [0.0] * 4), id="no-ref")  # nothing to guide with
        await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id="mixed")
        # partial credit and none fully right: signal of its own, and not correct, so guided as well
        await bus.publish("scored", "scored", {**scored("arithmetic", [0.5, 0.0, 0.5, 0.0]), **VERIFIED}, id="partial")
        await wait_until(lambda: actor.ctx.counters.get("groups_applied") >= (4 if mode == "reference" else 2))
        await wait_until(
            lambda: actor.ctx.counters.get("no_signal_failed.arithmetic") >= (1 if mode == "reference" else 3)
        )
        guided = actor.ctx.counters.get("guided.arithmetic")
    steps = read_metrics(tmp_path / "run", "step")
    if mode == "reference":  # 3 guided groups of 4 + their references, and the mixed group of 4
        assert guided == 3 and sum(steps["samples"].to_list()) == 3 * 5 + 4
    else:  # the mixed and the partial group, as they came
        assert guided == 0 and sum(steps["samples"].to_list()) == 2 * 4


async def test_a_reference_not_scored_correct_never_guides_a_failed_group(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """A failed group's reference was trained on as the right answer whether or not it passed its own verifier (a
    wrong dataset row taught as correct). Only a reference the verify actor scored correct guides now; one that
    failed, or was never scored, leaves its group unguided, counted in ``reference_unverified.<domain>``."""
    config = (
        "    batch_size: 4\n    checkpoint_every_steps: 1\n    eval_every_steps: 0\n    fill_wait_s: 0\n"
        "    metrics_flush_s: 0.2\n    max_staleness: 100\n    failed_groups: reference\n"
    )
    spec = write_spec(tmp_path, config)
    failed = [0.5, 0.0, 0.5, 0.0]  # partial credit: signal of its own, so the group trains with or without guidance
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
        with structlog.testing.capture_logs() as logs:
            for name, score in (("wrong-row", 0.0), ("unscored", None)):
                payload = {**scored("arithmetic", failed), "reference": "3", "reference_reward": score}
                await bus.publish("scored", "scored", payload, id=name)
            await wait_until(lambda: actor.ctx.counters.get("groups_applied") >= 2)
            await bus.publish("scored", "scored", {**scored("arithmetic", failed), **VERIFIED}, id="right-row")
            await wait_until(lambda: actor.ctx.counters.get("groups_applied") >= 3)
        counters = actor.ctx.counters
        assert counters.get("reference_unverified.arithmetic") == 2
        assert counters.get("guided.arithmetic") == 1
    steps = read_metrics(tmp_path / "run", "step")
    assert sorted(steps["samples"].to_list()) == [4, 4, 5]  # only the right row's group has its reference added
    [warning] = [entry for entry in logs if entry["event"] == "learner.reference_unverified"]  # once per domain
    assert warning["domain"] == "arithmetic" and warning["reference_reward"] == 0.0


async def test_stale_heldout_and_duplicates_never_train(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, learner(1, "    max_staleness: 0\n"), dedupe_window_s=0.3)
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
        assert actor.version == 1
        for i in range(2):  # a full batch of samples from version 0: staleness 1 > 0
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 1.0, 0.0], versions=0), id=f"s{i}")
        for i in range(8):  # one complete held-out round at version 1, half correct
            payload = scored("arithmetic", [float(i % 2)], heldout=True, temperature=0.0)
            await bus.publish("scored", "scored", payload, id=f"eval-1-t{i}.r.s")
        await wait_until(lambda: actor.ctx.counters.get("dropped_stale.arithmetic") == 8)
        await wait_until(lambda: actor.ctx.counters.get("heldout_acc.arithmetic") == 0.5)
        assert actor.ctx.counters.get("heldout_acc_start.arithmetic") == 0.5  # the run's first round: the baseline
        assert actor.step == 0 and actor.batcher.completions == 0
        for i in range(2):
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 1.0, 1.0]), id=f"d{i}")
        await wait_until(lambda: actor.ctx.counters.get("last_checkpoint_step") == 1)  # d0, d1 applied and acked
        await anyio.sleep(0.5)  # past the bus's dedupe window: the same id is stored (and delivered) again
        await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 1.0, 1.0]), id="d0")
        await wait_until(lambda: actor.ctx.counters.get("duplicates_skipped") == 1 or actor.batcher.completions > 0)
        assert actor.batcher.completions == 0  # d0 is in the ledger: skipped, not buffered
    evals = read_metrics(tmp_path / "run", "eval")
    assert evals.select("version", "domain", "n", "accuracy").rows() == [(1, "arithmetic", 8, 0.5)]
    steps = read_metrics(tmp_path / "run", "step")
    assert steps["step"].to_list() == [1] and steps["samples"].to_list() == [8]


@pytest.mark.parametrize(
    ("setting", "expected"),
    [("", "shm"), ("    weight_transport: disk\n", "disk"), ("    weight_transport: object-store\n", "object-store")],
    ids=["default", "disk", "object-store"],
)
async def test_weights_go_through_shared_memory_on_the_local_runtime_unless_told(
    embedded_nats: EmbeddedNats, tmp_path: Path, setting: str, expected: str
) -> None:
    from actors.protocol import CURRENT, weights_bucket
    from actors.weights import WeightManifest, shm_root

    spec = write_spec(tmp_path, learner(extra=setting))
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (_actor, bus):
        raw = await bus.kv_get(weights_bucket(spec.name), CURRENT)
        assert raw is not None  # the learner announces its first version when it starts
        manifest = WeightManifest.from_json(raw)
        assert manifest.transport == expected
        if expected == "disk":
            assert Path(manifest.location).parent == tmp_path / "run" / "weights"
            assert any(Path(manifest.location).glob("*.safetensors"))
        if expected == "shm":
            assert Path(manifest.location).parent == shm_root(tmp_path / "run")
    if expected == "shm":
        assert not shm_root(tmp_path / "run").exists(), "the learner's stop leaves its slots behind"


async def test_auto_publishes_through_disk_once_shared_memory_has_no_room(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container's /dev/shm is 64 MB unless it is given more: the first slot fits, the next does not (the tmpfs
    says ENOSPC when the slot's pages are taken). The learner keeps training and publishes through the run dir's
    safetensors files instead of crash-looping."""
    import errno
    import os

    from actors.protocol import CURRENT, weights_bucket
    from actors.weights import WeightManifest, shm_root

    real = os.posix_fallocate

    def full_after_one_slot(fd: int, offset: int, length: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.startswith(str(shm_root(tmp_path / "run"))) and not path.endswith("slot-0"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", full_after_one_slot)
    spec = write_spec(tmp_path, learner(100, "    max_staleness: 100\n    publish_min_interval_s: 0\n"))
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):

        async def manifest() -> WeightManifest:
            raw = await bus.kv_get(weights_bucket(spec.name), CURRENT)
            assert raw is not None
            return WeightManifest.from_json(raw)

        assert (await manifest()).transport == "shm"  # v1, in the one slot there is room for
        for i in range(4):  # two steps of two groups: v2 and v3
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=f"g{i}")

        async def announced(version: int) -> bool:  # (actor.version moves before its publish is announced)
            return (await manifest()).version == version

        await wait_until(lambda: announced(3))
        latest = await manifest()
        assert (latest.version, latest.transport) == (3, "disk")
        assert Path(latest.location).parent == tmp_path / "run" / "weights"
        assert actor.step == 2


async def test_auto_transport_is_the_object_store_on_ray() -> None:
    from actors.learner import LearnerConfig

    assert LearnerConfig().transport_name("ray") == "object-store"
    assert LearnerConfig().transport_name("local") == "disk"  # nothing known of the engines: what all can load
    assert LearnerConfig(weight_transport="distributed").transport_name("local") == "distributed"


def test_auto_lr_scales_down_with_the_policy_and_keeps_its_anchors() -> None:
    from actors.learner import LearnerConfig, auto_lr, warm_start_lr

    assert auto_lr(400_000) == auto_lr(1_000_000) == 2e-4  # the tiny models it was measured on
    assert auto_lr(500_000_000) == auto_lr(70_000_000_000) == 1e-6  # what RL of pretrained LLMs uses
    sizes = [10**6, 3 * 10**6, 10**7, 10**8, 3 * 10**8, 5 * 10**8]
    rates = [auto_lr(n) for n in sizes]
    assert all(a > b for a, b in itertools.pairwise(rates))
    assert 2.5e-5 < auto_lr(10**7) < 3.1e-5  # a straight line in log-log between the anchors
    assert LearnerConfig().lr == "auto"
    assert LearnerConfig().resolved_lr(10**7) == auto_lr(10**7)
    assert LearnerConfig(lr=3e-4).resolved_lr(10**9) == 3e-4  # a number is taken as given
    assert warm_start_lr("auto", 10**6) == 1e-3  # the supervised rate a from-scratch tiny model was tuned with
    assert warm_start_lr("auto", 10**9) == pytest.approx(5e-6)  # a pretrained model's fine-tuning rate
    assert warm_start_lr(4e-3, 10**9) == 4e-3


@pytest.mark.parametrize("setting", ["", "    lr: 5.0e-5\n"], ids=["auto", "given"])
async def test_the_optimizer_runs_at_the_resolved_learning_rate(
    embedded_nats: EmbeddedNats, tmp_path: Path, setting: str
) -> None:
    from actors.learner import auto_lr

    spec = write_spec(tmp_path, learner(extra=setting))
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, _bus):
        expected = 5e-5 if setting else auto_lr(actor.policy.num_parameters())
        assert actor.lr == expected
        assert {group["lr"] for group in actor.trainer.optimizer.param_groups} == {expected}
        await actor.checkpoint()
    # resumed under a spec with another rate: the spec's rate applies, not the one the checkpoint was written at
    spec = write_spec(tmp_path, learner(extra="    lr: 3.0e-5\n"), name=spec.name)
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, _bus):
        assert {group["lr"] for group in actor.trainer.optimizer.param_groups} == {3e-5}
    resumed = read_metrics(tmp_path / "run", "lifecycle").filter(event="resume")
    assert resumed.height == 1 and resumed["lr"].to_list() == [3e-5]


@pytest.mark.parametrize("precision", ["float32", "bfloat16-mixed", "auto"])
async def test_precision_sets_the_trainers_autocast(
    embedded_nats: EmbeddedNats, tmp_path: Path, precision: str
) -> None:
    import torch

    from actors.policy import native_bfloat16

    spec = write_spec(tmp_path, learner(extra=f"    precision: {precision}\n"))
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, _bus):
        mixed = precision == "bfloat16-mixed" or (precision == "auto" and native_bfloat16(actor.policy.device))
        assert actor.trainer.autocast == (torch.bfloat16 if mixed else None)


def test_auto_transport_on_the_local_runtime_is_shared_memory_unless_an_http_engine_serves(tmp_path: Path) -> None:
    from actors.learner import LearnerConfig
    from topology import load_spec

    root = Path(__file__).resolve().parents[3]
    assert LearnerConfig().transport_name("local", load_spec(root / "specs" / "embedded.yaml")) == "shm"
    path = tmp_path / "spec.yaml"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    path.write_text(
        "name: http\npolicy: {model: 'hf:model'}\n"
        "domains: {arithmetic: {source: 'builtin:arithmetic', verifier: math}}\n"
        "actors: {source: {}, verify: {}, learner: {}, generator: {engine: sglang, url: 'http://127.0.0.1:1'}}\n"
    )
    assert LearnerConfig().transport_name("local", load_spec(path)) == "disk"


@pytest.mark.parametrize(("floor_s", "versions"), [(0.0, 4), (60.0, 1)], ids=["every-step", "floor"])
async def test_publish_min_interval_holds_back_the_versions_of_fast_steps(
    embedded_nats: EmbeddedNats, tmp_path: Path, floor_s: float, versions: int
) -> None:
    spec = write_spec(tmp_path, learner(extra=f"    max_staleness: 100\n    publish_min_interval_s: {floor_s}\n"))
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
        assert actor.version == 1  # the start publishes whatever the floor
        for i in range(6):  # 3 steps of 2 groups, each a few milliseconds
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=f"g{i}")
        await wait_until(lambda: actor.step == 3 and actor.version == versions)
        await anyio.sleep(0.3)
        assert actor.version == versions  # with the floor, steps 1-3 came too soon after the start's version


async def test_heldout_prompts_out_are_reported_until_their_scores_return(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """`eval_out`: held-out prompts published and not scored yet, which a source steering by `max_in_flight` must not
    count as training groups (they wait in the same stages)."""
    config = learner(
        1,
        "    max_staleness: 100\n    publish_min_interval_s: 0\n    eval_every_steps: 1\n"
        "  generator: {engine: torch, device: cpu}\n",
    )
    spec = write_spec(tmp_path, config.replace("    eval_every_steps: 0\n", "", 1))
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
        js = bus.nc.jetstream()

        async def published_is(n: int) -> bool:
            return int((await js.stream_info(bus.stream("prompts"))).state.messages) == n

        assert await published_is(8) and actor.report()["eval_out"] == 8  # the baseline round: 8 held-out tasks
        for i in range(5):
            await bus.publish(
                "scored", "scored", scored("arithmetic", [1.0], heldout=True, temperature=0.0), id=f"eval-1-t{i}.r.s"
            )
        await wait_until(lambda: actor.report()["eval_out"] == 3)
        for i in range(2):  # a batch: the first step waits for the baseline round, so it reads version 1 alone
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=f"g{i}")
        await wait_until(lambda: len(actor.intake.held) == 2)
        await anyio.sleep(0.3)
        assert actor.step == 0 and actor.version == 1
        for i in range(5, 8):
            await bus.publish(
                "scored", "scored", scored("arithmetic", [1.0], heldout=True, temperature=0.0), id=f"eval-1-t{i}.r.s"
            )
        await wait_until(lambda: published_is(16))  # then one training step, and the next round goes out
        assert actor.step == 1 and actor.report()["eval_out"] == 8


async def test_a_baseline_round_that_never_comes_back_holds_the_first_step_only_until_written_off(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import actors.learner._rounds as rounds_module

    monkeypatch.setattr(rounds_module, "_EVAL_LOST_S", 1.0)
    config = learner(
        1, "    max_staleness: 100\n    eval_every_steps: 100\n  generator: {engine: torch, device: cpu}\n"
    )
    spec = write_spec(tmp_path, config.replace("    eval_every_steps: 0\n", "", 1))
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
        assert actor.report()["eval_out"] == 8  # out, and nobody will score them
        for i in range(2):
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=f"g{i}")
        await wait_until(lambda: actor.step == 1)
        assert actor.report()["eval_out"] == 0 and actor.ctx.counters.get("eval_prompts_lost") == 8


async def test_batches_take_domains_in_the_proportion_the_source_draws_them(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """Equal weights, groups of 8 and of 4: the source sends one prompt of each in turn, so a batch of 12 is one
    group of each. Shares by weight alone (6 + 6) would owe the small-group domain credit it never fills, and the
    batch would wait out `fill_wait_s`."""
    config = (
        "    batch_size: 12\n    checkpoint_every_steps: 100\n    eval_every_steps: 0\n    fill_wait_s: 60\n"
        "    metrics_flush_s: 0.2\n    max_staleness: 100\n"
    )
    domains = (
        "  arithmetic: {source: builtin:arithmetic, verifier: math, group_size: 8, heldout: 8}\n"
        "  extract: {source: builtin:extract, verifier: json-fields, group_size: 4, heldout: 8}\n"
    )
    spec = write_spec(tmp_path, config, domains=domains)
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
        await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0] * 4), id="a0")
        await bus.publish("scored", "scored", scored("extract", [0.0, 0.5, 1.0, 0.0]), id="e0")
        await wait_until(lambda: actor.step == 1, timeout_s=15.0)
    steps = read_metrics(tmp_path / "run", "step")
    assert steps["completions.arithmetic"].to_list() == [8] and steps["completions.extract"].to_list() == [4]


async def test_groups_without_signal_are_consumed_on_arrival_and_a_step_waits_for_signal(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """Three solved groups and one mixed group are 16 completions, but only 4 with signal: no step until a second
    mixed group brings the batch's 8 (before, the learner stepped on the first 4 rows it had). The solved groups are
    accounted as consumed and acked by the next checkpoint, like every group."""
    spec = write_spec(tmp_path, learner(1, "    max_staleness: 100\n"))
    run_dir = tmp_path / "run"
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):
        for i in range(3):
            await bus.publish("scored", "scored", scored("arithmetic", [1.0] * 4), id=f"solved{i}")
        await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 1.0, 1.0]), id="mixed0")
        await wait_until(lambda: actor.ctx.counters.get("no_signal_solved.arithmetic") == 3)
        await wait_until(lambda: actor.batcher.completions == 4)
        await anyio.sleep(0.3)  # the train loop had its chances: 4 rows with signal are not a batch of 8
        assert actor.step == 0
        await bus.publish("scored", "scored", scored("arithmetic", [1.0, 0.0, 0.0, 0.0]), id="mixed1")
        await wait_until(lambda: actor.step == 1)
        js = bus.nc.jetstream()

        async def all_acked() -> bool:  # acks go out after the checkpoint's counter is set: wait for the bus
            return int((await js.consumer_info(bus.stream("scored"), "learner")).num_ack_pending) == 0

        await wait_until(lambda: actor.ctx.counters.get("last_checkpoint_step") == 1)
        await wait_until(all_acked)  # the consumed groups were acked with the checkpoint
        assert actor.ctx.counters.get("task_outcomes_sent") == 0  # no source of this spec listens
        assert not actor.sample_maker.outcomes.settled  # nor is anything noted for one
    steps = read_metrics(run_dir, "step")
    assert steps["samples"].to_list() == [8]
    applied = read_metrics(run_dir, "applied").sort("message_id")
    assert applied.select("message_id", "how").rows() == [
        ("mixed0", "applied"),
        ("mixed1", "applied"),
        ("solved0", "consumed"),
        ("solved1", "consumed"),
        ("solved2", "consumed"),
    ]


async def test_the_learner_reports_which_tasks_groups_carried_signal_to_the_sources(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """Each domain group's outcome goes out as a `TaskOutcomes` hint on the core subject sources listen to: solved
    and failed groups settled, a mixed one with signal; a production group (no source drew it) is not reported. A
    report goes out with a delivery at least half a second after the previous one, whatever that delivery was. (Only
    because a source of the spec listens: see the default test above.)"""
    spec = write_spec(tmp_path, learner(8, "    max_staleness: 100\n  source: {skip_no_signal: 0.5}\n"))
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
        reports = await bus.subscribe_ephemeral(TASK_OUTCOMES)
        groups = {"s0": [1.0] * 4, "s1": [1.0] * 4, "f0": [0.0] * 4, "m0": [0.0, 1.0, 1.0, 0.0]}
        for task, rewards in groups.items():
            await bus.publish("scored", "scored", {**scored("arithmetic", rewards), "task_id": task}, id=task)
        production = {**scored("arithmetic", [0.0, 1.0]), "task_id": "p0", "origin": "feedback"}
        await bus.publish("scored", "scored", production, id="p0")
        await wait_until(lambda: actor.ctx.counters.get("no_signal_solved.arithmetic") == 2)
        await anyio.sleep(0.6)
        await bus.publish("scored", "scored", scored("arithmetic", [1.0, 0.0], temperature=0.0), id="greedy")
        settled: set[str] = set()
        signal: set[str] = set()
        with anyio.fail_after(10):
            async for message in reports:
                report = TaskOutcomes.model_validate(message.payload)
                settled |= set(report.settled)
                signal |= set(report.signal)
                if len(settled) + len(signal) >= 4:
                    break
        await reports.aclose()
        assert (settled, signal) == ({"s0", "s1", "f0"}, {"m0"})
        assert actor.ctx.counters.get("task_outcomes_sent") == 4


async def test_consumed_groups_that_fill_the_ack_window_are_checkpointed_without_a_step(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """batch_size 8 × checkpoint_every_steps 2 = 16 groups may wait for a checkpoint: the 16th solved group in a
    row triggers one although no step was taken, and every one of them is acked."""
    spec = write_spec(tmp_path, learner(2, "    max_staleness: 100\n"))
    async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
        js = bus.nc.jetstream()

        async def ack_pending() -> int:
            return int((await js.consumer_info(bus.stream("scored"), "learner")).num_ack_pending)

        async def all_acked() -> bool:
            return await ack_pending() == 0

        for i in range(15):
            await bus.publish("scored", "scored", scored("arithmetic", [1.0] * 4), id=f"solved{i}")
        await wait_until(lambda: actor.ctx.counters.get("no_signal_solved.arithmetic") == 15)
        await anyio.sleep(0.3)  # the train loop had its chances: 15 are below the window's 16
        assert await ack_pending() == 15
        await bus.publish("scored", "scored", scored("arithmetic", [1.0] * 4), id="solved15")
        await wait_until(lambda: actor.ctx.counters.get("no_signal_solved.arithmetic") == 16)
        await wait_until(all_acked)
        assert actor.step == 0
    events = read_metrics(tmp_path / "run", "lifecycle").filter(pl.col("event") == "checkpoint")
    assert events["step"].to_list() == [0, 0]  # the start's, and the one the consumed groups asked for


def hold_checkpoint(monkeypatch: pytest.MonkeyPatch, at: int, *, fail: Exception | None = None) -> threading.Event:
    """Hold the real write of the checkpoint at step ``at`` until the returned event is set, then write it (or raise
    ``fail`` instead, as a full disk would)."""
    release = threading.Event()
    save = Checkpointer.save

    def held(self: Checkpointer, step: int, state: Any) -> Path:
        if step == at:
            assert release.wait(60), "the test never let the checkpoint go"
            if fail is not None:
                raise fail
        return save(self, step, state)

    monkeypatch.setattr(Checkpointer, "save", held)
    return release


@pytest.mark.parametrize("keepalive", [True, False])
async def test_training_goes_on_while_a_checkpoint_is_written_and_what_it_covers_is_acked_after_it(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keepalive: bool
) -> None:
    """The checkpoint at step 2 (g0..g3) is written in the background: its real write is held until the test lets it
    go, and meanwhile steps 3 and 4 are taken. Its groups stay un-acked until it is on disk — kept alive, or (without
    the keepalive) redelivered after ack_wait_s, recognised as being written and neither applied again nor acked
    early; then everything is acked, each group applied once."""
    spec = write_spec(tmp_path, learner(2, "    max_staleness: 100\n"))
    release = hold_checkpoint(monkeypatch, 2)
    if not keepalive:
        monkeypatch.setattr(Intake, "keepalive", lambda self: anyio.sleep_forever())
    run_dir = tmp_path / "run"
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):
        js = bus.nc.jetstream()

        async def consumer() -> Any:
            return await js.consumer_info(bus.stream("scored"), "learner")

        async def all_acked() -> bool:
            return int((await consumer()).num_ack_pending) == 0

        try:
            for i in range(8):
                await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=f"g{i}")
            await wait_until(lambda: actor.step == 4)  # two steps past the checkpoint still being written
            assert actor.ctx.counters.get("last_checkpoint_step") != 2
            await anyio.sleep(2.5 * spec.bus.ack_wait_s)  # past the ack wait
            info = await consumer()
            assert info.num_ack_pending == 8  # none acked before its checkpoint is on disk
            assert not actor.ctx.counters.get("duplicates_skipped")  # a redelivery was held on to, not acked early
            if not keepalive:
                assert info.num_redelivered > 0
        finally:
            release.set()
        await wait_until(lambda: actor.ctx.counters.get("last_checkpoint_step") == 4)
        await wait_until(all_acked)
        assert actor.step == 4
    assert sorted(effective_applied(run_dir)) == [f"g{i}" for i in range(8)]
    events = read_metrics(run_dir, "lifecycle").filter(pl.col("event") == "checkpoint")
    assert events["step"].to_list()[-2:] == [2, 4]


@pytest.mark.parametrize("keepalive", [True, False])
async def test_a_group_redelivered_while_its_step_runs_is_applied_once(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keepalive: bool
) -> None:
    """The first step (g0, g1) is held in its worker thread past the ack wait, as a step of a large model, or a learner
    stopped (SIGSTOP) with groups buffered, can take: its groups are kept alive, or (without the keepalive) redelivered
    meanwhile and recognised as the step's own — each group is applied once. (A redelivery used to find its group in
    neither the buffer nor the ledger, and the next step applied it again.)"""
    spec = write_spec(tmp_path, learner(2, "    max_staleness: 100\n"))
    release, taken = threading.Event(), threading.Event()
    rl_step = Trainer.rl_step

    def held(self: Trainer, samples: Any) -> Any:
        if not taken.is_set():
            taken.set()
            assert release.wait(60), "the test never let the step go"
        return rl_step(self, samples)

    monkeypatch.setattr(Trainer, "rl_step", held)
    if not keepalive:
        monkeypatch.setattr(Intake, "keepalive", lambda self: anyio.sleep_forever())
    run_dir = tmp_path / "run"
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):
        js = bus.nc.jetstream()
        try:
            for i in range(4):
                await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=f"g{i}")
            await wait_until(taken.is_set)
            await anyio.sleep(2.5 * spec.bus.ack_wait_s)  # past the ack wait, the step still running
            info = await js.consumer_info(bus.stream("scored"), "learner")
            assert (info.num_redelivered > 0) is not keepalive
        finally:
            release.set()
        await wait_until(lambda: (actor.ctx.counters.get("last_checkpoint_step") or 0) >= 2)
        await anyio.sleep(2.5 * spec.bus.ack_wait_s)  # what a redelivery would have done, it has done by now
        assert actor.step == 2 and not actor.batcher.completions  # no third step on copies of g0 and g1
    assert sorted(effective_applied(run_dir)) == [f"g{i}" for i in range(4)]


async def test_a_checkpoint_write_that_fails_fails_the_run_and_the_resume_applies_every_group_once(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The background write of the step-2 checkpoint fails (as a full disk would) after steps 3 and 4 and two groups
    without signal were taken meanwhile: the run fails, nothing it covered was acked, and a new learner resumes from
    the checkpoint before it and applies every group exactly once."""
    spec = write_spec(tmp_path, learner(2, "    max_staleness: 100\n"))
    release = hold_checkpoint(monkeypatch, 2, fail=OSError(28, "No space left on device"))
    run_dir = tmp_path / "run"
    ids = [f"g{i}" for i in range(8)] + ["solved0", "solved1"]
    with pytest.raises(BaseExceptionGroup) as failed:
        async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):
            try:
                for mid in ids[:8]:
                    await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=mid)
                await wait_until(lambda: actor.step == 4)
                for mid in ids[8:]:  # consumed without a step while the write is under way
                    await bus.publish("scored", "scored", scored("arithmetic", [1.0] * 4), id=mid)
                await wait_until(lambda: actor.ctx.counters.get("no_signal_solved.arithmetic") == 2)
            finally:
                release.set()
            await anyio.sleep(30)  # the failed write ends the run (and cancels this wait)
    assert failed.value.subgroup(OSError) is not None
    monkeypatch.undo()  # the real save again
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):
        assert actor.step == 0  # the start's checkpoint: the failed one never landed
        await wait_until(lambda: actor.step == 4)  # every group comes back (none was acked) and applies again
        await wait_until(lambda: actor.ctx.counters.get("no_signal_solved.arithmetic") == 2)
    assert sorted(effective_applied(run_dir)) == sorted(ids)


async def test_completions_the_verifier_failed_on_are_never_trained_on(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """A verifier that raised scores the answer 0 with verdict internal_error: trained on, that 0 taught the model
    that a right answer was wrong (and a group whose other answers all failed looked like signal). Such completions
    leave their group; a group left with fewer than two is consumed without a step."""
    spec = write_spec(tmp_path, learner(1, "    max_staleness: 100\n"))
    run_dir = tmp_path / "run"
    error = "internal_error"
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):
        only_errors = scored("arithmetic", [1.0, 0.0, 0.0, 0.0], verdicts=["pass", error, error, error])
        await bus.publish("scored", "scored", only_errors, id="errors0")
        some = scored("arithmetic", [1.0, 0.0, 0.0, 1.0], verdicts=["pass", "fail", error, "pass"])
        await bus.publish("scored", "scored", some, id="some0")
        await wait_until(lambda: actor.ctx.counters.get("verifier_errors_skipped.arithmetic") == 4)
        await wait_until(lambda: actor.batcher.completions == 3)  # some0 without its error; errors0: nothing
        assert actor.step == 0
    applied = read_metrics(run_dir, "applied").sort("message_id")
    assert applied.select("message_id", "how").rows() == [("errors0", "consumed")]


async def test_a_resumed_learner_reports_the_runs_first_and_newest_heldout_accuracy(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """Its held-out counters come back with it: the live view and `flywheel status` measure the climb from the run's
    first round (``heldout_acc_start``), not from the resumed life's first, and show the newest round until the
    next one."""
    from actors.learner import MetricsWriter

    spec = write_spec(tmp_path, learner())
    run_dir = tmp_path / "run"
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, _bus):
        await actor.checkpoint()
    earlier = MetricsWriter(run_dir, "an-earlier-life")
    for ts, accuracy in ((100.0, 0.3), (200.0, 0.42)):
        row = {"ts": ts, "step": 0, "version": 1, "n": 100, "reward_mean": accuracy, "samples": 1}
        earlier.add("eval", {**row, "domain": "arithmetic", "accuracy": accuracy, "temperature": 0.0})
        earlier.add("eval", {**row, "domain": "arithmetic", "accuracy": 0.9, "temperature": 1.0})  # not the headline
    earlier.flush()
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, _bus):
        counters = actor.ctx.counters
        assert counters.get("heldout_acc_start.arithmetic") == 0.3 and counters.get("heldout_acc.arithmetic") == 0.42


async def test_a_stop_during_the_warm_start_ends_it_within_a_step_and_keeps_no_part_way_state(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """Ctrl-C in `just demo`'s first half-minute waited out the whole warm start (in a thread, deaf to the stop):
    the supervisor killed the learner after its drain timeout. The warm start now stops at the next step, and the
    learner checkpoints and exports nothing part-way, so a resumed run warm-starts afresh."""
    spec = write_spec(tmp_path, learner(), warm_steps=100_000)
    run_dir = tmp_path / "run"
    async with await Bus.connect(embedded_nats.url, topology=spec.name, name="learner") as bus:
        for channel in spec.channels.values():
            await bus.ensure_channel(channel.name)
        ctx = actor_context(spec, "learner", bus, run_dir)
        actor = LearnerActor(ctx, learner_config(spec))
        with anyio.fail_after(30):  # unstopped, the warm start takes minutes
            async with anyio.create_task_group() as tg:
                tg.start_soon(actor.start)
                await wait_until(lambda: (ctx.counters.get("warmstart_step") or 0) >= 2)
                ctx.stopping.set()
            await actor.run()
            await actor.drain()
            await actor.stop()
    assert 2 <= (ctx.counters.get("warmstart_step") or 0) < 100_000
    assert actor.version == 0 and Checkpointer(ctx.state_dir / "checkpoints").latest() is None
    assert not (run_dir / "export").exists()


async def test_a_learner_resumed_on_a_bus_that_lost_its_store_numbers_past_every_version_it_published(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """Versions published after the last checkpoint live on in the bus's weights key alone: a resume on a bus
    without its old store (brought back empty, another server) reused their numbers — other weights under a number
    generators had seen, their groups dead-lettered as unpublished. The run's lifecycle metrics keep them."""
    spec = write_spec(tmp_path, learner())
    run_dir = tmp_path / "run"
    async with running_learner(spec, embedded_nats.url, run_dir, crash=True) as (actor, _bus):
        checkpointed = actor.version  # the first version, published after the start's checkpoint
        await actor.publish_weights()
        await actor.publish_weights()
        published = actor.version
        await wait_until(lambda: read_metrics(run_dir, "lifecycle").filter(version=published).height > 0)
    assert published == checkpointed + 2
    with (
        EmbeddedNats(tmp_path / "another-store") as empty,
        structlog.testing.capture_logs() as logs,
    ):
        async with running_learner(spec, empty.url, run_dir) as (actor, _bus):
            assert actor.version == published + 1
    assert next(e for e in logs if e["event"] == "learner.versions_past_the_bus")["run"] == published


async def test_versions_published_since_the_metrics_last_flush_are_not_numbered_again_on_a_bus_without_its_store(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """A kill within ``metrics_flush_s`` of a publish took that version's lifecycle row with it: on a bus that also
    lost its store the next life numbered it again. The learner keeps the newest number in its state dir first."""
    spec = write_spec(tmp_path, learner().replace("metrics_flush_s: 0.2", "metrics_flush_s: 3600"))
    run_dir = tmp_path / "run"
    async with running_learner(spec, embedded_nats.url, run_dir, crash=True) as (actor, _bus):
        await actor.publish_weights()
        await actor.publish_weights()
        published = actor.version
    assert read_metrics(run_dir, "lifecycle").filter(version=published).height == 0  # killed before the flush
    with EmbeddedNats(tmp_path / "another-store") as empty:
        async with running_learner(spec, empty.url, run_dir) as (actor, _bus):
            assert actor.version == published + 1


async def test_a_learner_that_cannot_keep_its_newest_version_number_still_publishes(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """The number is written before each publish; a state dir that cannot take it (a full disk, here a directory in
    its place) crashed the train loop's publish. It is counted and logged, and the version goes out."""
    spec = write_spec(tmp_path, learner())
    run_dir = tmp_path / "run"
    (run_dir / "state" / "learner" / "0" / "newest_version").mkdir(parents=True)
    with structlog.testing.capture_logs() as logs:
        async with running_learner(spec, embedded_nats.url, run_dir) as (actor, _bus):
            before = actor.version
            await actor.publish_weights()
            assert actor.version == before + 1 and await actor.weights_out.newest() == actor.version
            assert (actor.ctx.counters.get("newest_version_errors") or 0) >= 2
    assert any(e["event"] == "learner.newest_version_not_kept" for e in logs)


async def test_heldout_prompts_the_context_cannot_hold_are_left_out_of_the_rounds(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """A generator refuses a prompt that leaves the model no room (and dead-letters it). In a held-out set, its score
    never came: every round waited 60 s with no version published, was then written off, and the domain's accuracy
    never appeared. Such prompts are now left out of the rounds, counted and logged at start."""
    from actors.domains import domains_from_spec

    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(12)]
    rows += [{"prompt": "0+" * 300 + f"{i}=", "answer": str(i)} for i in range(12)]  # 600+ characters: over 512
    (tmp_path / "tasks.jsonl").write_text("".join(orjson.dumps(row).decode() + "\n" for row in rows))
    domains = "  mine: {source: jsonl:tasks.jsonl, verifier: math, group_size: 4, heldout: 12}\n"
    config = learner(1, "  generator: {engine: torch, device: cpu}\n").replace(
        "eval_every_steps: 0", "eval_every_steps: 100"
    )
    spec = write_spec(tmp_path, config, domains=domains)
    heldout = domains_from_spec(spec)["mine"].source.heldout()
    long = sum(len(task.prompt) > 600 for task in heldout)
    assert 0 < long < len(heldout)  # (the held-out partition holds both kinds)
    with structlog.testing.capture_logs() as logs:
        async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, _bus):
            assert actor.report()["eval_out"] == len(heldout) - long  # the baseline round: the prompts that fit
            assert actor.ctx.counters.get("heldout_too_long.mine") == long
    [warning] = [entry for entry in logs if entry["event"] == "learner.heldout_too_long"]
    assert warning["domain"] == "mine" and warning["left_out"] == long


async def test_a_domain_that_long_gives_no_signal_is_logged_with_why(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A domain whose every group scored 0 (or full marks) trained nothing, and only counters said so: a user whose
    verifier passed nothing saw a run that did not learn, and no line in any log."""
    import actors.learner._samples as samples

    monkeypatch.setattr(samples, "NO_SIGNAL_STREAK", 3)
    spec = write_spec(tmp_path, learner(1, "    max_staleness: 100\n"))
    with structlog.testing.capture_logs() as logs:
        async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
            for i, rewards in enumerate([[0.0] * 4] * 3 + [[0.0, 1.0, 0.0, 0.0]] + [[1.0] * 4, [0.0] * 4] * 2):
                await bus.publish("scored", "scored", scored("arithmetic", rewards), id=f"g{i}")
            await wait_until(lambda: actor.ctx.counters.get("no_signal_solved.arithmetic") == 2)
    streaks = [entry for entry in logs if entry["event"] == "learner.no_signal_streak"]
    assert [(e["domain"], e["groups"]) for e in streaks] == [("arithmetic", 3), ("arithmetic", 3)]
    assert "every completion scored 0" in streaks[0]["hint"]  # three all-0 groups
    assert "too easy or too hard" in streaks[1]["hint"]  # after the group with signal: solved, failed, solved


async def test_a_group_that_goes_stale_in_the_buffer_is_dropped_when_a_batch_is_taken(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """Staleness is judged on arrival and again when a batch is taken: a group fresh when it came, buffered while a
    step published a newer version, is dropped then. (Skipping the second check passed the suite.)"""
    config = learner(
        1, "    max_staleness: 0\n    publish_min_interval_s: 0\n  generator: {engine: torch, device: cpu}\n"
    )
    spec = write_spec(tmp_path, config.replace("    eval_every_steps: 0\n", "    eval_every_steps: 100\n", 1))
    run_dir = tmp_path / "run"
    async with running_learner(spec, embedded_nats.url, run_dir) as (actor, bus):
        assert actor.report()["eval_out"] == 8  # the baseline round: the first step waits for its scores
        for i in range(3):  # fresh at version 1: all three buffered, a batch and a half
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id=f"g{i}")
        await wait_until(lambda: len(actor.intake.held) == 3)
        assert actor.step == 0 and actor.version == 1
        await score_round(actor, bus, 1)
        await wait_until(lambda: actor.step == 1 and actor.version == 2)  # g0 and g1; g2 now one version old
        await bus.publish("scored", "scored", scored("arithmetic", [1.0, 0.0, 0.0, 0.0], versions=2), id="g3")
        # g2 and g3 make a batch; g2, stale when taken, is dropped and the step trains what is left of it
        await wait_until(lambda: actor.step == 2)
        assert actor.ctx.counters.get("dropped_stale") == 4  # g2's four completions
    assert sorted(effective_applied(run_dir)) == ["g0", "g1", "g3"]


async def test_in_sync_mode_a_batch_that_lost_completions_on_the_way_trains_as_it_is(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync source publishes one batch per version and waits for the next version: a completion the verifier
    failed on (left out of its group) made the batch one short of ``batch_size`` and the loop waited for ever — the
    learner for a batch, the source for a version (a helper's runs stopped at step 2 and 4). A short batch now trains
    once its first group waited (5 s at first, then three times the step cycle), counted and logged."""
    import actors.learner._actor as learner_module

    monkeypatch.setattr(learner_module, "_SYNC_SHORT_FIRST_S", 0.5)
    spec = write_spec(tmp_path, learner(1, "    mode: sync\n"))
    with structlog.testing.capture_logs() as logs:
        async with running_learner(spec, embedded_nats.url, tmp_path / "run") as (actor, bus):
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 0.0, 1.0]), id="g0")
            await bus.publish("scored", "scored", scored("arithmetic", [0.0, 1.0, 1.0]), id="g1")  # one lost
            await wait_until(lambda: actor.step == 1, timeout_s=10)
            assert actor.ctx.counters.get("sync_short_batches") == 1
            assert actor.ctx.counters.get("samples_applied") == 7
    [short] = [entry for entry in logs if entry["event"] == "learner.sync_short_batch"]
    assert short["completions"] == 7 and short["batch_size"] == 8
