"""Bus benchmark: durable publish→consume of 1 KiB events through flywheel's Bus vs raw nats-py.

(1) Throughput: N events published in batches of B (pipelined acks) while one consumer acks each; events/s
    from the first publish to the last ack. Raw nats-py does the same with ``js.publish_async`` batches,
    ``pull_subscribe`` ``fetch(B)``, ``msg.ack()``, and orjson on both ends (the same JSON work an app does).
(2) Latency at a fixed rate (1k events/s): each event is published (awaiting its store ack) at its slot;
    the consumer records publish-call → delivery latency. Raw uses ``fetch(1)``: nats-py's ``fetch(n)``
    holds a partial batch until its timeout, so fetch(1) is raw's best latency setting.

Usage: python bench/bus.py [--quick]   (writes bench/results/bus.json and prints a markdown table)
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

import nats
import orjson
from nats.js import api

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import markdown_table, percentile, write_results
from topology import BusSpec
from topology.bus import Bus, EmbeddedNats

PAYLOAD = {"data": "x" * 1000}  # ~1 KiB on the wire
TARGETS = {"throughput_eps": 20_000, "p99_ms": 5.0, "ratio": 0.5}
SETTINGS = BusSpec(max_ack_pending=1024, max_deliver=5, ack_wait_s=30, dedupe_window_s=120)


def _topology() -> str:
    return f"bench-{uuid.uuid4().hex[:8]}"


# -- ours -------------------------------------------------------------------------------------------------
async def ours_throughput(url: str, n: int, batch: int) -> float:
    async with await Bus.connect(url, topology=_topology(), name="bench", settings=SETTINGS) as bus:
        await bus.ensure_channel("events")
        consumer = await bus.consume("events", "g", batch=batch).start()
        done = asyncio.get_running_loop().create_future()

        async def consume() -> None:
            count = 0
            async for delivery in consumer:
                await delivery.ack()
                count += 1
                if count == n:
                    done.set_result(time.perf_counter())
                    return

        task = asyncio.create_task(consume())
        start = time.perf_counter()
        for lo in range(0, n, batch):
            await bus.publish_many("events", [("e", PAYLOAD, None)] * min(batch, n - lo))
        end = await asyncio.wait_for(done, 120)
        await task
        await consumer.aclose()
    return n / (end - start)


async def ours_latency(url: str, rate: float, seconds: float) -> list[float]:
    async with await Bus.connect(url, topology=_topology(), name="bench", settings=SETTINGS) as bus:
        await bus.ensure_channel("events")
        consumer = await bus.consume("events", "g").start()
        latencies: list[float] = []
        total = int(rate * seconds)

        async def consume() -> None:
            async for delivery in consumer:
                latencies.append(time.perf_counter() - delivery.payload["t0"])
                await delivery.ack()
                if len(latencies) == total:
                    return

        task = asyncio.create_task(consume())
        await _paced(total, rate, lambda t0: bus.publish("events", "e", {**PAYLOAD, "t0": t0}))
        await asyncio.wait_for(task, 30)
        await consumer.aclose()
    return latencies


# -- raw nats-py ------------------------------------------------------------------------------------------
async def _raw_setup(url: str) -> tuple[Any, Any, str, Any]:
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    js = nc.jetstream()
    name = _topology().upper().replace("-", "_")
    subject = f"raw.{name}"
    await js.add_stream(
        api.StreamConfig(
            name=name, subjects=[subject], storage=api.StorageType.FILE, duplicate_window=SETTINGS.dedupe_window_s
        )
    )
    await js.add_consumer(
        name,
        api.ConsumerConfig(
            durable_name="g",
            ack_policy=api.AckPolicy.EXPLICIT,
            max_ack_pending=SETTINGS.max_ack_pending,
            max_deliver=SETTINGS.max_deliver,
            ack_wait=SETTINGS.ack_wait_s,
        ),
    )
    sub = await js.pull_subscribe_bind(durable="g", stream=name)
    return nc, js, subject, sub


async def raw_throughput(url: str, n: int, batch: int) -> float:
    nc, js, subject, sub = await _raw_setup(url)
    done = asyncio.get_running_loop().create_future()

    async def consume() -> None:
        count = 0
        while count < n:
            try:
                msgs = await sub.fetch(min(batch, n - count), timeout=1)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            for msg in msgs:
                orjson.loads(msg.data)
                await msg.ack()
            count += len(msgs)
        done.set_result(time.perf_counter())

    task = asyncio.create_task(consume())
    start = time.perf_counter()
    for lo in range(0, n, batch):
        futures = []
        for _ in range(min(batch, n - lo)):
            data = orjson.dumps({"id": uuid.uuid4().hex, "payload": PAYLOAD})
            futures.append(await js.publish_async(subject, data, headers={"Nats-Msg-Id": uuid.uuid4().hex}))
        await asyncio.gather(*futures)
    end = await asyncio.wait_for(done, 120)
    await task
    await nc.close()
    return n / (end - start)


async def raw_latency(url: str, rate: float, seconds: float) -> list[float]:
    nc, js, subject, sub = await _raw_setup(url)
    latencies: list[float] = []
    total = int(rate * seconds)

    async def consume() -> None:
        while len(latencies) < total:
            try:
                msgs = await sub.fetch(1, timeout=1)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            for msg in msgs:
                latencies.append(time.perf_counter() - orjson.loads(msg.data)["t0"])
                await msg.ack()

    async def publish(t0: float) -> None:
        await js.publish(subject, orjson.dumps({**PAYLOAD, "t0": t0}), headers={"Nats-Msg-Id": uuid.uuid4().hex})

    task = asyncio.create_task(consume())
    await _paced(total, rate, publish)
    await asyncio.wait_for(task, 30)
    await nc.close()
    return latencies


async def _paced(total: int, rate: float, publish: Any) -> None:
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await publish(time.perf_counter())


# -- driver -----------------------------------------------------------------------------------------------
async def run(quick: bool) -> dict[str, Any]:
    n, rounds, seconds, batch, rate = (10_000, 2, 3.0, 256, 1000.0) if quick else (100_000, 5, 15.0, 256, 1000.0)
    with tempfile.TemporaryDirectory(prefix="fw-bench-bus-") as tmp:
        async with EmbeddedNats(Path(tmp)) as server:
            await ours_throughput(server.url, 2000, batch)  # warm up both paths (imports, file creation)
            await raw_throughput(server.url, 2000, batch)
            ours_tp, raw_tp = [], []
            for _ in range(rounds):  # interleaved so both see the same machine load
                ours_tp.append(await ours_throughput(server.url, n, batch))
                raw_tp.append(await raw_throughput(server.url, n, batch))
            ours_lat = await ours_latency(server.url, rate, seconds)
            raw_lat = await raw_latency(server.url, rate, seconds)
    ours_eps, raw_eps = statistics.median(ours_tp), statistics.median(raw_tp)
    figures = {
        "ours": {
            "throughput_eps": ours_eps,
            "throughput_runs": ours_tp,
            "p50_ms": percentile(ours_lat, 50) * 1e3,
            "p99_ms": percentile(ours_lat, 99) * 1e3,
        },
        "raw": {
            "throughput_eps": raw_eps,
            "throughput_runs": raw_tp,
            "p50_ms": percentile(raw_lat, 50) * 1e3,
            "p99_ms": percentile(raw_lat, 99) * 1e3,
        },
        "ratio": ours_eps / raw_eps,
    }
    passed = {
        "throughput_eps": figures["ours"]["throughput_eps"] >= TARGETS["throughput_eps"],
        "p99_ms": figures["ours"]["p99_ms"] <= TARGETS["p99_ms"],
        "ratio": figures["ratio"] >= TARGETS["ratio"],
    }
    return {
        "quick": quick,
        "config": {
            "events": n,
            "rounds": rounds,
            "batch": batch,
            "event_bytes": 1024,
            "latency_rate_eps": rate,
            "latency_seconds": seconds,
            "max_ack_pending": SETTINGS.max_ack_pending,
        },
        "figures": figures,
        "targets": TARGETS,
        "pass": passed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (≤ 60 s) for CI and smoke checks")
    args = parser.parse_args()
    started = time.perf_counter()
    results = asyncio.run(run(args.quick))
    results["wall_s"] = round(time.perf_counter() - started, 1)
    path = write_results("bus", results)
    f, ok = results["figures"], results["pass"]
    mark = {True: "pass", False: "FAIL"}
    print(
        markdown_table(
            ["metric", "flywheel Bus", "raw nats-py", "target", "result"],
            [
                [
                    f"durable 1 KiB events/s (batch {results['config']['batch']})",
                    f["ours"]["throughput_eps"],
                    f["raw"]["throughput_eps"],
                    f"≥ {TARGETS['throughput_eps']:,}",
                    mark[ok["throughput_eps"]],
                ],
                [
                    "ours / raw throughput",
                    f"{f['ratio']:.0%}",
                    "100%",
                    f"≥ {TARGETS['ratio']:.0%}",
                    mark[ok["ratio"]],
                ],
                ["p50 latency @ 1k/s (ms)", f["ours"]["p50_ms"], f["raw"]["p50_ms"], "", ""],
                [
                    "p99 latency @ 1k/s (ms)",
                    f["ours"]["p99_ms"],
                    f["raw"]["p99_ms"],
                    f"≤ {TARGETS['p99_ms']}",
                    mark[ok["p99_ms"]],
                ],
            ],
        )
    )
    print(f"\nwrote {path} in {results['wall_s']} s")


if __name__ == "__main__":
    main()
