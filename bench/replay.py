"""Replay benchmark: replay's tokens/s against the bare engine's on the same prompts and weights.

The items are what a recording of the embedded default holds: each domain's held-out tasks as scored samples
(prompt ids, verifier fields, temperature 1). Per round, interleaved so both see the same machine load:

- ``raw``: ``Replayer.raw_throughput``, the engine alone, every request submitted at once, nothing scored — the
  limit;
- ``replay``: ``Replayer.run``, what ``flywheel replay`` does: the same requests through the same engine
  (same weights, same per-request seeds, so the same completions), each scored by its domain's verifier
  (the sandbox for ``python-expr``) as it completes.

Tokens/s counts the completions' tokens over the wall-clock of each call. Target: replay ≥ 90 % of raw.

Usage: python bench/replay.py [--quick] [--spec specs/embedded.yaml]
(writes bench/results/replay.json and prints a markdown table)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.domains import domains_from_spec
from actors.policy import encode_prompt
from actors.replay import Replayer, ReplayItem
from bench._common import markdown_table, write_results
from topology import load_spec

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"replay_over_raw": 0.9}


def items_of(spec: Any, replayer: Replayer, per_domain: int) -> list[ReplayItem]:
    """Each domain's first ``per_domain`` held-out tasks as recorded scored samples."""
    items: list[ReplayItem] = []
    tokenizer = replayer.policy.tokenizer
    for name, domain in domains_from_spec(spec).items():
        for task in domain.source.heldout()[:per_domain]:
            items.append(
                ReplayItem(
                    key=f"{task.id}.0",
                    source="scored",
                    domain=name,
                    prompt=task.prompt,
                    prompt_ids=tuple(encode_prompt(tokenizer, task.prompt)),
                    temperature=1.0,
                    verifier_fields=dict(task.verifier_fields),
                )
            )
    return items


async def run(args: argparse.Namespace) -> dict[str, Any]:
    spec = load_spec(args.spec)
    rounds, per_domain = (3, 200) if args.quick else (7, 200)
    async with Replayer(spec, num_threads=args.threads) as replayer:
        items = items_of(spec, replayer, per_domain)
        kwargs: dict[str, Any] = {"seed": 0, "concurrency": args.concurrency}
        await replayer.raw_throughput(items[:32], None, version=0, **kwargs)  # warm up both paths
        await replayer.run(items[:32], None, label="warm-up", version=0, **kwargs)
        raw_runs: list[dict[str, float]] = []
        replay_runs: list[dict[str, float]] = []
        for _ in range(rounds):
            tokens, seconds = await replayer.raw_throughput(items, None, version=0, **kwargs)
            raw_runs.append({"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds})
            replayed = await replayer.run(items, None, label="initial", version=0, **kwargs)
            scored = sum(1 for o in replayed.outcomes if o.reward is not None)
            replay_runs.append(
                {
                    "tokens": replayed.tokens,
                    "seconds": replayed.wall_s,
                    "tokens_per_s": replayed.tokens_per_s,
                    "scored": scored,
                }
            )
    raw_tps = statistics.median(r["tokens_per_s"] for r in raw_runs)
    replay_tps = statistics.median(r["tokens_per_s"] for r in replay_runs)
    ratios = [rep["tokens_per_s"] / raw["tokens_per_s"] for raw, rep in zip(raw_runs, replay_runs, strict=True)]
    ratio = statistics.median(ratios)
    return {
        "quick": args.quick,
        "config": {
            "spec": str(args.spec),
            "items": len(items),
            "domains": sorted({i.domain for i in items}),
            "concurrency": args.concurrency,
            "threads": args.threads,
            "rounds": rounds,
        },
        "figures": {
            "raw": {"tokens_per_s": raw_tps, "runs": raw_runs},
            "replay": {"tokens_per_s": replay_tps, "runs": replay_runs},
            "replay_over_raw": ratio,
            "replay_over_raw_runs": ratios,
        },
        "targets": TARGETS,
        "pass": {"replay_over_raw": ratio >= TARGETS["replay_over_raw"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (≤ 60 s): 3 rounds instead of 7")
    parser.add_argument("--spec", type=Path, default=ROOT / "specs" / "embedded.yaml")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight (flywheel replay's default)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))  # no per-verdict lines
    started = time.perf_counter()
    results = asyncio.run(run(args))
    results["wall_s"] = round(time.perf_counter() - started, 1)
    path = write_results("replay", results)
    f = results["figures"]
    print(
        markdown_table(
            ["metric", "replay", "raw engine", "target", "result"],
            [
                [
                    f"tokens/s ({results['config']['items']} recorded samples, {args.concurrency} in flight)",
                    f["replay"]["tokens_per_s"],
                    f["raw"]["tokens_per_s"],
                    "",
                    "",
                ],
                [
                    "replay / raw",
                    f"{f['replay_over_raw']:.0%}",
                    "100%",
                    f"≥ {TARGETS['replay_over_raw']:.0%}",
                    "pass" if results["pass"]["replay_over_raw"] else "FAIL",
                ],
            ],
        )
    )
    print(f"\nwrote {path} in {results['wall_s']} s")


if __name__ == "__main__":
    main()
