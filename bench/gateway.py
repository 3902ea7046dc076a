"""Gateway benchmark: latency the gateway adds over calling the generator directly, and 256 concurrent streams.

Setup: ``flywheel up`` runs a real topology in child processes — one generator (builtin tiny GPT,
``serve: true``) and one gateway (``port: 0``; its URL is read from ``up``'s output). This process is the
client. Same engine, same prompts, same sampling (greedy, ``--new-tokens`` tokens) both ways:

* direct  — the serve protocol over NATS, as the gateway itself calls the generator (``ServeClient``);
* gateway — ``POST /v1/completions`` over HTTP/1.1 keep-alive: body parsing and validation, tokenization,
  the same NATS call, the ``traffic`` record (JetStream publish, acked before the response), the JSON body.

Calls alternate direct/gateway one at a time, so drift in machine load hits both alike; added latency =
gateway percentile − direct percentile. Two HTTP clients are measured: a minimal keep-alive client (what the
gateway adds) and httpx (what a typical Python client sees on top). Then ``--streams`` streaming chat
requests are opened at once (httpx); an error is any non-200, an error event, or a stream without
``[DONE]``; the ``traffic`` channel must hold one record per served request.

Usage: python bench/gateway.py [--quick]   (writes bench/results/gateway.json)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.engines import SamplingParams
from actors.gateway import ServeClient
from actors.policy import CharTokenizer, encode_prompt
from bench._common import markdown_table, percentile, write_results
from topology.bus import Bus

ROOT = Path(__file__).resolve().parents[1]
SPEC = """
name: bench-gateway
bus: {{embedded: true}}
runtime: {{kind: local, run_dir: runs, heartbeat_s: 0.5}}
policy:
  model: builtin:tiny-gpt
  config: {{preset: tiny, n_layer: 2, n_embd: 64, n_head: 4}}
domains:
  arithmetic: {{source: builtin:arithmetic, verifier: math}}
actors:
  generator: {{max_batch_size: 64, device: cpu, serve: true, resources: {{num_cpus: 1}}}}
  gateway: {{port: 0, max_concurrency: {streams2}, max_streams: {streams2}, resources: {{num_cpus: 1}}}}
channels:
  prompts: {{external: true}}
