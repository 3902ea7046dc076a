"""Does a slow domain's verifier pace a fast domain? Per-domain scored samples/s, alone and together.

Two domains on the embedded default's tiny GPT (local runtime, embedded bus, no held-out rounds):

* ``fast`` — ``builtin:arithmetic`` scored by the in-process ``math`` verifier;
* ``slow`` — a code task (``python-tests`` in the sandbox, one worker): the answer is ``x=<a+b>``, and the task's
  tests run a brute-force loop of ``--loop`` iterations (about half a second) before they check ``x``, as a code task
  with heavy tests would. The warm start teaches the answer's form, so answers compile and the tests do run.

Variants (each a fresh run of ``--duration`` seconds, warm start included; rates over the last ``--window`` s):

* ``fast`` and ``slow`` — one domain alone; ``both`` — weights 1:1, the source's in-flight budget of 32 groups;
* ``both-256`` — ``both`` with a budget of 256 groups, more than the verify actor's ``max_in_flight`` (64): a fast
  rollout then waits for a slot held by slow ones;
* ``skewed`` — weights 3000:1, which leaves the budget to the fast domain as a per-domain budget would: what the slow
  domain's groups look like to the learner when the fast domain sets the pace of versions.

From each run's bus (the ``rollouts`` and ``scored`` streams, read back after the run) and its ``metrics/applied``
rows: per domain, completions scored per second, the time from a rollout's publication to its scores' (in the
verify actor: waiting for a slot, then for the sandbox, then scoring), the part of it after the rollout got a slot
(``verify_s``: the sandbox's queue and the scoring), completions the learner took per second, and completions it
dropped as stale.

    .venv/bin/python bench/domain_pace.py                          # five variants, ~13 min
    .venv/bin/python bench/domain_pace.py --quick                  # fast, slow and both, 100 s each
    .venv/bin/python bench/domain_pace.py --variants fast,slow,both --duration 150

Writes bench/results/domain_pace.json and prints a markdown table. Runs go to a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import anyio
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import markdown_table, percentile, write_results  # noqa: E402

VARIANTS = ("fast", "slow", "both", "both-256", "skewed")


def code_tasks(loop: int) -> list[dict[str, Any]]:
    """The slow domain's rows: ``code a b:`` → ``x=<a+b>``, checked after a ``loop``-iteration brute-force loop."""
    rows = []
    for a in range(1, 21):
        for b in range(1, 21):
            tests = f"t = 0\nfor i in range({loop}):\n    t += i % 7\nassert t > 0\nassert x == {a + b}\n"
            rows.append(
                {
                    "id": f"c{a}-{b}",
                    "prompt": f"code {a} {b}:",
                    "reference": f"x={a + b}",
                    "verifier_fields": {"tests": tests},
                }
            )
    return rows


def variant_spec(variant: str, data: Path) -> dict[str, Any]:
    """The spec of one variant (``data``: the slow domain's JSONL file)."""
    arithmetic = {
        "source": "builtin:arithmetic",
        "source_options": {"digits": 1, "ops": 3, "operators": "+"},
        "verifier": "math",
        "weight": 1.0,
        "group_size": 8,
        "heldout": 8,
        "max_new_tokens": 8,
    }
    code = {
        "source": f"jsonl:{data}",
        "verifier": "python-tests",
        "weight": 1.0,
        "group_size": 8,
        "heldout": 8,
        "max_new_tokens": 8,
    }
    domains = {"fast": {"arithmetic": arithmetic}, "slow": {"code": code}}.get(
        variant, {"arithmetic": arithmetic, "code": code}
    )
    if variant == "skewed":
        domains["arithmetic"] = {**arithmetic, "weight": 3000.0}
    budget = 256 if variant == "both-256" else 32
    return {
        "name": f"pace-{variant}",
        "bus": {"embedded": True},
        "runtime": {"kind": "local"},
        "policy": {
            "model": "builtin:tiny-gpt",
            "config": {"preset": "tiny", "seed": 0, "n_layer": 2},
            "checkpoint": None,
            "warm_start": {"steps": 300, "lr": 4.0e-3, "batch_size": 32},
        },
        "domains": domains,
        "actors": {
            "source": {"resources": {"num_cpus": 0}, "max_pending": max(24, budget), "max_in_flight": budget},
            "generator": {"resources": {"num_cpus": 0.5}, "engine": "torch", "device": "cpu", "max_batch_size": 128},
            "verify": {"resources": {"num_cpus": 0.5}, "sandbox": {"workers": 1, "wall_s": 2.0, "memory_mb": 256}},
            "learner": {
                "resources": {"num_cpus": 1},
                "lr": 1.0e-4,
                "batch_size": 64,
                "max_staleness": 4,
                "publish_every_steps": 2,
                "checkpoint_every_steps": 20,
                "eval_every_steps": 0,
                "normalize": "domain",
                "device": "cpu",
            },
        },
    }


