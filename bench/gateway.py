"""Gateway benchmark: latency the gateway adds over calling the generator directly, per HTTP client, and
``--streams`` concurrent streams.

Setup: ``flywheel up`` runs a real topology in child processes — one generator (builtin tiny GPT,
``serve: true``) and one gateway (``port: 0``). This process is the client. Same engine, same prompts, same
sampling (greedy, ``--new-tokens`` tokens) every way:

* direct (the limit) — the serve protocol over NATS, as the gateway itself calls the generator (``ServeClient``);
* through the gateway — ``POST /v1/completions`` over HTTP/1.1 keep-alive: body parsing and validation,
  tokenization, the same NATS call, the ``traffic`` record (JetStream publish, stored before the response),
  the JSON body. Three clients: ``raw`` (a minimal keep-alive client: one send per request, what the gateway
  adds and nothing else), ``httpx`` (``AsyncClient``) and ``openai`` (the official SDK's ``AsyncOpenAI``,
  ``completions.create``);
* each client against a canned server (``floor``) — a separate process that answers every request at once
  with the very bytes the gateway answered (headers included): what the client itself costs per request.

Each round runs every call once, one at a time, in the same order, so drift in machine load hits all alike.
``added`` = client's percentile through the gateway − the direct call's percentile (what that client sees
on top of the engine; the target applies to it); ``added_minus_floor`` also subtracts the client's own floor
(what the gateway and its extra hop cost). After every round the ``traffic`` stream must hold one more record
per gateway call than before it — a response that arrived before its record was stored would show as a
``recorded_late`` round.

Then ``--streams`` streaming chat requests are opened at once (httpx); an error is any non-200, an error event,
or a stream without ``[DONE]``; ``traffic`` must hold one record per stream.

Usage: python bench/gateway.py [--quick]   (writes bench/results/gateway.json)
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.engines import SamplingParams
from actors.gateway import ServeClient
from actors.policy import CharTokenizer, encode_prompt
from bench._common import markdown_table, percentile, write_results
from bench._flywheel_up import start, stop, wait_healthy
from topology.bus import Bus
from topology.runtime import connect_run

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
CLIENTS = ("raw", "httpx", "openai")
TARGET_MS = {"p50": 2.0, "p99": 10.0}


class RawClient:
    """Minimal HTTP/1.1 keep-alive client (one connection, Content-Length bodies, one send per request)."""

    def __init__(self, url: str) -> None:
        match = re.match(r"http://([^:/]+):(\d+)", url)
        assert match is not None
        self.host, self.port = match.group(1), int(match.group(2))
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes, bytes]:
        """``(status, raw head, body)``."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        raw_head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in raw_head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return int(raw_head.split()[1]), raw_head, await self.reader.readexactly(length)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def canned_server(response_file: str) -> None:
    """``--serve-canned FILE``: answer every HTTP/1.1 request at once with FILE's bytes; prints the port."""
    response = Path(response_file).read_bytes()

    class Canned(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport, self.buffer = transport, b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
                match = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", self.buffer[: end + 2])
                total = end + 4 + (int(match.group(1)) if match else 0)
                if len(self.buffer) < total:
                    return
                self.buffer = self.buffer[total:]
                self.transport.write(response)

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(Canned, "127.0.0.1", 0)  # asyncio: TCP_NODELAY
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(serve())


async def latency(url: str, canned_url: str, bus: Bus, rounds: int, new_tokens: int) -> dict[str, Any]:
    tokenizer = CharTokenizer()
    client = ServeClient(bus.nc, bus.topology)
    await client.start()
    raw, raw_floor = RawClient(url), RawClient(canned_url)
    http = httpx.AsyncClient(base_url=url, timeout=30)
    http_floor = httpx.AsyncClient(base_url=canned_url, timeout=30)
    sdk = openai.AsyncOpenAI(base_url=url + "/v1", api_key="bench", max_retries=0)
    sdk_floor = openai.AsyncOpenAI(base_url=canned_url + "/v1", api_key="bench", max_retries=0)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True).to_wire()
    times: dict[str, list[float]] = {"direct": [], **{c: [] for c in CLIENTS}, **{c + "_floor": [] for c in CLIENTS}}
    js = bus.nc.jetstream()
    stored = int((await js.stream_info(bus.stream("traffic"))).state.messages)
    recorded_late = 0
    try:
        for i in range(rounds + 20):  # the first 20 warm up every path
            prompt = f"{i % 50} + {i % 7} = "
            body = orjson.dumps({"model": "flywheel", "prompt": prompt, "max_tokens": new_tokens, "temperature": 0})
            headers = {"content-type": "application/json"}

            create = partial(sdk.completions.create, model="flywheel", prompt=prompt, max_tokens=new_tokens)
            create_floor = partial(sdk_floor.completions.create, model="flywheel", prompt=prompt, max_tokens=new_tokens)
            calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
                ("direct", partial(_direct, client, f"bench-{i}", encode_prompt(tokenizer, prompt), params)),
                ("raw", partial(raw.post, "/v1/completions", body)),
                ("httpx", partial(http.post, "/v1/completions", content=body, headers=headers)),
                ("openai", partial(create, temperature=0)),
                ("raw_floor", partial(raw_floor.post, "/v1/completions", body)),
                ("httpx_floor", partial(http_floor.post, "/v1/completions", content=body, headers=headers)),
                ("openai_floor", partial(create_floor, temperature=0)),
            ]
            for name, call_once in calls:
                t0 = time.perf_counter()
                result = await call_once()
                elapsed = time.perf_counter() - t0
                status = result[0] if isinstance(result, tuple) else getattr(result, "status_code", 200)
                if status != 200:
                    raise RuntimeError(f"latency run: {name} got HTTP {status}")
                if i >= 20:
                    times[name].append(elapsed)
            now = int((await js.stream_info(bus.stream("traffic"))).state.messages)
            recorded_late += now != stored + len(CLIENTS)
            stored = now
    finally:
        for closable in (raw, raw_floor):
            await closable.close()
        for client_ in (http, http_floor):
            await client_.aclose()
        for api in (sdk, sdk_floor):
            await api.close()
        await client.close()
    return {"times": times, "recorded_late": recorded_late}


