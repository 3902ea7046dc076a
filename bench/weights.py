"""Weight flow benchmark: publish → every local generator swapped, per model size and transport.

Measures, in one run on this machine (each version is the last one stepped in place, as a learner's optimizer
writes its parameters):

- ``memcpy``: one in-memory copy of the same number of bytes (``dst.copy_(src)``), the floor of any path;
- ``object-store``: WeightPublisher → NATS JetStream object store → each generator process's real
  WeightSubscriber (KV watch, fetch, digest check, validation, swap between decode steps);
- ``nats-py's own`` object store, the library's path: the same blob serialized, ``put`` and ``get`` (into a stream)
  by each generator process with nats-py's calls alone (no validation, digest check or swap);
- ``disk``: the same through a safetensors directory in Hugging Face layout, on /dev/shm when it exists
  — what SGLang/vLLM would load. Versions are published back to back here, seconds
  apart in a run, so before each the bench waits for the transport's file allocated ahead (as a run's would be);
- ``raw file``: the limit of that path: the same bytes written with one ``pwrite`` into a file allocated ahead on
  the same filesystem, and each generator process reading the whole file into a buffer it reuses (two kernel
  copies, nothing else);
- ``shm``: the shared-memory slots (the local runtime's default with torch engines): the learner copies into a
  slot, each generator's engine serves from views of its mapping (no copy on the generators' side);
- every transport's first version is a warm-up (the generators' standby weights are allocated then), not timed,
  and shm's first two (a run's slots are allocated and mapped by its first versions);
- ``broadcast``: a gloo torch.distributed group, rank 0 here and one rank per generator process, each receiving
  into its engine's standby weights and swapping;
- ``raw gloo``: the limit of that path: one bare gloo broadcast of the same number of bytes into a buffer each
  rank reuses, reported the same way (an ephemeral message per rank);
- the decode stall: a TorchEngine decoding a batch while an update lands from a task of its own (as a subscriber
  applies one), the longest step meanwhile beyond the median, in decode steps: for a copying update (the object
  store, disk) and for one from a shared-memory slot; the median of ``--stall-repeats`` updates (each on a fresh
  engine; the target applies to it) and the largest beside it.

Targets (issue 27), at sizes ≥ 40 MB where bandwidth dominates: disk/shared memory ≤ 2× memcpy (both rows),
object store ≤ 5× memcpy, gloo ≥ 50 % of the raw gloo broadcast's speed; the stall ≤ 1 step at every size.
The JSON holds each row's raw seconds, the ratios, and ``checks``: [measured, target] side by side. Figures are
wall-clock on a shared machine: compare ratios within one run.

    python bench/weights.py --quick        # ~1M / 10M / 100M parameters, 2 generator processes, ≤ 60 s
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.engines import GenerationRequest, SamplingParams, TorchEngine
from actors.engines._group import WeightBroadcaster, describe
from actors.policy import PRESETS, GPTConfig, Policy
from actors.protocol import weights_bucket
from actors.testing import free_port
from actors.weights import (
    ObjectStoreTransport,
    SafetensorsDirTransport,
    SharedMemoryTransport,
    WeightManifest,
    WeightPublisher,
)
from actors.weights._mmap import _pwrite_all, serialize_safetensors
from bench._common import markdown_table, write_results
from topology.bus import Bus, EmbeddedNats

ROOT = Path(__file__).resolve().parents[1]
# publish -> every generator swapped, as a multiple of the limit (memcpy of the weights; a raw gloo broadcast of
# the same bytes), at sizes where bandwidth dominates; the stall of decoding, in decode steps, at every size
TARGETS = {
    "min_mbytes": 40.0,
    "disk_x_memcpy": 2.0,
    "shm_x_memcpy": 2.0,
    "object_store_x_memcpy": 5.0,
    "raw_gloo_over_ours": 0.5,
    "stall_steps": 1.0,
}


def perturbed(state: dict[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]:
    return {name: t + 1e-3 * version for name, t in state.items()}


def step_in_place(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The next version, written over the last one: a learner's optimizer step updates its parameters in place, so
    what it publishes is the same memory every time (fresh tensors per version would cost the first copy out of
    them page faults that no learner pays)."""
    for t in state.values():
        t.add_(1e-3)
    return state


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


