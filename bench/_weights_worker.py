"""One 'generator' process of bench/weights.py: real engines, a real WeightSubscriber per model size.

It builds a TorchEngine for every size the bench asks for, watches each size's weights key through the
real subscriber (object store, disk or shared-memory transports), and reports every swap with a wall-clock timestamp on
an ephemeral subject. For the broadcast transport it joins the bench's gloo group as rank ``--rank`` and
receives when told to. Started and stopped by bench/weights.py; not meant to be run by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import time
from typing import Any

import nats
import torch

from actors.engines import TorchEngine, WeightGroup, receive_weights
from actors.policy import PRESETS, GPTConfig, Policy
from actors.protocol import weights_bucket
from actors.weights import ObjectStoreTransport, SafetensorsDirTransport, SharedMemoryTransport, WeightSubscriber
from actors.weights._mmap import _pread_all
from topology.bus import Bus


def _read_whole(path: str, buffer: bytearray) -> int:
    """Read the file at ``path`` into ``buffer`` (as many reads as the kernel needs); the bytes read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _pread_all(fd, buffer, 0)
    finally:
        os.close(fd)
    return len(buffer)


async def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    sizes = args.sizes.split(",")
    engines = {
        size: TorchEngine(Policy.tiny_gpt(GPTConfig(**PRESETS[size]), seed=0), max_batch_size=4) for size in sizes
    }
    control = await Bus.connect(args.url, topology="bench-weights", name=f"worker-{args.rank}")
    group: WeightGroup | None = None
    raw: dict[str, torch.Tensor | None] = {}
    raw_nats: Any = None  # a plain nats-py client, for the object store's limit
    raw_files: dict[str, bytearray] = {}  # per size: the buffer the disk path's limit reads into

    def reporter(size: str) -> Any:
        def on_event(event: str, fields: dict[str, Any]) -> None:
            asyncio.get_running_loop().create_task(
                control.publish_ephemeral(
                    "bench.swapped", {"rank": args.rank, "size": size, "event": event, "t": time.time(), **fields}
                )
            )

        return on_event

    tasks = []
    buses = []
    for size in sizes:
        topology = f"bench-{size}"
        bus = await Bus.connect(args.url, topology=topology, name=f"worker-{args.rank}-{size}")
        buses.append(bus)
        transports = {
            "object-store": ObjectStoreTransport(bus, weights_bucket(topology)),
            "disk": SafetensorsDirTransport(args.disk_root),
            "shm": SharedMemoryTransport(args.disk_root),  # a reader: the manifest names the slot
        }
        subscriber = WeightSubscriber(bus, topology, engines[size], transports, on_event=reporter(size))
        tasks.append(asyncio.create_task(subscriber.run()))

    async def done(command: dict[str, Any], transport: str, **extra: Any) -> None:
        """Report a command's version received, as the subscribers' swap events are reported."""
        fields = {"rank": args.rank, "size": command["size"], "event": "weights.swapped", "t": time.time()}
        await control.publish_ephemeral(
            "bench.swapped", {**fields, "version": command["version"], "transport": transport, **extra}
        )

    commands = await control.subscribe_ephemeral(f"bench.cmd.{args.rank}")
    await control.publish_ephemeral("bench.ready", {"rank": args.rank})
    async for message in commands:
        command = message.payload
        if command["op"] == "stop":
            break
        if command["op"] == "join":
            group = await asyncio.to_thread(WeightGroup, "127.0.0.1", command["port"], command["world"], args.rank)
            continue
        if command["op"] == "raw":  # the limit: a bare broadcast of the same bytes into a reused buffer
            assert group is not None
            if raw.get(command["size"]) is None:
                raw[command["size"]] = torch.empty(command["nbytes"], dtype=torch.uint8)
            await asyncio.to_thread(group.broadcast, raw[command["size"]])
            await done(command, "raw-gloo")
            continue
        if command["op"] == "raw-object":  # the object store's limit: nats-py's own get of the same blob, nothing else
            if raw_nats is None:
                raw_nats = await nats.connect(args.url)
            store = await raw_nats.jetstream().object_store(command["bucket"])
            # into a stream: without one, nats-py appends each chunk to a bytes object (quadratic: minutes at 400 MB)
            sink = io.BytesIO()
            await store.get(command["name"], writeinto=sink)
            await done(command, "raw-object-store", nbytes=sink.tell())
            continue
        if command["op"] == "raw-file":  # the disk path's limit: one read of the whole file into a reused buffer
            buffer = raw_files.get(command["size"])
            if buffer is None or len(buffer) != command["nbytes"]:
                buffer = raw_files[command["size"]] = bytearray(command["nbytes"])
            got = await asyncio.to_thread(_read_whole, command["path"], buffer)
            await done(command, "raw-file", nbytes=got)
            continue
        if command["op"] == "recv":  # what a member generator does: receive into the standby weights, swap
            assert group is not None
            engine = engines[command["size"]]
            expected = {name: (tuple(t.shape), t.dtype) for name, t in engine.policy.state_dict().items()}

            async def fill(
                into: dict[str, torch.Tensor] | None,
                command: dict[str, Any] = command,
                group: WeightGroup = group,
                expected: dict[str, Any] = expected,
            ) -> Any:
                return await asyncio.to_thread(
                    receive_weights,
                    group,
                    command["names"],
                    command["dtypes"],
                    command["shapes"],
                    expected,
                    into=into,
                    packed=True,
                )

            await engine.update_weights_from(command["version"], fill)
            await done(command, "broadcast")
    for task in tasks:
        task.cancel()
    for engine in engines.values():
        await engine.close()
    for bus in buses:
        await bus.close()
    await control.close()
    if raw_nats is not None:
        await raw_nats.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--disk-root", required=True)
    asyncio.run(main(parser.parse_args()))