async def _direct(client: ServeClient, request_id: str, prompt_ids: list[int], params: dict[str, Any]) -> None:
    call = await client.call(request_id, prompt_ids, params, stream=False, timeout_s=30)
    async for _ in call.messages(30):
        pass
    call.close()


async def canned_response(url: str, new_tokens: int) -> bytes:
    """The gateway's answer to a latency-run request, as raw bytes (head and body)."""
    client = RawClient(url)
    body = orjson.dumps({"model": "flywheel", "prompt": "1 + 2 = ", "max_tokens": new_tokens, "temperature": 0})
    try:
        status, head, payload = await client.post("/v1/completions", body)
    finally:
        await client.close()
    if status != 200:
        raise RuntimeError(f"the gateway answered HTTP {status}")
    return head + payload


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
                        if line.startswith('data: {"error"'):
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
    return {"streams": streams, "errors": len(errors), "error_samples": errors[:5], "wall_s": wall, "chunks": chunks}


async def main_async(args: argparse.Namespace, run_dir: Path, url: str, root: Path) -> dict[str, Any]:
    await wait_healthy(url)
    (root / "canned").write_bytes(await canned_response(url, args.new_tokens))
    canned = subprocess.Popen(
        [sys.executable, __file__, "--serve-canned", str(root / "canned")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert canned.stdout is not None
        canned_url = f"http://127.0.0.1:{int(canned.stdout.readline())}"
        async with await connect_run(run_dir, name="bench") as bus:
            measured = await latency(url, canned_url, bus, args.requests, args.new_tokens)
            info = await bus.nc.jetstream().stream_info(bus.stream("traffic"))
            before = int(info.state.messages)
            streaming = await concurrent_streams(url, args.streams, args.stream_tokens)
            info = await bus.nc.jetstream().stream_info(bus.stream("traffic"))
            streaming["traffic_recorded"] = int(info.state.messages) - before
    finally:
        canned.terminate()
        canned.wait()
    return {**measured, "streaming": streaming}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (CI-sized)")
    parser.add_argument("--requests", type=int, default=None, help="rounds of sequential calls (every path each)")
    parser.add_argument("--new-tokens", type=int, default=4, help="tokens per request in the latency runs")
    parser.add_argument("--streams", type=int, default=256, help="concurrent streams")
    parser.add_argument("--stream-tokens", type=int, default=16, help="tokens per stream")
    parser.add_argument("--serve-canned", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_canned:
        canned_server(args.serve_canned)
        return
    args.requests = args.requests or (300 if args.quick else 2000)
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        proc, run_dir, url = start(Path(tmp), SPEC.format(streams2=max(512, 2 * args.streams)))
        try:
            measured = asyncio.run(main_async(args, run_dir, url, Path(tmp)))
        finally:
            stop(proc)
    times, streaming = measured["times"], measured["streaming"]
    ms = {name: {q: percentile(v, int(q[1:])) * 1e3 for q in ("p50", "p99")} for name, v in times.items()}
    per_client: dict[str, Any] = {}
    for name in CLIENTS:
        added = {q: ms[name][q] - ms["direct"][q] for q in ("p50", "p99")}
        per_client[name] = {
            "through_gateway_ms": ms[name],
            "floor_ms": ms[name + "_floor"],
            "added_ms": added,
            "added_minus_floor_ms": {q: added[q] - ms[name + "_floor"][q] for q in ("p50", "p99")},
            "meets_target": all(added[q] <= TARGET_MS[q] for q in ("p50", "p99")),
        }
    rows = [["direct (limit)", len(times["direct"]), ms["direct"]["p50"], ms["direct"]["p99"], "—", "—", "—", "—"]]
    for name in CLIENTS:
        c = per_client[name]
        rows.append(
            [
                name,
                len(times[name]),
                c["through_gateway_ms"]["p50"],
                c["through_gateway_ms"]["p99"],
                c["added_ms"]["p50"],
                c["added_ms"]["p99"],
                c["floor_ms"]["p50"],
                c["added_minus_floor_ms"]["p50"],
            ]
        )
    headers = ["path", "rounds", "p50 ms", "p99 ms", "added p50", "added p99", "client floor p50", "added − floor p50"]
    print(markdown_table(headers, rows))
    print(f"\ntarget: added p50 ≤ {TARGET_MS['p50']} ms, p99 ≤ {TARGET_MS['p99']} ms for every client")
    print(f"rounds whose responses came before their traffic records were stored: {measured['recorded_late']}\n")
    print(
        markdown_table(
            ["concurrent streams", "errors", "wall s", "chunks", "traffic recorded"],
            [[streaming[k] for k in ("streams", "errors", "wall_s", "chunks", "traffic_recorded")]],
        )
    )
    results = {
        "config": {
            "rounds": args.requests,
            "new_tokens": args.new_tokens,
            "streams": args.streams,
            "stream_tokens": args.stream_tokens,
            "quick": args.quick,
        },
        "limit_direct_ms": ms["direct"],
        "clients": per_client,
        "floors_note": "floor = the same client against a canned server in another process answering the same bytes",
        "target_added_ms": TARGET_MS,
        "recorded_late_rounds": measured["recorded_late"],
        "streaming": streaming,
        "targets": {"streams": args.streams, "errors": 0, "recorded_late_rounds": 0},
        "meets_targets": all(c["meets_target"] for c in per_client.values())
        and streaming["errors"] == 0
        and streaming["traffic_recorded"] == streaming["streams"]
        and measured["recorded_late"] == 0,
        "raw_ms": {name: [round(v * 1e3, 4) for v in values] for name, values in times.items()},
    }
    path = write_results("gateway", results)
    print(f"\nwrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
