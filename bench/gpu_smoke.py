"""GPU smoke: the builtin torch engine generating on a device, and a weight swap landing between its decode steps.

For each policy preset: builds a :class:`~actors.engines.TorchEngine` on ``--device``, decodes a batch (tokens/s),
then publishes new weights through the disk transport (safetensors in shared memory, as the embedded loop's
generators receive them) and swaps them in while a batch decodes, from a task beside the decoding as a
generator's subscriber does; the stall is the longest step meanwhile beyond the median, in steps. Checks that
every token is tagged with a version that exists, that tokens after the swap carry the new version, and that the
new weights are the ones served (the live parameters equal the published ones). Prints one JSON document (also
written to ``--out``).

    python bench/gpu_smoke.py --device cuda --out /tmp/smoke.json
    python bench/gpu_smoke.py --device cpu                          # rehearse it anywhere
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.engines import GenerationRequest, SamplingParams, TorchEngine
from actors.policy import PRESETS, GPTConfig, Policy
from actors.weights import SafetensorsDirTransport


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


async def one_size(preset: str, device: str, root: Path, batch: int, new_tokens: int) -> dict[str, Any]:
    policy = Policy.tiny_gpt(GPTConfig(**PRESETS[preset]), seed=0).to(device)
    transport = SafetensorsDirTransport(root / preset)
    published = {name: t.detach().cpu() + 1e-3 for name, t in policy.state_dict().items()}
    manifest = await transport.put(1, published)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True, seed=1)
    requests = [GenerationRequest(f"r{i}", (1, 5, 6, 7), params) for i in range(batch)]
    # throughput: no hook (several steps per hop to the decode thread)
    plain = TorchEngine(policy, max_batch_size=batch)
    await plain.generate(requests[:2])  # warm up (CUDA context, kernels)
    _sync(device)
    started = time.perf_counter()
    completions = await plain.generate(requests)
    _sync(device)
    wall = time.perf_counter() - started
    await plain.close()
    tokens = sum(len(c.token_ids) for c in completions)
    # the swap in flight, applied the way a generator's subscriber applies it: a task beside the decoding
    stamps: list[float] = []
    swap: dict[str, float] = {}
    swap_after = max(2, new_tokens // 4)

    async def hook(step: int) -> None:
        _sync(device)
        stamps.append(time.perf_counter())
        if step == swap_after:
            asyncio.get_running_loop().create_task(update())

    async def update() -> None:
        swap["start"] = time.perf_counter()
        await engine.update_weights_from(1, lambda into: transport.get(manifest, into=into))
        _sync(device)
        swap["end"] = time.perf_counter()

    engine = TorchEngine(policy, max_batch_size=batch, step_hook=hook)
    swapped = await engine.generate(requests)
    await engine.close()
    versions = sorted({v for c in swapped for v in c.versions})
    live = policy.state_dict()
    served = all(torch.equal(live[name].cpu(), published[name]) for name in published)
    steps = [later - earlier for earlier, later in itertools.pairwise(stamps)]
    steady = statistics.median(steps[: swap_after - 1])
    during = [
        d
        for d, end in zip(steps, stamps[1:], strict=False)
        if end > swap.get("start", 0) and end - d <= swap.get("end", 0)
    ]
    stall = max(0.0, max(during, default=steady) - steady) / steady if steady > 0 else 0.0
    ok = versions == [0, 1] and all(c.versions[-1] == 1 for c in swapped) and served and "end" in swap
    return {
        "preset": preset,
        "device": str(policy.device),
        "params_m": round(policy.num_parameters() / 1e6, 2),
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "median_step_ms": steady * 1e3,
        "swap_ms": (swap["end"] - swap["start"]) * 1e3 if "end" in swap else float("nan"),
        "stall_steps": stall,
        "versions_seen": versions,
        "new_weights_served": served,
        "ok": ok,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="fw-gpu-smoke-", dir=shm) as tmp:
        for preset in args.presets.split(","):
            rows.append(await one_size(preset, args.device, Path(tmp), args.batch, args.new_tokens))
            print(f"  {preset}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    info: dict[str, Any] = {"torch": torch.__version__, "device": args.device}
    if args.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    return {**info, "rows": rows, "ok": all(r["ok"] for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--presets", default="tiny,small,medium")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    if not result["ok"]:
        raise SystemExit("GPU smoke FAILED: see the rows above")


if __name__ == "__main__":
    main()
