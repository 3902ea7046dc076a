"""Weight flow benchmark: publish → every local generator swapped, per model size and transport.

Measures, in one run on this machine:

- ``memcpy``: one in-memory copy of the same number of bytes (``dst.copy_(src)``), the floor of any path;
- ``object-store``: WeightPublisher → NATS JetStream object store → each generator process's real
  WeightSubscriber (KV watch, fetch, digest check, validation, swap between decode steps);
- ``disk``: the same through a safetensors directory in Hugging Face layout, on /dev/shm when it exists
  (the shared-memory path) — what SGLang/vLLM would load;
- ``broadcast``: a gloo torch.distributed group, rank 0 here and one rank per generator process;
- the decode stall: a TorchEngine decoding a batch while a swap lands, measured in decode steps.

Targets: ≤ 2× memcpy for the disk/shared-memory path, ≤ 5× for the object store, stall ≤ 1 step.
Figures are wall-clock on a shared machine: compare ratios within one run.

    python bench/weights.py --quick        # ~1M / 10M / 100M parameters, 2 generator processes, ≤ 60 s
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.engines import GenerationRequest, SamplingParams, TorchEngine
from actors.engines._group import WeightBroadcaster, describe
from actors.policy import PRESETS, GPTConfig, Policy
from actors.protocol import weights_bucket
from actors.weights import ObjectStoreTransport, SafetensorsDirTransport, WeightPublisher
from bench._common import markdown_table, write_results
from topology.bus import Bus, EmbeddedNats

ROOT = Path(__file__).resolve().parents[1]


def perturbed(state: dict[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]:
    return {name: t + 1e-3 * version for name, t in state.items()}


def memcpy_s(nbytes: int, repeats: int = 3) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - started)
    return best


async def wait_swaps(events: Any, size: str, version: int, ranks: int, timeout_s: float = 60) -> float:
    """Wall-clock time at which the last of ``ranks`` generators reported swapping ``version`` of ``size``."""
    seen: dict[int, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < ranks:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{size} v{version}: only {len(seen)}/{ranks} generators swapped")
        message = await asyncio.wait_for(events.__anext__(), remaining)
        fields = message.payload
        if fields.get("size") != size or fields.get("version") != version:
            continue
        if fields["event"] != "weights.swapped":
            raise RuntimeError(f"generator {fields['rank']} rejected {size} v{version}: {fields.get('reason')}")
        seen[int(fields["rank"])] = float(fields["t"])
    return max(seen.values())


async def decode_stall_steps(policy: Policy, state: dict[str, torch.Tensor]) -> dict[str, float]:
    """Decode a batch, swap weights after step 8, and express the slowest step around the swap in steps."""
    durations: list[float] = []
    last = time.perf_counter()
    swap_at = 8
    engine: TorchEngine

    async def hook(step: int) -> None:
        nonlocal last
        now = time.perf_counter()
        durations.append(now - last)
        if step == swap_at:
            await engine.update_weights(engine.version + 1, state)
        last = time.perf_counter()

    engine = TorchEngine(policy, max_batch_size=8, step_hook=hook, recompute_cache_on_update=False)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, ignore_eos=True, seed=1)
    await engine.generate([GenerationRequest(f"r{i}", (1, 5, 6, 7), params) for i in range(8)])
    await engine.close()
    steady = statistics.median(durations[2:swap_at])
    around = durations[swap_at : swap_at + 2]  # the hook's own swap, then the next step
    swap_cost = sum(around) - len(around) * steady
    return {"median_step_s": steady, "stall_steps": max(0.0, swap_cost / steady)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = args.sizes.split(",")
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with (
        tempfile.TemporaryDirectory(prefix="fw-weights-") as tmp,
        tempfile.TemporaryDirectory(prefix="fw-weights-", dir=shm) as disk_root,
    ):
        server = EmbeddedNats(Path(tmp) / "nats")
        await server.astart()
        workers: list[subprocess.Popen[bytes]] = []
        control = await Bus.connect(server.url, topology="bench-weights", name="bench")
        events = await control.subscribe_ephemeral("bench.swapped")
        ready = await control.subscribe_ephemeral("bench.ready")
        try:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
            for rank in range(1, args.generators + 1):
                workers.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(ROOT / "bench" / "_weights_worker.py"),
                            "--url",
                            server.url,
                            "--rank",
                            str(rank),
                            "--sizes",
                            ",".join(sizes),
                            "--disk-root",
                            disk_root,
                        ],
                        env=env,
                    )
                )
            for _ in workers:
                await asyncio.wait_for(ready.__anext__(), 120)
            broadcaster = WeightBroadcaster("127.0.0.1", _free_port(), world_size=1 + len(workers))
            for rank in range(1, len(workers) + 1):
                await control.publish_ephemeral(
                    f"bench.cmd.{rank}",
                    {"op": "join", "port": broadcaster.master_port, "world": broadcaster.world_size},
                )
            await asyncio.to_thread(broadcaster.connect)
            rows: list[dict[str, Any]] = []
            for size in sizes:
                policy = Policy.tiny_gpt(GPTConfig(**PRESETS[size]), seed=0)
                base = policy.state_dict()
                nbytes = sum(t.numel() * t.element_size() for t in base.values())
                row: dict[str, Any] = {
                    "size": size,
                    "params_m": policy.num_parameters() / 1e6,
                    "mbytes": nbytes / 1e6,
                    "memcpy_s": memcpy_s(nbytes),
                }
                topology = f"bench-{size}"
                bus = await Bus.connect(server.url, topology=topology, name=f"bench-{size}")
                transports = {
                    "object-store": ObjectStoreTransport(bus, weights_bucket(topology)),
                    "disk": SafetensorsDirTransport(disk_root),
                }
                version = 0
                for name, transport in transports.items():
                    times = []
                    for _ in range(args.repeats):
                        version += 1
                        state = perturbed(base, version)
                        started = time.time()
                        await WeightPublisher(bus, topology, transport).publish(version, state)
                        times.append(await wait_swaps(events, size, version, len(workers)) - started)
                    row[f"{name}_s"] = min(times)
                times = []
                for _ in range(args.repeats):
                    version += 1
                    state = perturbed(base, version)
                    names, dtypes, shapes = describe(state)
                    started = time.time()
                    for rank in range(1, len(workers) + 1):
                        await control.publish_ephemeral(
                            f"bench.cmd.{rank}",
                            {
                                "op": "recv",
                                "size": size,
                                "version": version,
                                "names": names,
                                "dtypes": dtypes,
                                "shapes": shapes,
                            },
                        )
                    await asyncio.to_thread(broadcaster.broadcast, state)
                    times.append(await wait_swaps(events, size, version, len(workers)) - started)
                row["broadcast_s"] = min(times)
                row.update(await decode_stall_steps(policy, perturbed(base, 1)))
                await bus.close()
                rows.append(row)
                print(f"  {size}: done", file=sys.stderr)
            broadcaster.close()
        finally:
            for rank in range(1, len(workers) + 1):
                try:
                    await control.publish_ephemeral(f"bench.cmd.{rank}", {"op": "stop"})
                except Exception:
                    pass
            for worker in workers:
                try:
                    worker.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    worker.kill()
            await control.close()
            await server.astop()
    return {"generators": args.generators, "repeats": args.repeats, "rows": rows}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repeat per transport (≤ 60 s)")
    parser.add_argument(
        "--sizes",
        default="tiny,small,medium",
        help="policy presets (tiny≈1M, small≈10M, medium≈100M)",
    )
    parser.add_argument("--generators", type=int, default=2, help="generator processes that must all swap")
    parser.add_argument("--repeats", type=int, default=None, help="best of N per transport (default 1 quick, 3 full)")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    results = asyncio.run(run(args))
    headers = [
        "model",
        "params",
        "MB",
        "memcpy ms",
        "object-store ms (×memcpy)",
        "disk/shm ms (×memcpy)",
        "broadcast ms (×memcpy)",
        "decode step ms",
        "stall (steps)",
    ]
    table_rows = []
    for row in results["rows"]:

        def cell(key: str, row: dict[str, Any] = row) -> str:
            return f"{1000 * row[key]:.1f} ({row[key] / row['memcpy_s']:.1f}×)"

        table_rows.append(
            [
                row["size"],
                f"{row['params_m']:.1f}M",
                f"{row['mbytes']:.0f}",
                f"{1000 * row['memcpy_s']:.2f}",
                cell("object-store_s"),
                cell("disk_s"),
                cell("broadcast_s"),
                f"{1000 * row['median_step_s']:.1f}",
                f"{row['stall_steps']:.2f}",
            ]
        )
    largest = results["rows"][-1]
    results["targets"] = {
        "disk_le_2x_memcpy": largest["disk_s"] <= 2 * largest["memcpy_s"],
        "object_store_le_5x_memcpy": largest["object-store_s"] <= 5 * largest["memcpy_s"],
        "stall_le_1_step": all(r["stall_steps"] <= 1.0 for r in results["rows"]),
    }
    print(markdown_table(headers, table_rows))
    print(f"\ntargets (largest model): {results['targets']}")
    print(f"wrote {write_results('weights', results)}")


if __name__ == "__main__":
    main()