async def read_channel(run_dir: Path, channel: str) -> list[dict[str, Any]]:
    """Every envelope of ``channel`` in a finished run's JetStream store (a nats-server is started on it)."""
    import nats
    import orjson
    from nats.js.api import AckPolicy, ConsumerConfig

    from topology import stream_name
    from topology.bus import EmbeddedNats
    from topology.runtime import bus_token, read_run_info

    info = read_run_info(run_dir)
    token = bus_token(info)
    server = EmbeddedNats(run_dir / "nats", token=token)
    await server.astart()
    try:
        nc = await nats.connect(server.url, token=token)
        try:
            js = nc.jetstream()
            stream = stream_name(info.topology, channel)
            state = (await js.stream_info(stream)).state
            # no acks: an ephemeral consumer that waits for none delivers the whole stream
            sub = await js.pull_subscribe("", stream=stream, config=ConsumerConfig(ack_policy=AckPolicy.NONE))
            out: list[dict[str, Any]] = []
            while len(out) < state.messages:
                try:
                    batch = await sub.fetch(1000, timeout=5)
                except nats.errors.TimeoutError:
                    break  # nothing more (a message purged meanwhile)
                out.extend(orjson.loads(msg.data) for msg in batch)
            return out
        finally:
            await nc.close()
    finally:
        server.stop()


def pace(
    rollouts: Iterable[Mapping[str, Any]],
    scored: Iterable[Mapping[str, Any]],
    applied: Iterable[Mapping[str, Any]],
    window_s: float,
) -> dict[str, dict[str, Any]]:
    """Per domain over the last ``window_s`` seconds of scoring: completions scored per second, the median and p90
    of a rollout's time from publication to its scores' publication (``in_verify_s``) and of ``verify_s``, and
    the completions the learner took per second (``applied`` rows, stale drops excluded: they are not written)."""
    published = {r["id"]: r["ts"] for r in rollouts}
    scored = list(scored)
    if not scored:
        return {}
    start = max(m["ts"] for m in scored) - window_s
    out: dict[str, dict[str, Any]] = {}
    for domain in sorted({m["payload"]["domain"] for m in scored}):
        recent = [m for m in scored if m["payload"]["domain"] == domain and m["ts"] >= start]
        waits = [
            m["ts"] - published[m["id"][:-2]] for m in recent if m["id"].endswith(".s") and m["id"][:-2] in published
        ]
        scoring = [float(m["payload"]["verify_s"] or 0.0) for m in recent]
        out[domain] = {
            "scored_per_s": sum(len(m["payload"]["completions"]) for m in recent) / window_s,
            "groups": len(recent),
            "in_verify_s_p50": percentile(waits, 50) if waits else None,
            "in_verify_s_p90": percentile(waits, 90) if waits else None,
            "verify_s_p50": percentile(scoring, 50) if scoring else None,
        }
    rows = list(applied)
    if rows:
        end = max(r["ts"] for r in rows)
        for domain, figures in out.items():
            taken = sum(r["completions"] for r in rows if r["domain"] == domain and r["ts"] >= end - window_s)
            figures["learner_took_per_s"] = taken / window_s
    return out


