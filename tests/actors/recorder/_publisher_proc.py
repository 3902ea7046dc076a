"""Stand-in for the gateway: publish traffic + feedback, append each id to a file once JetStream acked it.

usage: python _publisher_proc.py NATS_URL TOPOLOGY ACKED_FILE FIRST COUNT PAUSE_S
A publish that fails (the server is away) is retried with the same id: JetStream stores it once.
"""

from __future__ import annotations

import os
import sys
import time

import anyio

from tests.actors.recorder._support import feedback, traffic
from topology.bus import Bus, BusError


async def publish(bus: Bus, channel: str, payload: dict[str, object], id: str) -> None:
    while True:
        try:
            await bus.publish(channel, channel, payload, id=id)
            return
        except BusError:
            await anyio.sleep(0.1)


async def main(url: str, topology: str, acked_file: str, first: int, count: int, pause_s: float) -> None:
    fd = os.open(acked_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    async with await Bus.connect(url, topology=topology, name="publisher", connect_timeout_s=30) as bus:
        for i in range(first, first + count):
            rid = f"req-{i}"
            await publish(bus, "traffic", traffic(rid), f"t-{rid}")
            os.write(fd, f"traffic {rid}\n".encode())
            await publish(bus, "feedback", feedback(rid, score=(i % 3) / 2), f"f-{rid}")
            os.write(fd, f"feedback {rid}\n".encode())
            time.sleep(pause_s)  # blocking on purpose: paces the stand-in gateway
    os.close(fd)


if __name__ == "__main__":
    anyio.run(
        main,
        sys.argv[1],
        sys.argv[2],
        sys.argv[3],
        int(sys.argv[4]),
        int(sys.argv[5]),
        float(sys.argv[6]),
        backend="asyncio",
    )
