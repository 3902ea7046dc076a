"""The verify actor against a real nats-server: code runs under bubblewrap unless the spec opts in to less, and the
isolation in force is in its counters (what `flywheel status` and the live view print) and in each verdict."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import orjson
import pytest
import structlog

from actors.protocol import VERIFIER_ERROR, RolloutMsg, ScoredMsg
from actors.testing import actor_context
from actors.verify._actor import VerifyActor
from actors.verify._config import SandboxConfig, VerifyConfig
from topology import BusSpec, Spec, load_spec
from topology.bus import Bus, EmbeddedNats
from topology.runtime import ActorContext

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def verify_spec(tmp_path: Path, sandbox: str = "{workers: 1}") -> Spec:
    path = tmp_path / "spec.yaml"
    path.write_text(
        f"name: v-{uuid.uuid4().hex[:8]}\nbus: {{embedded: true}}\nruntime: local\n"
        "policy: {model: builtin:tiny-gpt}\n"
        "domains:\n  pyexpr: {source: builtin:pyexpr, verifier: python-expr}\n"
        f"actors:\n  verify: {{sandbox: {sandbox}}}\n"
        "channels:\n  rollouts: {external: true}\n  scored: {external: true}\n"
    )
    return load_spec(path)


def user_verifier_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, bus: str = "", domain: str = ""
) -> Spec:
    """A spec whose domain ``mine`` is scored by ``score`` of a module holding ``source`` (importable by the test);
    ``domain`` adds keys to the domain's entry (``, key: value``)."""
    module = f"user_verifier_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "spec.yaml"
    path.write_text(
        f"name: v-{uuid.uuid4().hex[:8]}\nbus: {{embedded: true{bus}}}\nruntime: local\n"
        "policy: {model: builtin:tiny-gpt}\n"
        f"domains:\n  mine: {{source: builtin:arithmetic, verifier: '{module}:score'{domain}}}\n"
        "actors:\n  verify: {sandbox: {workers: 1}}\n"
        "channels:\n  rollouts: {external: true}\n  scored: {external: true}\n"
    )
    return load_spec(path)


def rollout_of(
    domain: str,
    verifier_fields: dict[str, object],
    texts: list[str],
    prompt: str = "2+2=",
    *,
    task_id: str = "t1",
    reference: str = "",
) -> RolloutMsg:
    completion = {"token_ids": [1], "logprobs": [0.0], "versions": [0], "finish_reason": "stop"}
    return RolloutMsg.model_validate(
        {
            "task_id": task_id,
            "reference": reference,
            "domain": domain,
            "prompt_ids": [1],
            "prompt": prompt,
            "temperature": 1.0,
            "verifier_fields": verifier_fields,
            "completions": [{"text": text, **completion} for text in texts],
        }
    )


@asynccontextmanager
async def started_verify(spec: Spec, url: str, run_dir: Path) -> AsyncIterator[tuple[VerifyActor, ActorContext, Bus]]:
    """A started verify actor on its own bus connection (the spec's ack_wait_s and max_deliver), channels made."""
    settings = BusSpec(ack_wait_s=spec.bus.ack_wait_s, max_deliver=spec.bus.max_deliver)
    async with await Bus.connect(url, topology=spec.name, name="verify", settings=settings) as bus:
        ctx = actor_context(spec, "verify", bus, run_dir)
        config = spec.actors["verify"].config
        assert isinstance(config, VerifyConfig)
        actor = VerifyActor(ctx, config)
        await actor.start()
        try:
            await bus.ensure_channel("rollouts")
            await bus.ensure_channel("scored")
            yield actor, ctx, bus
        finally:
            await actor.stop()


