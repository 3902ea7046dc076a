"""Generation benchmark: tokens/s of the builtin torch engine vs a naive per-request loop.

Engine: ``TorchEngine`` (KV cache, continuous batching), B requests submitted at once, sampled at
temperature 1 with ``ignore_eos`` so every request produces exactly ``--new-tokens`` tokens; tokens/s =
generated tokens / wall time including prefill. Naive: one request at a time, no cache, a full forward pass
over the whole sequence per token — what a "just call the model" generator does. Its tokens/s does not
depend on B, so it is measured once per model (on a few requests) and every batch size is compared to it.

Usage: python bench/generate.py [--quick] [--threads 2]   (writes bench/results/generate.json)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.engines import GenerationRequest, SamplingParams, TorchEngine
from actors.policy import PRESETS, GPTConfig, Policy
from bench._common import markdown_table, write_results

PROMPT_TEXT = "what is the sum of 12 and 7 ? answer with a number , then explain the steps you took"
PROMPT_WORDS = PROMPT_TEXT.split()


def prompts(policy: Policy, count: int) -> list[tuple[int, ...]]:
    """Prompts of varied length (8–60 characters), so batches really need left padding."""
    out = []
    for i in range(count):
        text = " ".join(PROMPT_WORDS[: 2 + (i * 7) % (len(PROMPT_WORDS) - 2)])[:60]
        out.append(tuple(policy.tokenizer.encode(f"{i}: {text}")))
    return out


def naive_tokens_per_s(policy: Policy, requests: int, new_tokens: int) -> float:
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts(policy, requests):
            ids = torch.tensor([prompt])
            for _ in range(new_tokens):
                logits, _ = policy.forward(ids)
                probs = torch.softmax(logits[0, -1].float(), dim=-1)
                token = torch.multinomial(probs, 1, generator=generator)
                ids = torch.cat((ids, token.view(1, 1)), dim=1)
    return requests * new_tokens / (time.perf_counter() - start)


async def engine_tokens_per_s(policy: Policy, batch: int, new_tokens: int) -> tuple[float, dict[str, Any]]:
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True, seed=None)
    engine = TorchEngine(policy, max_batch_size=batch, seed=0)
    warmup = [GenerationRequest("w", prompts(policy, 1)[0], SamplingParams(max_new_tokens=4, ignore_eos=True))]
    await engine.generate(warmup)
    requests = [GenerationRequest(f"r{i}", p, params) for i, p in enumerate(prompts(policy, batch))]
    start = time.perf_counter()
    out = await engine.generate(requests)
    elapsed = time.perf_counter() - start
    stats = engine.stats()
    await engine.close()
    assert all(len(c.token_ids) == new_tokens for c in out)
    return batch * new_tokens / elapsed, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny and small presets, 32 new tokens")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--batch-sizes", default="1,4,16,64")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    presets = ["tiny", "small"] if args.quick else ["tiny", "small", "medium"]
    new_tokens = 32 if args.quick else 128
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    rows: list[list[Any]] = []
    results: list[dict[str, Any]] = []
    for preset in presets:
        policy = Policy.tiny_gpt(GPTConfig(**PRESETS[preset]), seed=0)
        params_m = policy.num_parameters() / 1e6
        naive_requests = 4 if preset != "medium" else 2
        naive = naive_tokens_per_s(policy, naive_requests, new_tokens)
        for batch in batch_sizes:
            tps, stats = asyncio.run(engine_tokens_per_s(policy, batch, new_tokens))
            ratio = tps / naive
            rows.append([preset, f"{params_m:.1f}M", batch, tps, naive, f"{ratio:.1f}x"])
            results.append(
                {
                    "preset": preset,
                    "params": policy.num_parameters(),
                    "batch_size": batch,
                    "new_tokens": new_tokens,
                    "engine_tokens_per_s": round(tps, 1),
                    "naive_tokens_per_s": round(naive, 1),
                    "ratio": round(ratio, 2),
                    "engine_steps": stats["steps"],
                    "mean_batch_occupancy": round(stats["mean_batch_occupancy"], 3),
                }
            )
            print(f"{preset} B={batch}: engine {tps:,.0f} tok/s, naive {naive:,.0f} tok/s ({ratio:.1f}x)", flush=True)

    table = markdown_table(["model", "params", "batch", "engine tok/s", "naive tok/s", "ratio"], rows)
    path = write_results(
        "generate",
        {"threads": args.threads, "quick": args.quick, "results": results, "table": table},
    )
    print()
    print(table)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