"""


class RawClient:
    """Minimal HTTP/1.1 keep-alive client (one connection, Content-Length bodies only)."""

    def __init__(self, url: str) -> None:
        match = re.match(r"http://([^:/]+):(\d+)", url)
        assert match is not None
        self.host, self.port = match.group(1), int(match.group(2))
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return int(status_line.split()[1]), await self.reader.readexactly(length)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def start_topology(root: Path, streams: int) -> tuple[subprocess.Popen[str], str, str]:
    (root / "spec.yaml").write_text(SPEC.format(streams2=max(512, 2 * streams)))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from topology.cli import main; main()", "up", str(root / "spec.yaml"), "--every", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    bus_url = gateway_url = ""
    deadline = time.monotonic() + 180
    assert proc.stdout is not None
    while not gateway_url and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("flywheel up exited before the gateway listened")
        if line.startswith("bus:"):
            bus_url = line.split()[1]
        elif line.startswith("gateway:"):
            gateway_url = line.split()[1]
    if not gateway_url:
        raise RuntimeError("the gateway did not report its URL within 180 s")
    return proc, bus_url, gateway_url


async def wait_served(url: str) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(600):
            try:
                if (await client.get(url + "/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("the gateway never became healthy")


async def latency(url: str, bus: Bus, requests: int, new_tokens: int) -> dict[str, list[float]]:
    tokenizer = CharTokenizer()
    client = ServeClient(bus.nc, bus.topology)
    await client.start()
    raw = RawClient(url)
    http = httpx.AsyncClient(base_url=url, timeout=30)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True).to_wire()
    times: dict[str, list[float]] = {"direct": [], "gateway": [], "gateway_httpx": []}
    try:
        for i in range(requests + 20):  # the first 20 warm up every path
            prompt = f"{i % 50} + {i % 7} = "
            body = orjson.dumps({"model": "flywheel", "prompt": prompt, "max_tokens": new_tokens, "temperature": 0})
            t0 = time.perf_counter()
            call = await client.call(f"bench-{i}", encode_prompt(tokenizer, prompt), params, stream=False, timeout_s=30)
            async for _ in call.messages(30):
                pass
            call.close()
            t1 = time.perf_counter()
            status, _ = await raw.post("/v1/completions", body)
            t2 = time.perf_counter()
            response = await http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
            t3 = time.perf_counter()
            if status != 200 or response.status_code != 200:
                raise RuntimeError(f"latency run: HTTP {status} / {response.status_code}")
            if i >= 20:
                times["direct"].append(t1 - t0)
                times["gateway"].append(t2 - t1)
                times["gateway_httpx"].append(t3 - t2)
    finally:
        await raw.close()
        await http.aclose()
        await client.close()
    return times


async def concurrent_streams(url: str, streams: int, new_tokens: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
    errors: list[str] = []
    chunks = 0

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal chunks
        body = {
            "model": "flywheel",
            "messages": [{"role": "user", "content": f"stream {i}: 12+7="}],
            "max_tokens": new_tokens,
            "temperature": 1.0,
            "stream": True,
        }
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code != 200:
                    errors.append(f"HTTP {response.status_code}")
                    return
                done = False
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        if b'"error"' in line.encode()[:20]:
                            errors.append(line[:200])
                        chunks += 1
                if not done:
                    errors.append("stream ended without [DONE]")
        except httpx.HTTPError as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(streams)))
        wall = time.perf_counter() - t0
    return {
        "streams": streams,
        "errors": len(errors),
        "error_samples": errors[:5],
        "wall_s": round(wall, 3),
        "chunks": chunks,
    }


async def traffic_count(bus: Bus) -> int:
    info = await bus.nc.jetstream().stream_info(bus.stream("traffic"))
    return int(info.state.messages)


async def main_async(args: argparse.Namespace, bus_url: str, url: str) -> dict[str, Any]:
    await wait_served(url)
    async with await Bus.connect(bus_url, topology="bench-gateway", name="bench") as bus:
        times = await latency(url, bus, args.requests, args.new_tokens)
        before = await traffic_count(bus)
        streaming = await concurrent_streams(url, args.streams, args.stream_tokens)
        streaming["traffic_recorded"] = await traffic_count(bus) - before
    return {"times": times, "streaming": streaming}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests (CI-sized)")
    parser.add_argument("--requests", type=int, default=None, help="sequential requests per path")
    parser.add_argument("--new-tokens", type=int, default=4, help="tokens per request in the latency runs")
    parser.add_argument("--streams", type=int, default=256, help="concurrent streams")
    parser.add_argument("--stream-tokens", type=int, default=16, help="tokens per stream")
    args = parser.parse_args()
    args.requests = args.requests or (300 if args.quick else 2000)
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        proc, bus_url, url = start_topology(Path(tmp), args.streams)
        try:
            measured = asyncio.run(main_async(args, bus_url, url))
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    times, streaming = measured["times"], measured["streaming"]
    ms = {name: {"p50": percentile(v, 50) * 1e3, "p99": percentile(v, 99) * 1e3} for name, v in times.items()}
    added = {
        client: {q: ms[client][q] - ms["direct"][q] for q in ("p50", "p99")} for client in ("gateway", "gateway_httpx")
    }
    rows = [
        [
            name,
            len(times[name]),
            ms[name]["p50"],
            ms[name]["p99"],
            added[name]["p50"] if name in added else "—",
            added[name]["p99"] if name in added else "—",
        ]
        for name in ("direct", "gateway", "gateway_httpx")
    ]
    print(markdown_table(["path", "requests", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms"], rows))
    print()
    print(
        markdown_table(
            ["concurrent streams", "errors", "wall s", "chunks", "traffic recorded"],
            [
                [
                    streaming["streams"],
                    streaming["errors"],
                    streaming["wall_s"],
                    streaming["chunks"],
                    streaming["traffic_recorded"],
                ]
            ],
        )
    )
    results = {
        "config": {
            "requests": args.requests,
            "new_tokens": args.new_tokens,
            "streams": args.streams,
            "stream_tokens": args.stream_tokens,
            "quick": args.quick,
        },
        "latency_ms": {name: {q: round(v, 3) for q, v in values.items()} for name, values in ms.items()},
        "added_latency_ms": {name: {q: round(v, 3) for q, v in values.items()} for name, values in added.items()},
        "added_p50_ms": round(added["gateway"]["p50"], 3),
        "added_p99_ms": round(added["gateway"]["p99"], 3),
        "streaming": streaming,
        "errors": streaming["errors"],
        "targets": {"added_p50_ms_max": 2.0, "errors": 0},
        "meets_targets": added["gateway"]["p50"] <= 2.0
        and streaming["errors"] == 0
        and streaming["traffic_recorded"] == streaming["streams"] - streaming["errors"],
    }
    path = write_results("gateway", results)
    print(f"\nwrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
