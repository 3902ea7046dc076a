"""Helper process for the SIGKILL test: take one delivery, report its id, then hang without acking."""

from __future__ import annotations

import asyncio
import sys

from topology import BusSpec
from topology.bus import Bus


async def main(url: str, topology: str, channel: str, group: str) -> None:
    bus = await Bus.connect(url, topology=topology, name="doomed", settings=BusSpec(ack_wait_s=1.0))
    async for delivery in bus.consume(channel, group, batch=1):
        print(delivery.id, flush=True)
        await asyncio.sleep(3600)  # mid-message: killed before it can ack


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