async def raw_object_store(
    control: Bus, url: str, size: str, live: dict[str, torch.Tensor], version: int, ranks: int, events: Any
) -> tuple[float, int]:
    """The object store's limit: nats-py's own calls — serialize the version as the transport does, ``put`` it, and
    each generator process ``get``s it — with no validation, no digest check and no swap (``put`` takes ``bytes``: one
    copy of the blob more than the transport makes, a memcpy against the hundred the path costs). The second of two
    versions (the first warms the bucket up), numbered ``version + 1`` on; returns it and the last version."""
    import nats

    client = await nats.connect(url)
    js = client.jetstream()
    bucket = f"bench-raw-{size}"
    store = await js.create_object_store(bucket)
    took = 0.0
    try:
        for _ in range(2):
            version += 1
            state = step_in_place(live)
            started = time.time()
            blob = await asyncio.to_thread(serialize_safetensors, state, metadata={"format": "pt"})
            await store.put("weights", bytes(blob))
            command = {"op": "raw-object", "bucket": bucket, "name": "weights", "size": size, "version": version}
            for rank in range(1, ranks + 1):
                await control.publish_ephemeral(f"bench.cmd.{rank}", command)
            # nats-py reads an object through a flow-controlled push consumer, a thread hop per chunk into the sink
            took = await wait_swaps(events, size, version, ranks, timeout_s=300) - started
    finally:
        await js.delete_object_store(bucket)
        await client.close()
    return took, version


async def raw_file(
    control: Bus, root: str, size: str, live: dict[str, torch.Tensor], version: int, ranks: int, events: Any
) -> tuple[float, int]:
    """The disk path's limit: the version's bytes, serialized beforehand (not timed), written with ``pwrite`` into a
    file of their size allocated ahead on the same filesystem (as the transport's next file is), then each generator
    process reads the whole file with one ``readinto`` into a buffer it reuses — two kernel copies and nothing else:
    no header, no check of the values, no swap. The second of two versions (the first sizes the readers' buffers),
    numbered ``version + 1`` on; returns it and the last version."""
    path = Path(root) / f"raw-{size}.bin"
    took = 0.0
    try:
        for _ in range(2):
            version += 1
            blob = memoryview(serialize_safetensors(step_in_place(live), metadata={"format": "pt"}))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, len(blob))
                started = time.time()
                _pwrite_all(fd, blob, 0)
            finally:
                os.close(fd)
            command = {"op": "raw-file", "path": str(path), "nbytes": len(blob), "size": size, "version": version}
            for rank in range(1, ranks + 1):
                await control.publish_ephemeral(f"bench.cmd.{rank}", command)
            took = await wait_swaps(events, size, version, ranks) - started
    finally:
        path.unlink(missing_ok=True)
    return took, version


async def decode_stall_steps(
    policy: Policy, state: dict[str, torch.Tensor], slots: SharedMemoryTransport | None = None
) -> dict[str, float]:
    """Decode a batch while an update lands the way a generator's subscriber applies one (a task of its own,
    concurrent with decoding), and express the longest step while it was under way, beyond the median step, in
    decode steps: the time decoding stood still for the swap (validation, copy, exchange; the cache is kept).
    The engine is in its steady state, as in a run after its first versions: two updates before the decoding
    (its standby set exists; with ``slots``, the update comes from a shared-memory slot the engine has served
    from before, written by the learner's side before the decoding starts)."""
    stamps: list[float] = []
    swap: dict[str, float] = {}
    swap_after = 8
    published: dict[int, WeightManifest] = {}

    async def publish(version: int) -> None:  # the learner's side, never timed
        if slots is not None:
            published[version] = await slots.put(version, state)

    async def apply(version: int) -> None:
        if slots is None:
            await engine.update_weights(version, state)
        else:
            manifest = published[version]
            await engine.update_weights_from(version, lambda into: slots.get(manifest, into=into))

    async def hook(step: int) -> None:
        stamps.append(time.perf_counter())
        if step == swap_after:
            asyncio.get_running_loop().create_task(update())

    async def update() -> None:
        swap["start"] = time.perf_counter()
        await apply(3)
        swap["end"] = time.perf_counter()

    engine = TorchEngine(policy, max_batch_size=8, step_hook=hook, recompute_cache_on_update=False)
    for version in (1, 2):
        await publish(version)
        await apply(version)
    await publish(3)  # into the first slot: let go by v2
    params = SamplingParams(max_new_tokens=48, temperature=1.0, ignore_eos=True, seed=1)
    await engine.generate([GenerationRequest(f"r{i}", (1, 5, 6, 7), params) for i in range(8)])
    await engine.close()
    steps = [later - earlier for earlier, later in itertools.pairwise(stamps)]
    steady = statistics.median(steps[1:swap_after])
    if "end" not in swap:
        raise RuntimeError("the update did not finish while the batch decoded: raise max_new_tokens")
    # every step that ended after the update started, up to the first step that began after it ended
    during = [d for d, end in zip(steps, stamps[1:], strict=False) if end > swap["start"] and end - d <= swap["end"]]
    longest = max(during, default=steady)
    return {
        "median_step_s": steady,
        "swap_s": swap["end"] - swap["start"],
        "stall_steps": max(0.0, longest - steady) / steady,
    }


