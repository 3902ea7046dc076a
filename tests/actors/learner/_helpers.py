"""Shared by the learner tests: a learner-only spec, hand-built `scored` groups, an in-process learner."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from actors.learner import LearnerConfig
from actors.learner._actor import LearnerActor
from actors.policy import CharTokenizer, encode_prompt
from actors.protocol import ScoredMsg
from actors.testing import actor_context
from topology import BusSpec, Spec, load_spec
from topology.bus import Bus

TINY = "{preset: tiny, n_layer: 1, n_embd: 32, n_head: 2, seed: 0}"


def write_spec(
    folder: Path,
    learner: str = "",
    *,
    domains: str = "",
    warm_steps: int = 0,
    ack_wait_s: float = 1.0,
    dedupe_window_s: float = 120.0,
    name: str | None = None,
) -> Spec:
    """A learner fed from an external `scored` channel (no generators), tiny policy."""
    domains = domains or (
        "  arithmetic: {source: builtin:arithmetic, verifier: math, group_size: 4, heldout: 8, weight: 1.0}\n"
    )
    name = name or f"lrn-{uuid.uuid4().hex[:8]}"
    path = folder / "spec.yaml"
    path.write_text(
        f"name: {name}\n"
        f"bus: {{embedded: true, ack_wait_s: {ack_wait_s}, max_deliver: 20, dedupe_window_s: {dedupe_window_s}}}\n"
        "runtime: {kind: local, run_dir: runs, heartbeat_s: 0.2}\n"
        f"policy: {{model: builtin:tiny-gpt, config: {TINY}, warm_start: {{steps: {warm_steps}, lr: 3.0e-3, "
        "batch_size: 16}}\n"
        f"domains:\n{domains}"
        "actors:\n"
        "  learner:\n"
        "    resources: {num_cpus: 1}\n"
        "    device: cpu\n"
        f"{learner}"
        "channels:\n"
        "  scored: {external: true}\n"
    )
    return load_spec(path)


def scored(
    domain: str,
    rewards: list[float],
    *,
    versions: int | list[int] = 1,
    heldout: bool = False,
    temperature: float = 1.0,
    prompt: str = "What is 1+2? ",
    verdicts: list[str] | None = None,
) -> dict[str, Any]:
    """A `scored` payload: one completion per reward (with its verdict, "ok" by default), each a couple of characters
    with versions."""
    tok = CharTokenizer()
    completions = []
    for i, reward in enumerate(rewards):
        ids = [*tok.encode(str(i % 10) + "3"), tok.eos_id]
        vs = versions if isinstance(versions, list) else [versions] * len(ids)
        completions.append(
            {
                "text": f"{i % 10}3",
                "token_ids": ids,
                "logprobs": [-4.0] * len(ids),
                "versions": vs[: len(ids)] + [vs[-1]] * (len(ids) - len(vs)),
                "finish_reason": "stop",
                "reward": reward,
                "verdict": verdicts[i] if verdicts is not None else "ok",
            }
        )
    msg = ScoredMsg.model_validate(
        {
            "task_id": f"{domain}-t",
            "domain": domain,
            "prompt_ids": encode_prompt(tok, prompt),
            "heldout": heldout,
            "temperature": temperature,
            "completions": completions,
        }
    )
    return msg.model_dump(mode="json")


def learner_config(spec: Spec) -> LearnerConfig:
    config = spec.actors["learner"].config
    assert isinstance(config, LearnerConfig)
    return config


@asynccontextmanager
async def running_learner(
    spec: Spec, url: str, run_dir: Path, *, crash: bool = False
) -> AsyncIterator[tuple[LearnerActor, Bus]]:
    """Start a learner in this event loop; on exit stop it cleanly, or (crash=True) cancel it mid-run and drop its
    bus connection without drain — what a SIGKILL leaves behind, as far as the bus and the state dir can tell."""
    settings = BusSpec(
        ack_wait_s=spec.bus.ack_wait_s, max_deliver=spec.bus.max_deliver, dedupe_window_s=spec.bus.dedupe_window_s
    )
    async with await Bus.connect(url, topology=spec.name, name="learner", settings=settings) as bus:
        for channel in spec.channels.values():
            await bus.ensure_channel(channel.name)
        ctx = actor_context(spec, "learner", bus, run_dir)
        actor = LearnerActor(ctx, learner_config(spec))
        await actor.start()
        async with anyio.create_task_group() as tg:
            tg.start_soon(actor.run)
            try:
                yield actor, bus
            finally:
                if crash:
                    tg.cancel_scope.cancel()
                else:
                    ctx.stopping.set()
        if not crash:
            await actor.drain()
            await actor.stop()


async def wait_until(predicate: Any, timeout_s: float = 60.0) -> None:
    """Until ``predicate()`` is true (it may return an awaitable), or fail after ``timeout_s``: a guard against
    hangs, not a speed check (20 s once ran out in the crash-resume test with busy loops hogging both cores)."""
    with anyio.fail_after(timeout_s):
        for _ in iter(int, 1):  # until the predicate holds (or the deadline)
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return
            await anyio.sleep(0.05)


def effective_applied(run_dir: Path) -> list[str]:
    """Message ids whose effect is in the final weights (`actors.learner.effective_applied`)."""
    from actors.learner import effective_applied as rows

    return list(rows(run_dir)["message_id"].to_list())


async def score_round(actor: LearnerActor, bus: Bus, version: int) -> None:
    """Score every prompt of the round labelled ``version`` (8 held-out tasks, all correct) and wait for them. Waits
    on the count of scores taken in, not on ``eval_out`` falling to 0: a round due meanwhile goes out as soon as
    this one is scored, so ``eval_out`` may be 0 for less than a poll."""
    before = actor.ctx.counters.get("eval_prompts_scored")
    for i in range(8):
        await bus.publish(
            "scored",
            "scored",
            scored("arithmetic", [1.0], heldout=True, temperature=0.0),
            id=f"eval-{version}-t{i}.r.s",
        )
    await wait_until(lambda: actor.ctx.counters.get("eval_prompts_scored") >= before + 8)
