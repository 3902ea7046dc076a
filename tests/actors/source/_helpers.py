"""Shared by the source actor tests: waiting on a condition, reading what the source published."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from actors.protocol import PromptMsg
from topology.bus import Bus


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    with anyio.fail_after(timeout_s):
        for _ in iter(int, 1):  # until the predicate holds (or the deadline)
            if await predicate():
                return
            await anyio.sleep(0.02)


async def drawn_task_ids(bus: Bus, count: int, *, batch: int) -> list[str]:
    """The task ids of the next ``count`` prompts on ``prompts`` (consumer group ``gen``), acked as read."""
    got: list[str] = []
    async with bus.consume("prompts", "gen", model=PromptMsg, batch=batch) as consumer:
        async for delivery in consumer:
            assert isinstance(delivery.payload, PromptMsg)
            got.append(delivery.payload.task_id)
            await delivery.ack()
            if len(got) == count:
                break
    return got
