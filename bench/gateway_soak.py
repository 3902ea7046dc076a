"""Gateway soak: hostile and honest clients at the gateway's concurrency limit for ``--duration`` seconds.

Setup: ``flywheel up`` runs a real topology in child processes — one generator (builtin tiny GPT,
``serve: true``) and one gateway (``max_concurrency`` = ``--slots``, ``body_timeout_s`` 1). This process is
every client at once:

* good — ``slots - aborters`` workers, one request after another (chat and completions, a third of them
  streamed; httpx). A 429 is retried after 50 ms and counted; anything else but a 200 with the full answer
  (``[DONE]`` for a stream) is a failure. Each good request's id must be on ``traffic`` at the end.
* aborted — ``--aborters`` workers send a valid request (max_tokens 64) and close the connection 5-100 ms
  later (half with a TCP reset); the generator must cancel what it started (``serve_cancelled``).
* slow — ``--slow`` workers send headers and part of a body, then one byte every 0.3 s: each must get 408.
* bad — ``--bad`` workers cycle through malformed JSON, wrong content types, untrusted hosts, cross-site
  origins, unknown domains and models, too many tokens, oversized bodies: each must get its exact 4xx.

Good and aborted workers together ask for exactly ``slots`` slots; slow and bad clients must hold none. The
gateway's and the generator's memory (RSS) are sampled every 2 s; growth is measured after a warm-up (the
first fifth of the run). At the end the gateway must hold nothing: no request in flight, no stream open, no
call pending at the generator, the generator nothing in flight.

Usage: python bench/gateway_soak.py [--duration 600]   (writes bench/results/gateway_soak.json)
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import markdown_table, percentile, write_results
from bench._flywheel_up import heartbeats, start, stop, wait_healthy
from topology.bus import Bus
from topology.runtime import connect_run

SPEC = """
name: {name}
bus: {{embedded: true}}
runtime: {{kind: local, run_dir: runs, heartbeat_s: 0.5}}
policy:
  model: builtin:tiny-gpt
  config: {{preset: tiny, n_layer: 2, n_embd: 64, n_head: 4}}
domains:
  arithmetic: {{source: builtin:arithmetic, verifier: math}}
actors:
  generator: {{max_batch_size: 32, device: cpu, serve: true, resources: {{num_cpus: 1}}}}
  gateway:
    port: 0
    max_concurrency: {slots}
    max_streams: {slots}
    max_tokens: 64
    default_max_tokens: 16
    max_body_bytes: 65536
    body_timeout_s: {body_timeout_s}
    request_timeout_s: 60
    default_domain: arithmetic
    resources: {{num_cpus: 1}}
channels:
  prompts: {{external: true}}