async def stall_once(size: str, base: dict[str, torch.Tensor], slots: Path | None = None) -> dict[str, float]:
    """One update's stall on an engine of its own (a copying update, or one from shared-memory ``slots``)."""
    policy = Policy.tiny_gpt(GPTConfig(**PRESETS[size]), seed=0)
    transport = SharedMemoryTransport(slots) if slots is not None else None
    return await decode_stall_steps(policy, perturbed(base, 1), transport)


async def stalls(repeats: int, measure: Callable[[], Awaitable[dict[str, float]]]) -> dict[str, Any]:
    """``repeats`` updates landing while a batch decodes, each on a fresh engine: the median of each figure, and
    the largest stall beside it (one update's stall is a few milliseconds of one step: scheduling moves it)."""
    samples = [await measure() for _ in range(repeats)]
    out: dict[str, Any] = {key: statistics.median(s[key] for s in samples) for key in samples[0]}
    out["stall_steps_max"] = max(s["stall_steps"] for s in samples)
    out["stall_samples"] = [round(s["stall_steps"], 3) for s in samples]
    return out


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
            broadcaster = WeightBroadcaster("127.0.0.1", free_port(), world_size=1 + len(workers))
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
                live = {name: t.clone() for name, t in base.items()}  # the learner's parameters
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
                    "shm": SharedMemoryTransport(Path(disk_root) / f"slots-{size}"),
                }
                version = 0
                for name, transport in transports.items():
                    publisher = WeightPublisher(bus, topology, transport)  # one per run, as a learner keeps it
                    times = []
                    # the first publishes are warm-ups: steady state is measured (the shared-memory slots are
                    # allocated and mapped by a run's first two versions; the standby weights by the first)
                    warm = 2 if name == "shm" else 1
                    for repeat in range(args.repeats + warm):
                        version += 1
                        state = step_in_place(live)
                        if isinstance(transport, SafetensorsDirTransport):  # a run publishes seconds apart:
                            await asyncio.to_thread(transport.wait_tidy)  # the next version's file is allocated
                        started = time.time()
                        await publisher.publish(version, state)
                        took = await wait_swaps(events, size, version, len(workers)) - started
                        if repeat >= warm:
                            times.append(took)
                    row[f"{name}_s"] = min(times)
                row["raw_object_store_s"], version = await raw_object_store(
                    control, server.url, size, live, version, len(workers), events
                )
                row["raw_disk_s"], version = await raw_file(
                    control, disk_root, size, live, version, len(workers), events
                )
                times = []
                for _ in range(args.repeats):
                    version += 1
                    state = step_in_place(live)
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
                    await asyncio.to_thread(partial(broadcaster.broadcast, state, packed=True))
                    times.append(await wait_swaps(events, size, version, len(workers)) - started)
                row["broadcast_s"] = min(times)
                # the limit of that path: one raw gloo broadcast of the same bytes into a buffer each rank reuses
                flat = torch.empty(nbytes, dtype=torch.uint8)
                times = []
                for _ in range(args.repeats + 1):  # the first one sizes the receivers' buffers
                    version += 1
                    started = time.time()
                    for rank in range(1, len(workers) + 1):
                        await control.publish_ephemeral(
                            f"bench.cmd.{rank}", {"op": "raw", "size": size, "version": version, "nbytes": nbytes}
                        )
                    await asyncio.to_thread(broadcaster._group.broadcast, flat)  # type: ignore[union-attr]
                    times.append(await wait_swaps(events, size, version, len(workers)) - started)
                row["raw_gloo_s"] = min(times[1:])
                row.update(await stalls(args.stall_repeats, partial(stall_once, size, base)))
                slots = Path(disk_root) / f"stall-{size}"
                shared = await stalls(args.stall_repeats, partial(stall_once, size, base, slots))
                row.update({f"shm_{key}": value for key, value in shared.items()})
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
    parser.add_argument("--stall-repeats", type=int, default=5, help="updates per decode-stall figure (median, max)")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    results = asyncio.run(run(args))
    headers = [
        "model",
        "params",
        "MB",
        "memcpy ms",
        "object-store ms (×memcpy; nats-py's own ms, ×memcpy)",
        "disk ms (×memcpy; raw file ms, ×memcpy)",
        "shm ms (×memcpy)",
        "gloo ms (raw gloo ms, raw/ours)",
        "decode step ms",
        "swap ms",
        "stall (steps), median (max): copy / shm",
    ]
    table_rows = []
    checks: list[dict[str, Any]] = []
    for row in results["rows"]:

        def cell(key: str, row: dict[str, Any] = row) -> str:
            return f"{1000 * row[key]:.1f} ({row[key] / row['memcpy_s']:.1f}×)"

        row["ratios"] = {
            "disk_x_memcpy": row["disk_s"] / row["memcpy_s"],
            "shm_x_memcpy": row["shm_s"] / row["memcpy_s"],
            "object_store_x_memcpy": row["object-store_s"] / row["memcpy_s"],
            "raw_object_store_x_memcpy": row["raw_object_store_s"] / row["memcpy_s"],
            "raw_object_store_over_ours": row["raw_object_store_s"] / row["object-store_s"],
            "raw_disk_x_memcpy": row["raw_disk_s"] / row["memcpy_s"],
            "raw_disk_over_ours": row["raw_disk_s"] / row["disk_s"],
            "raw_gloo_over_ours": row["raw_gloo_s"] / row["broadcast_s"],
        }
        table_rows.append(
            [
                row["size"],
                f"{row['params_m']:.1f}M",
                f"{row['mbytes']:.0f}",
                f"{1000 * row['memcpy_s']:.2f}",
                f"{1000 * row['object-store_s']:.1f} ({row['ratios']['object_store_x_memcpy']:.1f}×; "
                f"{1000 * row['raw_object_store_s']:.1f}, {row['ratios']['raw_object_store_x_memcpy']:.0f}×)",
                f"{1000 * row['disk_s']:.1f} ({row['ratios']['disk_x_memcpy']:.1f}×; "
                f"{1000 * row['raw_disk_s']:.1f}, {row['ratios']['raw_disk_x_memcpy']:.1f}×)",
                cell("shm_s"),
                f"{1000 * row['broadcast_s']:.1f} ({1000 * row['raw_gloo_s']:.1f}, "
                f"{row['ratios']['raw_gloo_over_ours']:.0%})",
                f"{1000 * row['median_step_s']:.1f}",
                f"{1000 * row['swap_s']:.1f}",
                f"{row['stall_steps']:.2f} ({row['stall_steps_max']:.2f}) / "
                f"{row['shm_stall_steps']:.2f} ({row['shm_stall_steps_max']:.2f})",
            ]
        )
        bandwidth = row["mbytes"] >= TARGETS["min_mbytes"]  # the size targets hold where bandwidth dominates
        checks.append(
            {
                "size": row["size"],
                "mbytes": row["mbytes"],
                "disk_x_memcpy": [row["ratios"]["disk_x_memcpy"], TARGETS["disk_x_memcpy"]] if bandwidth else None,
                "shm_x_memcpy": [row["ratios"]["shm_x_memcpy"], TARGETS["shm_x_memcpy"]] if bandwidth else None,
                "object_store_x_memcpy": [row["ratios"]["object_store_x_memcpy"], TARGETS["object_store_x_memcpy"]]
                if bandwidth
                else None,
                "raw_gloo_over_ours": [row["ratios"]["raw_gloo_over_ours"], TARGETS["raw_gloo_over_ours"]]
                if bandwidth
                else None,
                "stall_steps": [row["stall_steps"], TARGETS["stall_steps"]],  # the median of the updates
                "shm_stall_steps": [row["shm_stall_steps"], TARGETS["stall_steps"]],
                # the limits of the two paths through a medium, as multiples of memcpy, beside their targets
                "raw_disk_x_memcpy": row["ratios"]["raw_disk_x_memcpy"] if bandwidth else None,
                "raw_object_store_x_memcpy": row["ratios"]["raw_object_store_x_memcpy"] if bandwidth else None,
                "stall_steps_max": row["stall_steps_max"],  # the worst update, beside it
                "shm_stall_steps_max": row["shm_stall_steps_max"],
            }
        )
    results["targets"] = TARGETS
    results["checks"] = checks  # [measured, target] per row; memcpy and raw gloo are the limits, in each row
    results["pass"] = {
        "disk": all(c["disk_x_memcpy"] is None or c["disk_x_memcpy"][0] <= TARGETS["disk_x_memcpy"] for c in checks),
        "shm": all(c["shm_x_memcpy"] is None or c["shm_x_memcpy"][0] <= TARGETS["shm_x_memcpy"] for c in checks),
        "object_store": all(
            c["object_store_x_memcpy"] is None or c["object_store_x_memcpy"][0] <= TARGETS["object_store_x_memcpy"]
            for c in checks
        ),
        "gloo": all(
            c["raw_gloo_over_ours"] is None or c["raw_gloo_over_ours"][0] >= TARGETS["raw_gloo_over_ours"]
            for c in checks
        ),
        "stall": all(c["stall_steps"][0] <= TARGETS["stall_steps"] for c in checks),
        "stall_shm": all(c["shm_stall_steps"][0] <= TARGETS["stall_steps"] for c in checks),
    }
    print(markdown_table(headers, table_rows))
    print(f"\ntargets (sizes >= {TARGETS['min_mbytes']} MB; stall: every size): {results['pass']}")
    print(f"wrote {write_results('weights', results)}")


if __name__ == "__main__":
    main()
