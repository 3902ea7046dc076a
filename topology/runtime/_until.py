"""Iterate an async source until the actor is asked to stop — the loop shape of every consuming actor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator
from typing import TypeVar

import anyio

T = TypeVar("T")


async def iterate_until(source: AsyncIterable[T], stopping: anyio.Event) -> AsyncIterator[T]:
    """Yield items from ``source`` until it ends or ``stopping`` is set (also while waiting for an item).

    The pending ``__anext__`` is cancelled when stopping wins, so a consumer gives back nothing it took.
    """
    iterator = source.__aiter__()
    while not stopping.is_set():
        next_item = asyncio.ensure_future(iterator.__anext__())
        stop_wait = asyncio.ensure_future(stopping.wait())
        try:
            done, _ = await asyncio.wait({next_item, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled while waiting: leave no orphan future behind
            next_item.cancel()
            raise
        finally:
            stop_wait.cancel()
        if next_item not in done:
            next_item.cancel()
            return
        try:
            item = next_item.result()
        except StopAsyncIteration:
            return
        yield item
