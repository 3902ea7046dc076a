"""Users of the always-on service: does the served model get better from their feedback, and is nothing lost?

Runs ``flywheel up`` (as a user would, a separate process) on a variant of ``specs/service.yaml`` and drives it with a
population of simulated users through the official ``openai`` SDK:

* ``--users`` concurrent users send prompts from ``specs/data/production.jsonl`` (their own distribution: a fixed pool
  asked with Zipf popularity by row order; the domain's held-out rows are never asked) to ``/v1/completions``, a
  share streamed; each answer is checked with the domain's verifier and rated thumbs up / down on ``/v1/feedback``
  after a random delay (exponential, seconds to minutes), except a share that never rates;
* a scripted reviewer labels what the joiner queues for review through the path ``flywheel review`` takes
  (``actors.commands._review.review_samples``);
* a client-side ledger keeps every request id, answer and feedback sent (``ledger.jsonl`` beside the results);
* ``--kill`` SIGKILLs in turn the gateway, joiner, recorder, learner, generators and the gate while users run (the
  supervisor restarts them).

Variants (same warm-started checkpoint: the embedded default's warm start on the task domains, cached under
``bench/results/.cache``):

* ``production`` — the learner has no task domains: no source, training generator or verifier; it learns from
  joined feedback alone (single samples, per-domain running baseline, importance-corrected against the served
  behaviour logprobs);
* ``mixed`` — ``specs/service.yaml`` as it is: task domains and users' feedback together.

Measured per variant: accuracy of the served answers over wall-clock (the ledger, by the verifier), accuracy of
every promoted version on the held-out production prompts (replayed after the run, sampled like users are served),
the feedback-to-serving latency (feedback accepted by the gateway → the first promoted version whose training
applied it, p50/p95), promotions and rollbacks (with the replay scores each gate decision weighed), the learner's
drift from the policy that sampled its data over wall-clock (``behavior_kl``, importance weights, staleness), and
whether the three ledgers agree: every acknowledged request recorded once in the recorder's parquet, every accepted
feedback applied once in the learner's applied ledger.

    python bench/users.py --quick                     # ≤ 90 s: the production variant, 30 s of users
    python bench/users.py --duration 600              # both variants, 10 minutes of users each
    python bench/users.py --duration 600 --kill       # ... with every kind of actor SIGKILLed once per variant

Writes bench/results/users.json and bench/results/users.png and prints a markdown table. Rating after a whole-run
restart: ``--defer SHARE`` keeps that share of ratings back (``ledger.jsonl``: ``"deferred": true``), and
``--rate-deferred LEDGER --url URL --key-file FILE`` sends them to a gateway later — the hook for ``flywheel up
--resume`` (whole-run resume lands separately).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import heapq
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import RESULTS_DIR, markdown_table, percentile, write_results  # noqa: E402

SERVICE = ROOT / "specs" / "service.yaml"
EMBEDDED = ROOT / "specs" / "embedded.yaml"
CACHE = RESULTS_DIR / ".cache"
DOMAIN = "production"
KILL_ORDER = ("gateway", "joiner", "recorder", "learner", "serving", "generator", "gate")


# ---------------------------------------------------------------------------------------------- set-up
def warm_checkpoint(steps: int) -> Path:
    """The embedded default's warm start on the task domains, as a safetensors file (cached by steps and policy)."""
    from topology import load_spec
    from topology._registry import load_plugins

    load_plugins()
    spec = load_spec(EMBEDDED)
    from actors.protocol import policy_of

    policy_spec = policy_of(spec)
    key = json.dumps(
        [steps, policy_spec.model, policy_spec.config, policy_spec.warm_start.model_dump()], sort_keys=True
    )
    folder = CACHE / f"warm-{abs(hash_text(key)):016x}"
    if (folder / "model.safetensors").is_file():
        return folder / "model.safetensors"
    import torch

    from actors.domains import domains_from_spec
    from actors.learner import PPOConfig, Trainer, export_safetensors, warm_start, warm_start_lr
    from actors.policy import Policy

    torch.set_num_threads(1)
    started = time.perf_counter()
    policy = Policy.from_spec(policy_spec)
    trainer = Trainer(policy, lr=1e-4, ppo=PPOConfig(), grad_clip=1.0)
    warm = policy_spec.warm_start
    lr = warm_start_lr(warm.lr, policy.num_parameters())
    warm_start(trainer, domains_from_spec(spec), steps=steps, lr=lr, batch_size=warm.batch_size)
    export_safetensors(policy, folder, extra={"warm_start_steps": steps})
    print(f"users: warm start of {steps} steps in {time.perf_counter() - started:.0f} s → {folder}", flush=True)
    return folder / "model.safetensors"