def run_variant(variant: str, folder: Path, data: Path, duration_s: float, window_s: float) -> dict[str, Any]:
    from actors.learner._metrics import read_metrics
    from topology import load_spec
    from topology.runtime import LocalRuntime

    path = folder / f"{variant}.yaml"
    path.write_text(yaml.safe_dump(variant_spec(variant, data), sort_keys=False))
    runtime = LocalRuntime(load_spec(path), run_root=folder / "runs", handle_signals=False)
    clock = time.monotonic()
    result = anyio.run(lambda: runtime.run(duration_s=duration_s), backend="asyncio")
    run_dir = Path(result.run_dir)
    rollouts = asyncio.run(read_channel(run_dir, "rollouts"))
    scored = asyncio.run(read_channel(run_dir, "scored"))
    applied = read_metrics(run_dir, "applied").to_dicts()
    figures = pace(rollouts, scored, applied, window_s)
    # stale drops write no applied row: the learner's counters (its log's last report) say how many
    learner_log = (run_dir / "logs" / "learner-0.log").read_text(errors="replace")
    for domain, row in figures.items():
        row["dropped_stale"] = _last_counter(learner_log, f"dropped_stale.{domain}")
    steps = read_metrics(run_dir, "step")
    return {
        "run_dir": str(run_dir),
        "wall_s": time.monotonic() - clock,
        "stop": result.message,
        "learner_steps": len(steps),
        "domains": figures,
    }


def _last_counter(log: str, name: str) -> int:
    """The last value of counter ``name`` a replica's log shows (0 when it never appears)."""
    import re

    found = re.findall(rf"'{re.escape(name)}': (\d+)", log)
    return int(found[-1]) if found else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--duration", type=float, default=150.0, help="seconds per run, warm start included")
    parser.add_argument("--window", type=float, default=60.0, help="rates over the last S seconds of each run")
    parser.add_argument("--loop", type=int, default=8_000_000, help="iterations of the slow tests' brute-force loop")
    parser.add_argument("--quick", action="store_true", help="fast, slow and both, 100 s each, rates over 40 s")
    args = parser.parse_args()
    if args.quick:
        args.variants, args.duration, args.window = "fast,slow,both", 100.0, 40.0
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; expected some of {list(VARIANTS)}")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="domain-pace-") as tmp:
        folder = Path(tmp)
        data = folder / "code.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in code_tasks(args.loop)))
        for variant in variants:
            print(f"domain_pace: {variant} ({args.duration:.0f} s)", file=sys.stderr)
            results[variant] = run_variant(variant, folder, data, args.duration, args.window)
            results[variant].pop("run_dir")  # removed with the temporary folder
    rows = []
    for variant, res in results.items():
        for domain, f in res["domains"].items():
            rows.append(
                [
                    variant,
                    domain,
                    round(f["scored_per_s"], 1),
                    f["groups"],
                    _seconds(f["in_verify_s_p50"]),
                    _seconds(f["in_verify_s_p90"]),
                    _seconds(f["verify_s_p50"]),
                    round(f.get("learner_took_per_s", 0.0), 1),
                    f["dropped_stale"],
                    res["learner_steps"],
                ]
            )
    headers = [
        "variant",
        "domain",
        "scored/s",
        "groups",
        "in verify p50",
        "p90",
        "scoring p50",
        "learner took/s",
        "dropped stale",
        "steps",
    ]
    print(markdown_table(headers, rows))
    path = write_results(
        "domain_pace", {"duration_s": args.duration, "window_s": args.window, "loop": args.loop, "variants": results}
    )
    print(f"wrote {path}", file=sys.stderr)


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


if __name__ == "__main__":
    main()
