"""Solved prompts are passed over: the sampler's rule, and the verify actor → source hint over a real nats-server
(whose scored messages also carry the task's reference answer on to the learner)."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from pathlib import Path

import anyio
import pytest

from actors.domains import Domain, DomainSampler, open_source
from actors.domains._task import task_id
from actors.protocol import RolloutMsg, ScoredMsg
from actors.source._actor import SourceActor
from actors.source._config import SourceConfig
from actors.verify._actor import VerifyActor
from actors.verify._config import VerifyConfig
from tests.actors.source._helpers import drawn_task_ids, wait_for
from topology import load_spec
from topology.bus import Bus, EmbeddedNats
from topology.runtime import ActorContext

ROWS = [("1+1=", "2"), ("2+2=", "4"), ("3+3=", "6")]


def write_rows(tmp_path: Path) -> Path:
    path = tmp_path / "add.jsonl"
    path.write_text("".join(f'{{"prompt": "{p}", "answer": "{a}"}}\n' for p, a in ROWS))
    return path


def sampler(tmp_path: Path, skip_solved: int) -> DomainSampler:
    source = open_source(f"jsonl:{write_rows(tmp_path)}", domain="add")
    return DomainSampler({"add": Domain(name="add", source=source, skip_solved=skip_solved)}, random.Random(0))


def test_a_solved_prompt_is_passed_over_its_next_n_draws_then_drawn_again(tmp_path: Path) -> None:
    s = sampler(tmp_path, skip_solved=3)
    solved = task_id("add", "1+1=")
    assert s.mark_solved("add", solved) and not s.mark_solved("other", solved)
    drawn = [s.next()[1].id for _ in range(60)]
    assert s.passed_over == Counter({"add": 3})
    assert solved in drawn  # drawn again once its three passes were used up
    s.mark_solved("add", solved)  # solved again: passed over three more times
    for _ in range(60):
        s.next()
    assert s.passed_over == Counter({"add": 6})


def test_marks_are_ignored_when_the_domain_does_not_skip_solved(tmp_path: Path) -> None:
    s = sampler(tmp_path, skip_solved=0)
    assert not s.skips_solved and not s.mark_solved("add", task_id("add", "1+1="))
    unmarked = sampler(tmp_path, skip_solved=0)
    assert [s.next()[1].id for _ in range(30)] == [unmarked.next()[1].id for _ in range(30)]
    assert not s.passed_over


def test_a_fully_solved_domain_still_yields_tasks(tmp_path: Path) -> None:
    s = sampler(tmp_path, skip_solved=1_000)
    for prompt, _ in ROWS:
        s.mark_solved("add", task_id("add", prompt))
    assert len([s.next() for _ in range(10)]) == 10
    assert s.passed_over["add"] == 10 * 16  # each draw passed over the cap, then took the last one drawn


SPEC = """\
name: NAME
bus: {embedded: true}
runtime: local
policy: {model: builtin:tiny-gpt}
domains:
  add: {source: jsonl:add.jsonl, verifier: math, group_size: 2, heldout: 0, skip_solved: 1000}
actors:
  source: {max_pending: 2, seed: 1}
  generator: {engine: torch}
  verify: {sandbox: {workers: 1}}
  learner: {}
"""


def rollout(prompt: str, *texts: str) -> dict[str, object]:
    completions = [
        {"text": t, "token_ids": [1], "logprobs": [-0.5], "versions": [0], "finish_reason": "stop"} for t in texts
    ]
    answer = dict(ROWS)[prompt]
    return RolloutMsg(
        task_id=task_id("add", prompt),
        domain="add",
        prompt=prompt,
        prompt_ids=[1],
        verifier_fields={"answer": answer},
        temperature=1.0,
        completions=completions,
        reference=answer,
    ).model_dump()


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_verify_announces_solved_groups_and_the_source_stops_drawing_them(
    embedded_nats: EmbeddedNats, tmp_path: Path
) -> None:
    write_rows(tmp_path)
    (tmp_path / "spec.yaml").write_text(SPEC.replace("NAME", f"skip-{uuid.uuid4().hex[:8]}"))
    spec = load_spec(tmp_path / "spec.yaml")
    solved = task_id("add", "1+1=")
    async with await Bus.connect(embedded_nats.url, topology=spec.name, name="test") as bus:
        for channel in ("prompts", "rollouts", "scored"):
            await bus.ensure_channel(channel)
        contexts = {
            kind: ActorContext(
                topology=spec.name, actor=kind, replica=0, kind=kind, spec=spec, bus=bus, run_dir=tmp_path
            )
            for kind in ("source", "verify")
        }
        source_config, verify_config = spec.actors["source"].config, spec.actors["verify"].config
        assert isinstance(source_config, SourceConfig) and isinstance(verify_config, VerifyConfig)
        source, verify = SourceActor(contexts["source"], source_config), VerifyActor(contexts["verify"], verify_config)
        await source.start()
        await verify.start()
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run)
            tg.start_soon(verify.run)
            await bus.publish("rollouts", "rollout", rollout("1+1=", "2", " 2"))  # every completion right: solved
            await bus.publish("rollouts", "rollout", rollout("2+2=", "4", "5"))  # one wrong: carries signal

            async def marked() -> bool:  # both rollouts scored and the mark reached the source
                return verify.report().get("rollouts", 0) >= 2 and bool(source.report().get("solved_marks"))

            await wait_for(marked, 20)
            assert verify.report()["solved_announced"] == 1 and source.report()["solved_marks"] == 1
            drawn = await drawn_task_ids(bus, 40, batch=2)
            async with bus.consume("scored", "learner", model=ScoredMsg, batch=2) as scored:
                async for delivery in scored:  # the reference rides along for the learner's failed_groups
                    assert isinstance(delivery.payload, ScoredMsg)
                    assert delivery.payload.reference == dict(ROWS)[delivery.payload.prompt]
                    await delivery.ack()
                    if delivery.payload.prompt == "2+2=":
                        break
            for ctx in contexts.values():
                ctx.stopping.set()
        await verify.stop()
        await source.stop()
    after = drawn[4:]  # the first few may have been published before the mark arrived
    assert solved not in after and set(after) == {task_id("add", p) for p, _ in ROWS[1:]}
    assert source.report()["passed_over.add"] >= 1
