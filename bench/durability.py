"""What the embedded bus's fsync interval costs: durable 1 KiB publishes (batches of B, pipelined store acks) into
an embedded nats-server started with each ``bus.sync_interval_s`` setting, events/s per setting in one run.

``always`` fsyncs after every write (nothing acknowledged is lost even when the machine itself crashes); an interval
bounds that loss to the interval; either way a killed nats-server loses nothing acknowledged (page cache).

Usage: python bench/durability.py [--quick]   (writes bench/results/durability.json, prints a markdown table)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import markdown_table, write_results
from topology import BusSpec
from topology.bus import Bus, EmbeddedNats

PAYLOAD = {"data": "x" * 1000}
SETTINGS: list[float | str] = ["always", 1.0, 120.0]  # 120 s: nats-server's own default


async def publish_rate(sync: float | str, n: int, batch: int) -> float:
    spec = BusSpec(sync_interval_s=sync)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            EmbeddedNats(Path(tmp), sync_interval=spec.sync_interval) as server,
            await Bus.connect(server.url, topology=f"dur-{uuid.uuid4().hex[:6]}", name="bench") as bus,
        ):
            await bus.ensure_channel("events")
            items = [("event", PAYLOAD, None)] * batch
            started = time.perf_counter()
            for _ in range(n // batch):
                await bus.publish_many("events", items)
            return n / (time.perf_counter() - started)


async def main(quick: bool) -> dict[str, Any]:
    n, batch, repeats = (5_000, 50, 2) if quick else (20_000, 50, 3)
    rows: list[list[Any]] = []
    figures: dict[str, Any] = {}
    for sync in SETTINGS:
        rates = [await publish_rate(sync, n, batch) for _ in range(repeats)]
        figures[str(sync)] = {"events_per_s": [round(r) for r in rates], "median": round(statistics.median(rates))}
        rows.append([f"sync_interval_s: {sync}", statistics.median(rates), min(rates), max(rates)])
    base = figures["1.0"]["median"]
    for row in rows:
        row.append(f"{row[1] / base:.2f}x")
    print(markdown_table(["setting", "events/s (median)", "min", "max", "vs 1 s"], rows))
    return {"n": n, "batch": batch, "repeats": repeats, "settings": figures}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main(args.quick))
    write_results("durability", result)