async def scored_while_running(
    actor: VerifyActor, ctx: ActorContext, bus: Bus, *, first_only: bool = True, within_s: float = 30
) -> list[ScoredMsg]:
    """Run the actor and read what it scores: the first message (``first_only``; ``within_s`` at most), or every
    message within ``within_s``; then stop it."""
    seen: list[ScoredMsg] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(actor.run)
        with anyio.fail_after(within_s) if first_only else anyio.move_on_after(within_s):
            async with bus.consume("scored", "check", model=ScoredMsg) as deliveries:
                async for delivery in deliveries:
                    seen.append(delivery.payload)
                    await delivery.ack()
                    if first_only:
                        break
        ctx.stopping.set()
    return seen


def test_bubblewrap_is_the_default_and_weaker_is_an_opt_in() -> None:
    assert SandboxConfig().min_isolation == "bwrap"
    assert VerifyConfig(sandbox=SandboxConfig(isolation="rlimits", min_isolation="rlimits")).sandbox.min_isolation


@pytest.mark.parametrize("level", ["bwrap", "rlimits"])
async def test_the_isolation_in_force_is_counted_and_in_every_verdict(
    embedded_nats: EmbeddedNats, tmp_path: Path, level: str
) -> None:
    sandbox = "{workers: 1}" if level == "bwrap" else "{workers: 1, isolation: rlimits, min_isolation: rlimits}"
    spec = verify_spec(tmp_path, sandbox)
    hostile = "type('A', (int,), {'__eq__': lambda s, o: True})(3)"
    async with started_verify(spec, embedded_nats.url, tmp_path) as (actor, ctx, bus):
        assert actor.report()["isolation"] == level
        await bus.publish(
            "rollouts",
            "rollout",
            rollout_of("pyexpr", {"target": 17}, ["3*5+2", hostile], "17").model_dump(mode="json"),
        )
        [scored] = await scored_while_running(actor, ctx, bus)
    assert [c.reward for c in scored.completions] == [1.0, 0.0]
    assert actor.report()["isolation"] == level