def hash_text(text: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def variant_spec(name: str, checkpoint: Path, folder: Path, overrides: dict[str, Any]) -> Path:
    """The service spec as one file (includes merged), with this run's ports, checkpoint and variant applied."""
    from topology import load_spec

    for variable in ("FLYWHEEL_GATEWAY_PORT", "FLYWHEEL_METRICS_PORT"):
        os.environ.pop(variable, None)
    spec = load_spec(SERVICE)
    data: dict[str, Any] = copy.deepcopy(dict(spec.data or {}))
    data.pop("include", None)
    data["name"] = f"users-{name}"
    data["runtime"]["run_dir"] = str(folder / "runs")
    data["runtime"]["metrics_port"] = 0
    data["actors"]["gateway"]["port"] = free_port()  # fixed for the run: a restarted gateway comes back at the same URL
    data["policy"]["checkpoint"] = str(checkpoint)
    for domain in data["domains"].values():
        for key in ("source", "heldout"):
            value = domain.get(key)
            if isinstance(value, str) and value.startswith("jsonl:") and not Path(value[6:]).is_absolute():
                domain[key] = f"jsonl:{(SERVICE.parent / value[6:]).resolve()}"
    if name == "production":  # feedback alone: no task domains, nothing that samples or verifies them
        data["domains"] = {DOMAIN: data["domains"][DOMAIN]}
        for actor in ("source", "generator", "verify"):
            data["actors"].pop(actor, None)
        data["actors"]["learner"]["eval_every_steps"] = 0
    deep_merge(data, overrides)
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            deep_merge(base[key], value)
        else:
            base[key] = value


@dataclass
class Service:
    proc: subprocess.Popen[str]
    run_dir: Path
    url: str
    key: str
    metrics: str
    lines: list[str] = field(default_factory=list)


def start_service(spec: Path, duration_s: float) -> Service:
    """``flywheel up SPEC`` as a child process; waits until it printed the gateway's URL, key file and metrics."""
    cmd = [sys.executable, "-m", "topology.cli", "up", str(spec), "--duration", f"{duration_s:g}", "--every", "5"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("FLYWHEEL_API_KEYS", None)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    found: dict[str, str] = {}
    lines: list[str] = []
    deadline = time.monotonic() + 180
    while len(found) < 4 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        text = line.strip()
        for key, pattern in (
            ("run_dir", r"^run dir: (\S+)$"),
            ("url", r"^gateway:\s+(http://\S+)$"),
            ("key_file", r"^gateway:\s+API key in (\S+)$"),
            ("metrics", r"^metrics: (\S+)$"),
        ):
            if match := re.match(pattern, text):
                found[key] = match.group(1)
    if len(found) < 4:
        proc.kill()
        raise SystemExit("flywheel up did not come up:\n" + "".join(lines[-40:]))
    key = Path(found["key_file"]).read_text().strip()
    return Service(proc, Path(found["run_dir"]), found["url"], key, found["metrics"], lines)


# ---------------------------------------------------------------------------------------------- users
@dataclass
class Request:
    rid: str
    user: int
    prompt: str
    answer: str
    correct: bool
    sent: float
    answered: float
    stream: bool
    rate: str  # "now" (after a delay), "never", "deferred"
    feedback: dict[str, Any] | None = None


@dataclass
class Population:
    url: str
    key: str
    prompts: list[tuple[str, str]]  # (prompt, answer) in popularity order
    cum_weights: list[float]
    rate_share: float
    defer_share: float
    delay_mean_s: float
    delay_max_s: float
    stream_share: float
    seed: int
    users: int
    requests: list[Request] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    due: list[tuple[float, int, Request]] = field(default_factory=list)
    feedback_sent: int = 0
    feedback_retries: int = 0
    reviewed: dict[str, int] = field(default_factory=dict)

    def pick(self, rng: random.Random) -> tuple[str, str]:
        return rng.choices(self.prompts, cum_weights=self.cum_weights)[0]


def zipf_weights(n: int, exponent: float = 1.0) -> list[float]:
    total, out = 0.0, []
    for rank in range(n):
        total += 1.0 / (rank + 1) ** exponent
        out.append(total)
    return out


def correct(text: str, answer: str) -> bool:
    from actors.domains._verifiers._math import extract_answer, parse_exact

    found = extract_answer(text)
    return found is not None and parse_exact(found) is not None and parse_exact(found) == parse_exact(answer)


async def user(pop: Population, index: int, client: Any, stop_at: float) -> None:
    rng = random.Random(pop.seed * 1000 + index)
    while time.time() < stop_at:
        prompt, answer = pop.pick(rng)
        stream = rng.random() < pop.stream_share
        sent = time.time()
        try:
            if stream:
                rid, parts = "", list[str]()
                response = await client.completions.create(
                    model="flywheel", prompt=prompt, max_tokens=8, temperature=1.0, stream=True
                )
                async for chunk in response:
                    rid = chunk.id or rid
                    parts.extend(choice.text or "" for choice in chunk.choices)
                text = "".join(parts)
            else:
                completion = await client.completions.create(
                    model="flywheel", prompt=prompt, max_tokens=8, temperature=1.0
                )
                rid, text = completion.id, completion.choices[0].text
        except Exception as exc:  # a gateway restart, a 429/503/504: the request was not acknowledged
            kind = type(exc).__name__
            pop.errors[kind] = pop.errors.get(kind, 0) + 1
            await asyncio.sleep(0.5 + rng.random())
            continue
        roll = rng.random()
        rate = "now" if roll < pop.rate_share else "never"
        if rate == "now" and rng.random() < pop.defer_share:
            rate = "deferred"
        request = Request(rid, index, prompt, text, correct(text, answer), sent, time.time(), stream, rate)
        pop.requests.append(request)
        if rate == "now":
            delay = min(pop.delay_max_s, rng.expovariate(1.0 / pop.delay_mean_s))
            heapq.heappush(pop.due, (request.answered + delay, len(pop.requests), request))
        await asyncio.sleep(rng.random() * 0.2)


async def send_feedback(pop: Population, http: Any, request: Request, *, until: float) -> None:
    """POST the rating until the gateway accepts it (a gateway restart refuses connections meanwhile); the same
    body each time, so the gateway's id for it (and JetStream's dedupe) is the same."""
    body = {"request_id": request.rid, "label": "thumbs_up" if request.correct else "thumbs_down"}
    attempts = 0
    while time.time() < until:
        attempts += 1
        try:
            response = await http.post(
                f"{pop.url}/v1/feedback", json=body, headers={"Authorization": f"Bearer {pop.key}"}, timeout=10
            )
            if response.status_code == 200:
                request.feedback = {
                    "id": response.json()["id"],
                    "score": 1.0 if request.correct else 0.0,
                    "accepted": time.time(),
                    "attempts": attempts,
                }
                pop.feedback_sent += 1
                return
        except Exception:
            pass
        pop.feedback_retries += 1
        await asyncio.sleep(0.5)


async def feedback_loop(pop: Population, stop_at: float, grace_s: float, senders: int = 16) -> None:
    """Send each rating when due by ``senders`` workers (a gateway that is down is retried, never stormed); after
    ``stop_at`` the ones still pending go at once (within ``grace_s``)."""
    import httpx

    ready: asyncio.Queue[Request | None] = asyncio.Queue()

    async def sender(http: Any) -> None:
        while (request := await ready.get()) is not None:
            await send_feedback(pop, http, request, until=stop_at + grace_s)

    async with httpx.AsyncClient() as http:
        workers = [asyncio.ensure_future(sender(http)) for _ in range(senders)]
        while time.time() < stop_at + grace_s:
            now = time.time()
            while pop.due and (pop.due[0][0] <= now or now >= stop_at):
                ready.put_nowait(heapq.heappop(pop.due)[2])
            if now >= stop_at and not pop.due and ready.empty():
                break
            await asyncio.sleep(0.05)
        for _ in workers:
            ready.put_nowait(None)
        await asyncio.gather(*workers)


async def reviewer(pop: Population, run_dir: Path, stop_at: float) -> None:
    """Label the review queue with the verifier, through the code `flywheel review` runs."""
    from actors.commands._review import review_samples
    from topology.runtime import connect_run, read_run_info

    answers = dict(pop.prompts)
    info = read_run_info(run_dir)

    async def label(sample: Any, delivery: Any) -> str:
        answer = answers.get(sample.prompt)
        if answer is None:
            return "skip"
        return "good" if correct(sample.completion.text, answer) else "bad"

    while time.time() < stop_at:
        try:
            bus = await connect_run(run_dir, name="bench-reviewer", info=info)
        except Exception as exc:  # the bus restarting: try again, and say so
            print(f"users: reviewer cannot connect: {exc}", file=sys.stderr)
            await asyncio.sleep(1.0)
            continue
        try:
            while time.time() < stop_at:
                counts = await review_samples(bus, label, wait_s=2.0)
                for key in ("good", "bad", "skip"):
                    pop.reviewed[key] = pop.reviewed.get(key, 0) + counts[key]
        except Exception as exc:
            print(f"users: reviewer: {exc}", file=sys.stderr)
            await asyncio.sleep(1.0)
        finally:
            await bus.close()


async def killer(
    service: Service, actors: list[str], start_at: float, end_at: float, log: list[dict[str, Any]]
) -> None:
    """SIGKILL each actor's replica 0 in turn, evenly spaced between ``start_at`` and ``end_at``."""
    from topology.runtime import connect_run, read_run_info, read_status

    info = read_run_info(service.run_dir)
    step = (end_at - start_at) / max(len(actors), 1)
    bus = await connect_run(service.run_dir, name="bench-killer", info=info)
    try:
        for index, actor in enumerate(actors):
            await asyncio.sleep(max(0.0, start_at + index * step - time.time()))
            records = []
            for _ in range(10):  # a heartbeat read that times out under load is tried again
                try:
                    records = await read_status(bus, info.topology, [(actor, 0)])
                    break
                except Exception:
                    await asyncio.sleep(1.0)
            if not records or records[0].state != "running":
                log.append(
                    {"actor": actor, "ts": time.time(), "killed": False, "state": records[0].state if records else None}
                )
                continue
            try:
                os.kill(records[0].pid, signal.SIGKILL)
                log.append({"actor": actor, "ts": time.time(), "killed": True, "pid": records[0].pid})
            except ProcessLookupError:
                log.append({"actor": actor, "ts": time.time(), "killed": False, "state": "gone"})
    finally:
        await bus.close()


def collect_versions(run_dir: Path, into: Path, seen: set[int], stop: list[bool]) -> None:
    """Copy each version the gate promotes (its pinned weights) before the gate may unpin it (a thread)."""
    from actors.replay import read_decisions

    while not stop[0]:
        for entry in read_decisions(run_dir):
            version = int(entry.get("version", -1))
            if not entry.get("serving") or version in seen:
                continue
            source = run_dir / "weights" / f"serving-v{version}" / "model.safetensors"
            if source.is_file():
                target = into / f"v{version}.safetensors"
                try:
                    shutil.copyfile(source, target)
                    seen.add(version)
                except OSError:
                    pass
        time.sleep(0.5)


async def drive(
    service: Service, pop: Population, duration_s: float, kill: bool, actors: list[str]
) -> list[dict[str, Any]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=service.url + "/v1", api_key=service.key, max_retries=0, timeout=40.0)
    stop_at = time.time() + duration_s
    kills: list[dict[str, Any]] = []
    tasks = [asyncio.ensure_future(user(pop, i, client, stop_at)) for i in range(pop.users)]
    tasks.append(asyncio.ensure_future(feedback_loop(pop, stop_at, grace_s=20.0)))
    tasks.append(asyncio.ensure_future(reviewer(pop, service.run_dir, stop_at)))
    if kill:
        tasks.append(
            asyncio.ensure_future(
                killer(service, actors, time.time() + 0.2 * duration_s, time.time() + 0.8 * duration_s, kills)
            )
        )
    await asyncio.gather(*tasks)
    await client.close()
    return kills


# ---------------------------------------------------------------------------------------------- after the run
def wait_settled(run_dir: Path, acknowledged: set[str], accepted: set[str], timeout_s: float) -> None:
    """Until every accepted rating was applied by the learner (its audit trail) and every acknowledged request and
    accepted rating is in the recorder's files, or ``timeout_s``: the service drains its backlog before it stops."""
    from actors.learner import read_metrics
    from actors.protocol import read_recordings

    def recorded(channel: str) -> set[str]:
        frame = read_recordings(run_dir / "recordings", channel)
        return set(frame["request_id"].to_list()) if frame.height else set()

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        applied = read_metrics(run_dir, "applied")
        if (
            applied.height
            and accepted <= set(applied["task_id"].to_list())
            and acknowledged <= recorded("traffic")
            and accepted <= recorded("feedback")
        ):
            return
        time.sleep(2.0)
    print(f"users: the service had not settled after {timeout_s:.0f} s; the ledgers say what was left", file=sys.stderr)


def ledgers(run_dir: Path, pop: Population) -> dict[str, Any]:
    """The client's ledger against the recorder's parquet and the learner's applied ledger."""
    from actors.learner import effective_applied
    from actors.protocol import read_recordings

    acknowledged = {r.rid for r in pop.requests}
    traffic = read_recordings(run_dir, "traffic")
    recorded = traffic["request_id"].to_list()
    counts: dict[str, int] = {}
    for rid in recorded:
        counts[rid] = counts.get(rid, 0) + 1
    feedback = read_recordings(run_dir, "feedback")
    fb_sources = dict(zip(feedback["request_id"].to_list(), feedback["_source"].to_list(), strict=True))
    rated = {r.rid for r in pop.requests if r.feedback is not None}
    reviewed = {rid for rid, source in fb_sources.items() if source == "review"}
    applied = effective_applied(run_dir)
    joined = [m for m in applied["message_id"].to_list() if str(m).startswith("joined.")] if applied.height else []
    applied_counts: dict[str, int] = {}
    for message in joined:
        rid = message.removeprefix("joined.")
        applied_counts[rid] = applied_counts.get(rid, 0) + 1
    should = rated | reviewed
    return {
        "requests_acknowledged": len(acknowledged),
        "requests_recorded": len(counts),
        "acknowledged_not_recorded": len(acknowledged - counts.keys()),
        "recorded_twice": sum(1 for c in counts.values() if c > 1),
        "recorded_not_acknowledged": len(counts.keys() - acknowledged),
        "feedback_accepted": len(rated),
        "feedback_recorded": len(rated & fb_sources.keys()),
        "accepted_not_recorded": len(rated - fb_sources.keys()),
        "review_labels": len(reviewed),
        "feedback_applied": len(applied_counts),
        "accepted_not_applied": len(should - applied_counts.keys()),
        "applied_twice": sum(1 for c in applied_counts.values() if c > 1),
        "applied_not_accepted": len(applied_counts.keys() - should),
        "agree": not (acknowledged - counts.keys())
        and not any(c > 1 for c in counts.values())
        and not (rated - fb_sources.keys())
        and not (should - applied_counts.keys())
        and not any(c > 1 for c in applied_counts.values())
        and not (applied_counts.keys() - should),
    }


def served_curve(pop: Population, started: float, bucket_s: float) -> list[dict[str, float]]:
    buckets: dict[int, list[int]] = {}
    for r in pop.requests:
        buckets.setdefault(int((r.answered - started) // bucket_s), []).append(int(r.correct))
    return [{"t_s": (b + 0.5) * bucket_s, "accuracy": sum(v) / len(v), "n": len(v)} for b, v in sorted(buckets.items())]


_GATE_FIGURES = ("candidate_mean_reward", "serving_mean_reward", "best_mean_reward")  # what each decision weighed
_DRIFT = ("behavior_kl", "iw_mean", "iw_truncated_frac", "staleness_mean")  # how far the learner is off its data


def learner_curve(steps: Any, started: float, bucket_s: float) -> list[dict[str, float]]:
    """The learner's drift from the policy that sampled its data, per bucket of wall-clock: mean ``behavior_kl``
    (nats per token, k3 KL(behavior ‖ proximal)), importance weights and staleness of its ``step`` metrics rows, and
    the steps."""
    if steps.is_empty():
        return []
    buckets: dict[int, list[dict[str, Any]]] = {}
    for row in steps.select("ts", *(c for c in _DRIFT if c in steps.columns)).iter_rows(named=True):
        buckets.setdefault(int((row["ts"] - started) // bucket_s), []).append(row)
    curve = []
    for b, rows in sorted(buckets.items()):
        point: dict[str, float] = {"t_s": (b + 0.5) * bucket_s, "steps": len(rows)}
        for column in _DRIFT:
            values = [r[column] for r in rows if r.get(column) is not None]
            if values:
                point[column] = round(sum(values) / len(values), 4)
        curve.append(point)
    return curve


def learner_window(steps: Any, lo: float, hi: float) -> float | None:
    """Mean ``behavior_kl`` of the learner's ``step`` metrics rows in ``[lo, hi)`` (wall clock)."""
    if steps.is_empty() or "behavior_kl" not in steps.columns:
        return None
    values = steps.filter((steps["ts"] >= lo) & (steps["ts"] < hi))["behavior_kl"].drop_nulls().to_list()
    return round(sum(values) / len(values), 4) if values else None


def window_accuracy(pop: Population, lo: float, hi: float) -> tuple[float | None, int]:
    values = [int(r.correct) for r in pop.requests if lo <= r.answered < hi]
    return (sum(values) / len(values) if values else None), len(values)


def latencies(run_dir: Path, pop: Population) -> dict[str, Any]:
    """Feedback accepted → the first promoted version whose training applied it (seconds)."""
    from actors.learner import effective_applied, read_metrics
    from actors.replay import read_decisions

    accepted = {r.rid: r.feedback["accepted"] for r in pop.requests if r.feedback is not None}
    applied = effective_applied(run_dir)
    publishes = sorted(
        (float(ts), int(v))
        for ts, v in read_metrics(run_dir, "lifecycle").filter(event="publish").select("ts", "version").rows()
    )
    promotions = sorted(
        (float(e["ts"]), int(e["version"])) for e in read_decisions(run_dir) if e.get("action") == "promote"
    )
    values: list[float] = []
    unserved = 0
    for message, ts in applied.select("message_id", "ts").rows() if applied.height else []:
        rid = str(message).removeprefix("joined.")
        if rid not in accepted:
            continue
        version = next((v for t, v in publishes if t >= float(ts)), None)
        served = next((t for t, v in promotions if version is not None and v >= version and t >= float(ts)), None)
        if served is None:
            unserved += 1
            continue
        values.append(served - accepted[rid])
    out: dict[str, Any] = {"n": len(values), "not_served_by_the_end": unserved}
    if values:
        out.update(p50_s=percentile(values, 50), p95_s=percentile(values, 95), max_s=max(values))
    return out


def heldout_accuracy(spec_path: Path, versions: dict[int, Path], samples: int) -> dict[int, float]:
    """Accuracy of each version on the production domain's held-out prompts, sampled at T=1 like users are."""
    import anyio

    from actors.domains import domains_from_spec
    from actors.policy import CharTokenizer, encode_prompt, read_safetensors
    from actors.replay import Replayer, ReplayItem
    from topology import load_spec

    spec = load_spec(spec_path)
    tasks = domains_from_spec(spec, [DOMAIN])[DOMAIN].source.heldout()
    tokenizer = CharTokenizer()
    items = [
        ReplayItem(
            key=f"{task.key}#{k}",
            source="scored",
            domain=DOMAIN,
            prompt=task.prompt,
            prompt_ids=tuple(encode_prompt(tokenizer, task.prompt)),
            temperature=1.0,
            verifier_fields=dict(task.verifier_fields),
        )
        for task in tasks
        for k in range(samples)
    ]

    async def run() -> dict[int, float]:
        out: dict[int, float] = {}
        async with Replayer(spec, num_threads=1) as replayer:
            for version, path in sorted(versions.items()):
                result = await replayer.run(
                    items, read_safetensors(path), label=f"v{version}", version=version, concurrency=64
                )
                rewards = [o.reward for o in result.outcomes if o.reward is not None]
                out[version] = sum(r >= 1.0 for r in rewards) / max(len(rewards), 1)
        return out

    return anyio.run(run, backend="asyncio")


def thin(versions: dict[int, Path], most: int) -> dict[int, Path]:
    """At most ``most`` versions, evenly spread, the first and the last always among them."""
    ordered = sorted(versions)
    if len(ordered) <= most:
        return versions
    picks = {ordered[round(i * (len(ordered) - 1) / (most - 1))] for i in range(most)}
    return {v: versions[v] for v in sorted(picks)}


def production_rows(spec_path: Path) -> tuple[list[tuple[str, str]], int]:
    """The production prompts users ask (training split, file order) with their answers; the held-out count."""
    from actors.domains import domains_from_spec
    from topology import load_spec

    source = domains_from_spec(load_spec(spec_path), [DOMAIN])[DOMAIN].source
    rows = []
    for line in (SERVICE.parent / "data" / "production.jsonl").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        task = source.find(json.loads(line)["prompt"])
        if task is not None and not source.is_heldout(task):
            rows.append((task.prompt, str(task.verifier_fields["answer"])))
    return rows, len(source.heldout())


# ---------------------------------------------------------------------------------------------- a variant
def run_variant(name: str, opts: argparse.Namespace, checkpoint: Path, folder: Path) -> dict[str, Any]:
    overrides = json.loads(opts.override) if opts.override else {}
    spec_path = variant_spec(name, checkpoint, folder, overrides.get(name, overrides.get("*", {})))
    prompts, held = production_rows(spec_path)
    service = start_service(spec_path, opts.duration + opts.warmup + 120)
    print(f"users[{name}]: {service.url} (run dir {service.run_dir}); {len(prompts)} prompts asked, {held} held out")
    versions_dir = folder / f"versions-{name}"
    versions_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(checkpoint, versions_dir / "v0.safetensors")
    seen: set[int] = set()
    stop = [False]
    import threading

    collector = threading.Thread(target=collect_versions, args=(service.run_dir, versions_dir, seen, stop), daemon=True)
    collector.start()
    output = threading.Thread(target=_pump, args=(service,), daemon=True)
    output.start()
    pop = Population(
        service.url,
        service.key,
        prompts,
        zipf_weights(len(prompts), opts.zipf),
        opts.rate_share,
        opts.defer,
        opts.delay_mean,
        opts.delay_max,
        opts.stream_share,
        opts.seed,
        opts.users,
    )
    actors = [a for a in KILL_ORDER if a in json.loads(spec_path.read_text())["actors"]]
    try:
        time.sleep(opts.warmup)  # the first version is promoted, the serving generator swaps it in
        started = time.time()
        kills = asyncio.run(drive(service, pop, opts.duration, opts.kill, actors))
        ended = time.time()
        accepted = {r.rid for r in pop.requests if r.feedback is not None}
        wait_settled(service.run_dir, {r.rid for r in pop.requests}, accepted, timeout_s=90)
    finally:  # whatever happened, the service stops (a drain, then SIGKILL)
        service.proc.send_signal(signal.SIGINT)
        try:
            service.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            service.proc.kill()
            service.proc.wait()
        stop[0] = True
        collector.join(timeout=5)
    ledger_path = folder / f"ledger-{name}.jsonl"
    with open(ledger_path, "w") as out:
        for request in pop.requests:
            out.write(json.dumps(asdict(request)) + "\n")
    from actors.learner import read_metrics
    from actors.replay import read_decisions

    decisions = read_decisions(service.run_dir)
    steps = read_metrics(service.run_dir, "step")
    promotions = [e for e in decisions if e.get("action") == "promote"]
    serving_first = min((float(e["ts"]) for e in promotions), default=started)
    version_files = thin({int(p.stem[1:]): p for p in versions_dir.glob("v*.safetensors")}, opts.heldout_versions)
    held_acc = heldout_accuracy(spec_path, version_files, opts.heldout_samples)
    promoted_at = {int(e["version"]): float(e["ts"]) - started for e in promotions}
    held_curve = [
        {"version": v, "t_s": round(promoted_at.get(v, min(0.0, serving_first - started)), 1), "accuracy": acc}
        for v, acc in sorted(held_acc.items())
    ]
    edge = min(60.0, opts.duration / 4)
    first, first_n = window_accuracy(pop, started, started + edge)
    last, last_n = window_accuracy(pop, ended - edge, ended + 1)
    served_versions = [p for p in held_curve if p["version"] in promoted_at]
    result = {
        "variant": name,
        "run_dir": str(service.run_dir),
        "ledger": str(ledger_path),
        "duration_s": round(ended - started, 1),
        "users": opts.users,
        "requests": len(pop.requests),
        "requests_per_s": round(len(pop.requests) / max(ended - started, 1e-9), 2),
        "request_errors": pop.errors,
        "feedback_sent": pop.feedback_sent,
        "feedback_retries": pop.feedback_retries,
        "reviewed": pop.reviewed,
        "served_accuracy_first": first,
        "served_accuracy_last": last,
        "served_accuracy_window_s": edge,
        "served_accuracy_n": [first_n, last_n],
        "served_gain_points": round(100 * (last - first), 1) if first is not None and last is not None else None,
        "served_curve": served_curve(pop, started, opts.bucket),
        "heldout_curve": held_curve,
        "heldout_gain_points": round(100 * (served_versions[-1]["accuracy"] - held_acc.get(0, 0.0)), 1)
        if served_versions
        else None,
        "latency": latencies(service.run_dir, pop),
        "promotions": len(promotions),
        "rollbacks": sum(e.get("action") == "rollback" for e in decisions),
        "rejections": sum(e.get("action") == "reject" for e in decisions),
        "holds": sum(e.get("action") == "hold" for e in decisions),
        "decisions": [
            {k: e.get(k) for k in ("ts", "action", "version", "reason", *_GATE_FIGURES)}
            | {"t_s": round(float(e["ts"]) - started, 1)}
            for e in decisions
        ],
        "learner_curve": learner_curve(steps, started, opts.bucket),
        "behavior_kl_last": learner_window(steps, ended - edge, ended + 1),
        "kills": [k | {"t_s": round(k["ts"] - started, 1)} for k in kills],
        "ledgers": ledgers(service.run_dir, pop),
    }
    return result


def _pump(service: Service) -> None:
    """Keep reading flywheel up's output (so its pipe never fills), keeping the tail for errors."""
    assert service.proc.stdout is not None
    for line in service.proc.stdout:
        service.lines.append(line)
        del service.lines[:-200]


# ---------------------------------------------------------------------------------------------- report
def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(21, 4.6))
    for name, r in results.items():
        curve = r["served_curve"]
        line = axes[0].plot([p["t_s"] for p in curve], [p["accuracy"] for p in curve], label=name)[0]
        for k in r["kills"]:
            if k.get("killed"):
                axes[0].axvline(k["t_s"], color=line.get_color(), ls=":", alpha=0.5)
                axes[0].annotate(
                    k["actor"],
                    (k["t_s"], 0.02),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    fontsize=7,
                    color=line.get_color(),
                )
        held = r["heldout_curve"]
        axes[1].step([p["t_s"] for p in held], [p["accuracy"] for p in held], where="post", marker="o", label=name)
        for d in r["decisions"]:
            if d["action"] == "rollback":
                axes[1].axvline(d["t_s"], color="red", alpha=0.3)
        drift = [p for p in r.get("learner_curve", []) if "behavior_kl" in p]
        axes[3].plot([p["t_s"] for p in drift], [max(p["behavior_kl"], 1e-4) for p in drift], label=name)
        lat = r["latency"]
        if lat.get("n"):
            axes[2].bar(name, lat["p50_s"], label=f"{name} p50")
            axes[2].bar(name, lat["p95_s"] - lat["p50_s"], bottom=lat["p50_s"], alpha=0.4, label=f"{name} p95")
    axes[0].set(
        title="served accuracy (users' requests; dotted: SIGKILLs)", xlabel="seconds of users", ylabel="correct"
    )
    axes[1].set(title="held-out production prompts, per promoted version", xlabel="promoted at (s)", ylabel="accuracy")
    axes[2].set(title="feedback → serving latency (p50, p95)", ylabel="seconds")
    axes[3].set(
        title="learner's drift from its data: k3 KL(behavior ‖ proximal)",
        xlabel="seconds of users",
        ylabel="nats per token",
        yscale="log",
    )
    for ax in axes:
        ax.grid(alpha=0.3)
    for ax in (axes[0], axes[1], axes[3]):
        ax.legend()
    agree = ", ".join(f"{n}: {'agree' if r['ledgers']['agree'] else 'DISAGREE'}" for n, r in results.items())
    fig.suptitle(f"bench/users.py — ledgers (client, recorder, learner): {agree}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, r in results.items():
        lat = r["latency"]
        ledger = r["ledgers"]
        rows.append(
            [
                name,
                r["requests"],
                r["requests_per_s"],
                r["feedback_sent"],
                _pct(r["served_accuracy_first"]),
                _pct(r["served_accuracy_last"]),
                _pts(r["served_gain_points"]),
                _pts(r["heldout_gain_points"]),
                f"{lat.get('p50_s', float('nan')):.0f} / {lat.get('p95_s', float('nan')):.0f}",
                f"{r['promotions']} / {r['rejections']} / {r['rollbacks']}",
                "—" if r.get("behavior_kl_last") is None else f"{r['behavior_kl_last']:.3g}",
                "yes" if ledger["agree"] else "NO",
            ]
        )
    headers = [
        "variant",
        "requests",
        "req/s",
        "ratings",
        "served acc start",
        "end",
        "Δ served",
        "Δ held-out",
        "feedback→serving p50/p95 s",
        "promote/reject/rollback",
        "behavior_kl late",
        "ledgers agree",
    ]
    return markdown_table(headers, rows)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _pts(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1f}"


async def rate_deferred(ledger: Path, url: str, key: str) -> int:
    """Send the deferred ratings of a ledger to a gateway (after a whole-run restart); returns how many it took."""
    import httpx

    sent = 0
    async with httpx.AsyncClient() as http:
        for line in ledger.read_text().splitlines():
            row = json.loads(line)
            if row.get("rate") != "deferred":
                continue
            body = {"request_id": row["rid"], "label": "thumbs_up" if row["correct"] else "thumbs_down"}
            response = await http.post(f"{url}/v1/feedback", json=body, headers={"Authorization": f"Bearer {key}"})
            sent += response.status_code == 200
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of users per variant")
    parser.add_argument("--variants", default="production,mixed")
    parser.add_argument("--quick", action="store_true", help="≤ 90 s: the production variant, 30 s of users")
    parser.add_argument("--users", type=int, default=24, help="concurrent users")
    parser.add_argument("--kill", action="store_true", help="SIGKILL every kind of actor once while users run")
    parser.add_argument("--rate-share", type=float, default=0.8, help="share of answers users rate")
    parser.add_argument("--defer", type=float, default=0.0, help="share of ratings kept for after a restart")
    parser.add_argument("--delay-mean", type=float, default=20.0, help="mean seconds before a rating")
    parser.add_argument("--delay-max", type=float, default=180.0, help="longest delay before a rating")
    parser.add_argument("--stream-share", type=float, default=0.2, help="share of requests streamed")
    parser.add_argument("--zipf", type=float, default=1.0, help="popularity exponent over the prompts")
    parser.add_argument("--warm-steps", type=int, default=450, help="warm start of the checkpoint both variants share")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds between up and the first user")
    parser.add_argument("--bucket", type=float, default=30.0, help="seconds per point of the served-accuracy curve")
    parser.add_argument("--heldout-samples", type=int, default=4, help="samples per held-out prompt and version")
    parser.add_argument("--heldout-versions", type=int, default=40, help="promoted versions replayed (evenly spread)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--override", default="", help='JSON spec overrides by variant, e.g. {"production": {...}}')
    parser.add_argument("--keep", action="store_true", help="keep the variant specs, ledgers and versions")
    parser.add_argument("--rate-deferred", type=Path, metavar="LEDGER", help="send a ledger's deferred ratings")
    parser.add_argument("--url", help="with --rate-deferred: the gateway")
    parser.add_argument("--key-file", type=Path, help="with --rate-deferred: the gateway's API key file")
    opts = parser.parse_args()
    if opts.rate_deferred is not None:
        if not opts.url or not opts.key_file:
            raise SystemExit("--rate-deferred needs --url and --key-file")
        sent = asyncio.run(rate_deferred(opts.rate_deferred, opts.url, opts.key_file.read_text().strip()))
        print(f"sent {sent} deferred ratings")
        return
    if opts.quick:
        opts.duration, opts.variants, opts.delay_mean, opts.delay_max = 30.0, "production", 3.0, 10.0
        opts.bucket, opts.heldout_samples, opts.warmup = 10.0, 2, 5.0
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))  # replay is chatty
    checkpoint = warm_checkpoint(opts.warm_steps)
    folder = Path(tempfile.mkdtemp(prefix="fw-users-"))
    results: dict[str, dict[str, Any]] = {}
    try:
        for name in [v.strip() for v in opts.variants.split(",") if v.strip()]:
            if name not in ("production", "mixed"):
                raise SystemExit(f"unknown variant {name!r}; expected production and/or mixed")
            results[name] = run_variant(name, opts, checkpoint, folder)
            print(table({name: results[name]}), flush=True)
    finally:
        if not opts.keep:
            shutil.rmtree(folder, ignore_errors=True)
    settings = {k: v for k, v in vars(opts).items() if k not in ("rate_deferred", "url", "key_file")}
    settings["warm_checkpoint"] = str(checkpoint)
    path = write_results("users", {"settings": settings, "variants": results})
    plot(results, RESULTS_DIR / "users.png")
    print(table(results))
    print(f"wrote {path} and {RESULTS_DIR / 'users.png'}")
    if not all(r["ledgers"]["agree"] for r in results.values()):
        raise SystemExit("the ledgers disagree: " + json.dumps({n: r["ledgers"] for n, r in results.items()}))


if __name__ == "__main__":
    main()