"""
BODY_TIMEOUT_S = 1.0
REPLICAS = [("gateway", 0), ("generator", 0)]


@dataclass
class Tally:
    good_ok: int = 0
    good_429: int = 0
    good_failures: list[str] = field(default_factory=list)
    good_ids: list[str] = field(default_factory=list)
    good_latency: list[float] = field(default_factory=list)
    aborted: int = 0
    slow: Counter[int] = field(default_factory=Counter)
    bad: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)  # a bad or slow client answered otherwise than expected


def _bad_requests(host: str) -> list[tuple[str, dict[str, str], bytes, int]]:
    """``(name, headers, body, expected status)`` of every kind of bad request the soak sends."""
    chat = orjson.dumps({"model": "flywheel", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    json_type = {"Content-Type": "application/json"}
    return [
        ("invalid_json", json_type, b'{"model": "flywheel", "messages": [', 400),
        ("no_messages", json_type, b'{"model": "flywheel"}', 400),
        ("text_plain", {"Content-Type": "text/plain"}, chat, 415),
        ("form", {"Content-Type": "application/x-www-form-urlencoded"}, b"model=flywheel", 415),
        ("untrusted_host", {**json_type, "Host": "rebound.example"}, chat, 400),
        ("cross_origin", {**json_type, "Origin": "http://evil.example"}, chat, 403),
        ("unknown_domain", {**json_type, "x-flywheel-domain": "poetry"}, chat, 400),
        ("unknown_model", json_type, chat.replace(b'"flywheel"', b'"gpt-9"'), 404),
        ("too_many_tokens", json_type, chat.replace(b'"max_tokens":4', b'"max_tokens":4000'), 400),
        ("too_large", json_type, b'{"model": "flywheel", "prompt": "' + b"x" * 70000 + b'"}', 413),
    ]


async def _good(client: httpx.AsyncClient, tally: Tally, stop_at: float, rng: random.Random) -> None:
    n = 0
    while time.monotonic() < stop_at:
        n += 1
        stream, chat = n % 3 == 0, rng.random() < 0.5
        tokens = rng.randint(4, 32)
        text = f"{rng.randint(0, 99)} + {rng.randint(0, 99)} = "
        body: dict[str, Any]
        if chat:
            path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}
        else:
            path, body = "/v1/completions", {"prompt": text}
        body.update(model="flywheel", max_tokens=tokens, temperature=1.0, stream=stream)
        started = time.perf_counter()
        for _ in range(200):
            status, request_id, problem = await (_stream(client, path, body) if stream else _plain(client, path, body))
            if status != 429:
                break
            tally.good_429 += 1
            await asyncio.sleep(0.05)
        if status == 200 and request_id and not problem:
            tally.good_ok += 1
            tally.good_ids.append(request_id)
            tally.good_latency.append(time.perf_counter() - started)
        else:
            tally.good_failures.append(f"{path} stream={stream}: HTTP {status} {problem}"[:300])


async def _plain(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> tuple[int, str, str]:
    try:
        response = await client.post(path, json=body)
    except httpx.HTTPError as exc:
        return 0, "", f"{type(exc).__name__}: {exc}"
    if response.status_code != 200:
        return response.status_code, "", response.text[:200]
    doc = response.json()
    ok = doc.get("id") == response.headers.get("x-request-id") and bool(doc.get("choices"))
    return 200, str(doc.get("id", "")), "" if ok else "malformed body"


async def _stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> tuple[int, str, str]:
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                return response.status_code, "", (await response.aread()).decode()[:200]
            request_id, done = response.headers.get("x-request-id", ""), False
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith('data: {"error"'):
                    return 200, request_id, line[:200]
            return 200, request_id, "" if done else "stream ended without [DONE]"
    except httpx.HTTPError as exc:
        return 0, "", f"{type(exc).__name__}: {exc}"


def _request_bytes(host: str, path: str, body: bytes, length: int | None = None) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    ).encode() + body


async def _aborter(host: str, port: int, tally: Tally, stop_at: float, rng: random.Random) -> None:
    while time.monotonic() < stop_at:
        stream = rng.random() < 0.5
        body = orjson.dumps(
            {"model": "flywheel", "prompt": "count: ", "max_tokens": 64, "temperature": 1.0, "stream": stream}
        )
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.write(_request_bytes(f"{host}:{port}", "/v1/completions", body))
        await asyncio.sleep(rng.uniform(0.005, 0.1))
        if rng.random() < 0.5:  # a reset instead of a close: SO_LINGER 0
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass
        tally.aborted += 1
        await asyncio.sleep(0.02)


async def _read_until_closed(reader: asyncio.StreamReader, into: bytearray) -> None:
    """Read until the gateway closes. A reset ends it too: a byte the slow client sends after the gateway answered
    and closed draws a RST, and what was read before it is still the answer."""
    try:
        while chunk := await reader.read(65536):
            into.extend(chunk)
    except ConnectionResetError:
        pass


async def _slow(host: str, port: int, tally: Tally, stop_at: float) -> None:
    body = orjson.dumps({"model": "flywheel", "messages": [{"role": "user", "content": "slow " * 20}]})
    while time.monotonic() < stop_at:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.write(_request_bytes(f"{host}:{port}", "/v1/chat/completions", body[:10], length=len(body)))
        answer = bytearray()
        read = asyncio.ensure_future(_read_until_closed(reader, answer))
        for offset in range(10, len(body)):
            done, _ = await asyncio.wait({read}, timeout=0.3)
            if done:
                break
            writer.write(body[offset : offset + 1])
        try:
            await asyncio.wait_for(read, BODY_TIMEOUT_S + 10)
        except (TimeoutError, OSError) as exc:
            tally.unexpected.append(f"slow: {type(exc).__name__}")
        writer.close()
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
        tally.slow[status] += 1
        if status != 408:
            tally.unexpected.append(f"slow: HTTP {status} {bytes(answer[:200])!r}")


async def _bad(client: httpx.AsyncClient, host: str, tally: Tally, stop_at: float, offset: int) -> None:
    cases = _bad_requests(host)
    n = offset
    while time.monotonic() < stop_at:
        name, headers, body, expected = cases[n % len(cases)]
        n += 1
        try:
            response = await client.post("/v1/chat/completions", content=body, headers=headers)
            status = response.status_code
        except httpx.HTTPError as exc:
            tally.unexpected.append(f"bad {name}: {type(exc).__name__}")
            continue
        tally.bad[name] += 1
        if status != expected:
            tally.unexpected.append(f"bad {name}: HTTP {status}, expected {expected}: {response.text[:200]}")
        await asyncio.sleep(0.01)


async def _sample_memory(bus: Bus, samples: list[tuple[float, float, float]], stop_at: float) -> None:
    for _ in range(100):  # both replicas report within a few heartbeats of starting
        beats = await heartbeats(bus, REPLICAS)
        if set(beats) == {"gateway", "generator"}:
            break
        await asyncio.sleep(0.1)
    else:
        raise RuntimeError(f"no heartbeat from {sorted({'gateway', 'generator'} - set(beats))} within 10 s")
    processes = {actor: psutil.Process(beats[actor].pid) for actor in ("gateway", "generator")}
    started = time.monotonic()
    while time.monotonic() < stop_at:
        mib = {actor: p.memory_info().rss / 2**20 for actor, p in processes.items()}
        samples.append((time.monotonic() - started, mib["gateway"], mib["generator"]))
        await asyncio.sleep(2.0)


async def _traffic_ids(bus: Bus) -> Counter[str]:
    """How many times each request id is stored on ``traffic`` (read with a fresh consumer group)."""
    info = await bus.nc.jetstream().stream_info(bus.stream("traffic"))
    wanted, ids = int(info.state.messages), Counter[str]()
    if not wanted:
        return ids
    try:
        async with (
            asyncio.timeout(60),
            bus.consume("traffic", f"soak-check-{int(time.time())}", batch=256) as deliveries,
        ):
            async for delivery in deliveries:
                ids[delivery.id] += 1
                await delivery.ack()
                if sum(ids.values()) >= wanted:
                    break
    except TimeoutError:
        raise RuntimeError(f"read {sum(ids.values())} of the {wanted} traffic records in 60 s") from None
    return ids


async def _settle(bus: Bus, timeout_s: float = 15.0) -> dict[str, dict[str, Any]]:
    """Heartbeat counters once the gateway and the generator hold nothing (or at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        beats = await heartbeats(bus, REPLICAS)
        gateway, generator = beats["gateway"].counters, beats["generator"].counters
        idle = not any(gateway.get(k) for k in ("in_flight", "streams_open", "serve_pending"))
        if (idle and not generator.get("serve_in_flight")) or time.monotonic() > deadline:
            return {"gateway": gateway, "generator": generator}
        await asyncio.sleep(0.5)


def _slope_mib_per_min(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return 60 * sum((t - mean_t) * (v - mean_v) for t, v in points) / var if var else 0.0


async def soak(
    run_dir: Path, url: str, *, duration_s: float, slots: int, aborters: int, slow: int, bad: int
) -> dict[str, Any]:
    """Run the client mix against a running gateway for ``duration_s``; returns the raw figures."""
    host, port = url.removeprefix("http://").split(":")
    tally, samples = Tally(), list[tuple[float, float, float]]()
    rng = random.Random(0)
    good = slots - aborters
    limits = httpx.Limits(max_connections=good + bad + 8, max_keepalive_connections=good + bad + 8)
    await wait_healthy(url)
    async with (
        await connect_run(run_dir, name="soak") as bus,
        httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client,
    ):
        stop_at = time.monotonic() + duration_s
        started = time.monotonic()
        tasks = [
            _sample_memory(bus, samples, stop_at),
            *(_good(client, tally, stop_at, random.Random(i)) for i in range(good)),
            *(_aborter(host, int(port), tally, stop_at, random.Random(100 + i)) for i in range(aborters)),
            *(_slow(host, int(port), tally, stop_at) for _ in range(slow)),
            *(_bad(client, host, tally, stop_at, i) for i in range(bad)),
        ]
        await asyncio.gather(*tasks)
        wall_s = time.monotonic() - started
        counters = await _settle(bus)
        stored = await _traffic_ids(bus)
    del rng
    warm = [s for s in samples if s[0] >= duration_s / 5] or samples
    missing = [i for i in tally.good_ids if stored.get(i, 0) != 1]
    return {
        "duration_s": duration_s,
        "wall_s": round(wall_s, 1),
        "clients": {"good": good, "aborted": aborters, "slow": slow, "bad": bad, "slots": slots},
        "good": {
            "ok": tally.good_ok,
            "failures": len(tally.good_failures),
            "failure_samples": tally.good_failures[:10],
            "retried_429": tally.good_429,
            "recorded_once": len(tally.good_ids) - len(missing),
            "not_recorded_once": len(missing),
            "latency_p50_ms": round(percentile(tally.good_latency, 50) * 1e3, 2) if tally.good_latency else None,
            "latency_p99_ms": round(percentile(tally.good_latency, 99) * 1e3, 2) if tally.good_latency else None,
        },
        "aborted": tally.aborted,
        "slow": {str(k): v for k, v in sorted(tally.slow.items())},
        "bad": dict(sorted(tally.bad.items())),
        "unexpected": len(tally.unexpected),
        "unexpected_samples": tally.unexpected[:10],
        "traffic_stored": sum(stored.values()),
        "memory_mib": {
            "samples": [[round(t, 1), round(g, 2), round(m, 2)] for t, g, m in samples],
            "gateway_after_warmup": round(warm[0][1], 2) if warm else None,
            "gateway_end": round(samples[-1][1], 2) if samples else None,
            "gateway_max": round(max(s[1] for s in samples), 2) if samples else None,
            "gateway_slope_mib_per_min": round(_slope_mib_per_min([(t, g) for t, g, _ in warm]), 3),
            "generator_after_warmup": round(warm[0][2], 2) if warm else None,
            "generator_end": round(samples[-1][2], 2) if samples else None,
            "generator_slope_mib_per_min": round(_slope_mib_per_min([(t, m) for t, _, m in warm]), 3),
        },
        "end_counters": counters,
    }


def run(*, duration_s: float, slots: int = 16, aborters: int = 4, slow: int = 8, bad: int = 2) -> dict[str, Any]:
    """Start the topology, soak it, stop it; the figures of :func:`soak`."""
    name = f"soak{int(time.time() * 1000) % 10**9}"
    with tempfile.TemporaryDirectory(prefix="gateway-soak-") as tmp:
        spec = SPEC.format(name=name, slots=slots, body_timeout_s=BODY_TIMEOUT_S)
        proc, run_dir, url = start(Path(tmp), spec)
        try:
            return asyncio.run(
                soak(run_dir, url, duration_s=duration_s, slots=slots, aborters=aborters, slow=slow, bad=bad)
            )
        finally:
            stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument("--quick", action="store_true", help="30 s instead of --duration")
    parser.add_argument("--slots", type=int, default=16, help="the gateway's max_concurrency")
    parser.add_argument("--aborters", type=int, default=4, help="clients that leave mid-generation")
    parser.add_argument("--slow", type=int, default=8, help="clients that send their body too slowly")
    parser.add_argument("--bad", type=int, default=2, help="clients that send bad requests")
    args = parser.parse_args()
    duration = 30.0 if args.quick else args.duration
    figures = run(duration_s=duration, slots=args.slots, aborters=args.aborters, slow=args.slow, bad=args.bad)
    good, memory = figures["good"], figures["memory_mib"]
    print(
        markdown_table(
            ["good ok", "failed", "429 retried", "recorded once", "p50 ms", "p99 ms", "aborted", "slow", "bad", "odd"],
            [
                [
                    good["ok"],
                    good["failures"],
                    good["retried_429"],
                    good["recorded_once"],
                    good["latency_p50_ms"],
                    good["latency_p99_ms"],
                    figures["aborted"],
                    sum(figures["slow"].values()),
                    sum(figures["bad"].values()),
                    figures["unexpected"],
                ]
            ],
        )
    )
    print()
    print(
        markdown_table(
            ["process", "RSS after warm-up MiB", "RSS end MiB", "slope MiB/min"],
            [
                ["gateway", memory["gateway_after_warmup"], memory["gateway_end"], memory["gateway_slope_mib_per_min"]],
                [
                    "generator",
                    memory["generator_after_warmup"],
                    memory["generator_end"],
                    memory["generator_slope_mib_per_min"],
                ],
            ],
        )
    )
    print(f"\nend: gateway {figures['end_counters']['gateway']}\n     generator {figures['end_counters']['generator']}")
    figures["config"] = {"duration_s": duration, "quick": args.quick}
    path = write_results("gateway_soak", figures)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