async def test_a_verifier_that_raises_is_counted_by_domain_and_logged_with_why(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's verifier that raised scored the answer 0 and said so only at debug level: the run looked like a model
    that learns nothing. Now each such answer is counted under its domain (the live view shows it) and the first is
    logged as a warning with the exception, once a minute at most per domain."""
    source = "def score(completion, task):\n    return 1.0 if completion == task['answer'] else task['missing']\n"
    spec = user_verifier_spec(tmp_path, monkeypatch, source)
    async with started_verify(spec, embedded_nats.url, tmp_path) as (actor, ctx, bus):
        await bus.publish(
            "rollouts", "rollout", rollout_of("mine", {"answer": "4"}, ["4", "5", "6"]).model_dump(mode="json")
        )
        with structlog.testing.capture_logs() as logs:
            [scored] = await scored_while_running(actor, ctx, bus)
    assert [(c.reward, c.verdict) for c in scored.completions] == [
        (1.0, "pass"),
        (0.0, VERIFIER_ERROR),
        (0.0, VERIFIER_ERROR),
    ]
    assert actor.report()["verifier_errors.mine"] == 2
    warnings = [entry for entry in logs if entry["event"] == "verify.verifier_error"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning", logs  # the second waits a minute
    assert warnings[0]["domain"] == "mine" and "KeyError: 'missing'" in warnings[0]["detail"]


async def test_a_rollout_slower_to_verify_than_ack_wait_is_verified_once_and_the_actor_lives(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verifier slower than the bus's ack_wait_s got its rollout redelivered while still verifying it, and the
    second acquisition of the in-flight limiter by the same id crashed the actor ("this borrower is already holding
    one of this CapacityLimiter's tokens"). The actor now keeps such rollouts alive on the bus, and verifies a
    redelivery of one it is verifying only once."""
    source = "import time\n\ndef score(completion, task):\n    time.sleep(2.5)\n    return 1.0\n"
    spec = user_verifier_spec(tmp_path, monkeypatch, source, bus=", ack_wait_s: 1.0")
    async with started_verify(spec, embedded_nats.url, tmp_path) as (actor, ctx, bus):
        await bus.publish("rollouts", "rollout", rollout_of("mine", {"answer": "4"}, ["4"]).model_dump(mode="json"))
        # three ack windows past the verdict: room for any redelivery
        seen = [m.task_id for m in await scored_while_running(actor, ctx, bus, first_only=False, within_s=8)]
    assert seen == ["t1"]
    assert actor.report()["rollouts"] == 1
    assert not actor.report().get("redelivered_while_verifying")  # kept alive: not redelivered at all


async def test_a_user_verifier_gets_the_time_limit_its_domain_sets(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's verifier had 30 s per answer whatever the spec said (the limit was no spec key): a domain whose
    verifier calls a slow service could not allow more, one that must be fast could not allow less. The domain's
    ``verifier_timeout_s`` is now the limit the verify actor gives it."""
    source = "import time\n\ndef score(completion, task):\n    time.sleep(20)\n    return 1.0\n"
    spec = user_verifier_spec(tmp_path, monkeypatch, source, domain=", verifier_timeout_s: 0.5")
    async with started_verify(spec, embedded_nats.url, tmp_path) as (actor, ctx, bus):
        await bus.publish("rollouts", "rollout", rollout_of("mine", {"answer": "4"}, ["4"]).model_dump(mode="json"))
        [scored] = await scored_while_running(actor, ctx, bus, within_s=15)
    [completion] = scored.completions
    assert (completion.reward, completion.verdict) == (0.0, "timeout")
    assert "took longer than 0.5 s" in completion.detail


async def test_a_user_verifiers_timeouts_are_counted_by_domain_and_logged(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timeouts scored 0 in silence: a verifier too slow for its limit on every answer showed up nowhere in the logs,
    and its domain's counter hid among the verdicts."""
    source = "import time\n\ndef score(completion, task):\n    time.sleep(20)\n    return 1.0\n"
    spec = user_verifier_spec(tmp_path, monkeypatch, source, domain=", verifier_timeout_s: 0.5")
    async with started_verify(spec, embedded_nats.url, tmp_path) as (actor, ctx, bus):
        await bus.publish("rollouts", "rollout", rollout_of("mine", {}, ["4", "5"]).model_dump(mode="json"))
        with structlog.testing.capture_logs() as logs:
            await scored_while_running(actor, ctx, bus, within_s=15)
    assert actor.report()["verifier_timeouts.mine"] == 2
    warnings = [entry for entry in logs if entry["event"] == "verify.verifier_timeout"]
    assert len(warnings) == 1 and warnings[0]["domain"] == "mine", logs  # the second waits a minute
    assert "verifier_timeout_s" in warnings[0]["hint"]


async def test_verdicts_made_of_the_answer_do_not_make_a_counter_each(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verifier returning ``"wrong:" + completion`` as its verdict made one ``verdict.*`` counter per answer:
    1,832 of them in a 60-s run, each in every heartbeat and in the metrics. Distinct names are capped (the rest are
    ``verdict.other``) and a verdict that is not a short name becomes pass / fail, what it said kept in the detail."""
    source = (
        "def score(completion, task):\n"
        "    if completion == 'long':\n"
        "        return {'reward': 0.0, 'verdict': 'x' * 100}\n"
        "    return {'reward': 0.0, 'verdict': 'wrong:' + completion}\n"
    )
    spec = user_verifier_spec(tmp_path, monkeypatch, source)
    async with started_verify(spec, embedded_nats.url, tmp_path) as (actor, ctx, bus):
        texts = [str(i) for i in range(40)] + ["long"]
        await bus.publish("rollouts", "rollout", rollout_of("mine", {}, texts).model_dump(mode="json"))
        [scored] = await scored_while_running(actor, ctx, bus)
    assert (
        scored.completions[-1].verdict == "fail" and "is not a name of 1-40 characters" in scored.completions[-1].detail
    )
    counted = {key: value for key, value in actor.report().items() if key.startswith("verdict.")}
    assert len(counted) == 33 and counted["verdict.other"] == 41 - 32, counted  # 32 names, then other
    assert sum(counted.values()) == 41


async def test_a_failed_groups_reference_is_scored_and_one_that_fails_its_tests_is_counted_and_logged(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """With ``failed_groups: reference`` the learner trained on a failed group's reference answer as if correct, even
    when that reference failed the row's own tests (a wrong dataset row). The verify actor now scores the reference
    of a group with no correct completion in the sandbox, as one more completion would be, and passes its reward on
    (the learner trains only on one scored correct); a failing one is counted and logged with the task and why."""
    tests = {"tests": "assert f(2) == 4"}
    row = {"prompt": "def f(x): double x", "verifier_fields": tests, "reference": "def f(x):\n    return 2 * x\n"}
    (tmp_path / "code.jsonl").write_text(orjson.dumps(row).decode() + "\n")
    path = tmp_path / "spec.yaml"
    path.write_text(
        f"name: v-{uuid.uuid4().hex[:8]}\nbus: {{embedded: true}}\nruntime: local\n"
        "policy: {model: builtin:tiny-gpt}\n"
        "domains:\n  code: {source: 'jsonl:code.jsonl', verifier: python-tests, heldout: 0, failed_groups: reference}\n"
        "actors:\n  verify: {sandbox: {workers: 1}}\n"
        "channels:\n  rollouts: {external: true}\n  scored: {external: true}\n"
    )
    spec = load_spec(path)
    wrong = ["def f(x):\n    return x\n", "def f(x):\n    return x + 1\n"]
    rollouts = {
        "good-row": rollout_of("code", tests, wrong, task_id="good-row", reference=row["reference"]),
        "bad-row": rollout_of("code", tests, wrong, task_id="bad-row", reference="def f(x):\n    return x ** 3\n"),
        "solved": rollout_of("code", tests, [*wrong, row["reference"]], task_id="solved", reference="def f(x): 0"),
    }
    async with started_verify(spec, embedded_nats.url, tmp_path) as (actor, ctx, bus):
        for rollout in rollouts.values():
            await bus.publish("rollouts", "rollout", rollout.model_dump(mode="json"))
        with structlog.testing.capture_logs() as logs:
            seen = await scored_while_running(actor, ctx, bus, first_only=False, within_s=15)
    by_task = {m.task_id: m for m in seen}
    assert set(by_task) == set(rollouts)
    assert by_task["good-row"].reference_reward == 1.0
    assert by_task["bad-row"].reference_reward == 0.0
    assert by_task["solved"].reference_reward is None  # a correct completion: no guidance, nothing to score
    assert actor.report()["reference_failed.code"] == 1
    [warning] = [entry for entry in logs if entry["event"] == "verify.reference_failed"]
    assert (warning["domain"], warning["task_id"], warning["verdict"]) == ("code", "bad-row", "fail"), warning


async def test_a_rollout_of_a_domain_removed_from_the_spec_is_dropped_not_dead_lettered(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """A run resumed without a domain still has its rollouts on the bus: they were dead-lettered one by one as "no
    verifier here", and `flywheel up` showed the run as dead-lettering. Now they are acked and counted by domain, said
    once in the log, and the domains the spec has are scored as before."""
    spec = verify_spec(tmp_path)
    async with started_verify(spec, embedded_nats.url, tmp_path) as (actor, ctx, bus):
        for _ in range(2):
            gone = rollout_of("extract", {"fields": {"a": 1}}, ['{"a": 1}'])
            await bus.publish("rollouts", "rollout", gone.model_dump(mode="json"))
        await bus.publish(
            "rollouts", "rollout", rollout_of("pyexpr", {"target": 17}, ["3*5+2"], "17").model_dump(mode="json")
        )
        with structlog.testing.capture_logs() as logs:
            [scored] = await scored_while_running(actor, ctx, bus)
    assert scored.domain == "pyexpr"
    counters = actor.report()
    assert counters["removed_domain.extract"] == 2 and "unknown_domain" not in counters
    assert [e["domain"] for e in logs if e["event"] == "verify.removed_domain"] == ["extract"]
    assert bus.stats.dead_lettered == 0
