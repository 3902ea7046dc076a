"""The always-on service end to end, as users see it: `flywheel up` (real processes, real nats-server), users sending
requests and feedback over HTTP, and every actor of the production loop SIGKILLed in turn while they do.

The property (the three ledgers agree): every request the gateway acknowledged is in the recorder's parquet exactly
once; every feedback the gateway accepted is recorded, and applied by the learner exactly once — counted from the
learner's audit trail (`actors.learner.effective_applied`: what is in the final weights), not from its counters.
Meanwhile the gate keeps deciding (its log grows after its own restart).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from actors.learner import effective_applied, read_metrics
from actors.protocol import read_recordings
from actors.replay import read_decisions
from tests.topology.runtime._helpers import status_json, wait_for

ROOT = Path(__file__).resolve().parents[1]
SPEC = """\
name: svc-crash
bus: {embedded: true, ack_wait_s: 5, max_deliver: 50}
runtime:
  run_dir: runs
  heartbeat_s: 0.3
  restart: {max_restarts: 5, window_s: 120, backoff_s: 0.2, backoff_max_s: 1}
policy:
  model: builtin:tiny-gpt
  config: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2, seed: 0}
  warm_start: {steps: 0}
domains:
  production: {source: "jsonl:production.jsonl", verifier: math, group_size: 1, heldout: 4, max_new_tokens: 4}
actors:
  serving:
    kind: generator
    consumes: []
    publishes: []
    serve: true
    follow: serving
    max_batch_size: 16
    resources: {num_cpus: 0.25}
  gateway: {port: PORT, default_max_tokens: 4, request_timeout_s: 10, resources: {num_cpus: 0.25}}
  joiner: {resources: {num_cpus: 0}}
  recorder: {flush_every_s: 1, resources: {num_cpus: 0}}
  learner:
    resources: {num_cpus: 0.5}
    batch_size: 8
    checkpoint_every_steps: 2
    eval_every_steps: 0
    partial_batch_after_s: 2
    publish_min_interval_s: 1
    metrics_flush_s: 0.5
  gate:
    resources: {num_cpus: 0.25}
    replay_from: traffic
    min_samples: 4
    max_samples: 16
    greedy: true
    rollback_check_s: 2
"""
KILLED = ("gateway", "joiner", "recorder", "learner", "serving", "gate")


class Users:
    """A few users: each sends a prompt, then rates the answer at once (retrying until the gateway accepts it)."""

    def __init__(self, url: str, key: str, prompts: list[str]) -> None:
        self.url, self.key, self.prompts = url, key, prompts
        self.acknowledged: set[str] = set()
        self.accepted: set[str] = set()
        self.failures = 0

    async def user(self, index: int, stop: asyncio.Event) -> None:
        rng = random.Random(index)
        async with httpx.AsyncClient(timeout=15) as http:
            while not stop.is_set():
                body = {"model": "flywheel", "prompt": rng.choice(self.prompts), "max_tokens": 4}
                try:
                    response = await http.post(f"{self.url}/v1/completions", json=body)
                except httpx.HTTPError:
                    response = None
                if response is None or response.status_code != 200:
                    self.failures += 1
                    await asyncio.sleep(0.3)
                    continue
                rid = response.json()["id"]
                self.acknowledged.add(rid)
                rating = {"request_id": rid, "score": float(rng.random() < 0.5)}
                while not stop.is_set():
                    try:
                        fb = await http.post(
                            f"{self.url}/v1/feedback", json=rating, headers={"Authorization": f"Bearer {self.key}"}
                        )
                        if fb.status_code == 200:
                            self.accepted.add(rid)
                            break
                    except httpx.HTTPError:
                        pass
                    await asyncio.sleep(0.3)


def pid_of(run_dir: Path, actor: str) -> int | None:
    for row in status_json(run_dir).get("replicas", []):
        if row["actor"] == actor and row["state"] == "running":
            return int(row["pid"])
    return None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_actor_killed_in_turn_and_the_three_ledgers_agree(tmp_path: Path) -> None:
    rows = [f"{a}+{b}=" for a in range(10) for b in range(4)]
    (tmp_path / "production.jsonl").write_text(
        "\n".join(json.dumps({"prompt": p, "verifier_fields": {"answer": str(eval(p[:-1]))}}) for p in rows) + "\n"
    )
    with socket.socket() as sock:  # a fixed port: the restarted gateway is where users know it is
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp_path / "spec.yaml").write_text(SPEC.replace("PORT", str(port)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLYWHEEL_API_KEYS", None)
    up = subprocess.Popen(
        [sys.executable, "-m", "topology.cli", "up", str(tmp_path / "spec.yaml"), "--every", "1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert up.stdout is not None
    url = key_file = ""
    output: list[str] = []
    while not (url and key_file):
        line = up.stdout.readline()
        assert line, "flywheel up ended early:\n" + "".join(output[-30:])
        output.append(line)
        if line.startswith("gateway:") and "API key in" in line:
            key_file = line.split("API key in", 1)[1].strip()
        elif line.startswith("gateway:"):
            url = line.split(None, 1)[1].strip()
    run_dir = (tmp_path / "runs" / "latest").resolve()
    users = Users(url, Path(key_file).read_text().strip(), rows)
    kills: list[tuple[str, int]] = []

    async def scenario() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(users.user(i, stop)) for i in range(4)]
        await asyncio.sleep(6)
        for actor in KILLED:
            pid = await asyncio.to_thread(wait_for, f"{actor} running", lambda a=actor: pid_of(run_dir, a), 60)
            os.kill(pid, signal.SIGKILL)
            kills.append((actor, pid))
            await asyncio.sleep(5)
        await asyncio.to_thread(wait_for, "every replica back", lambda: all(pid_of(run_dir, a) for a in KILLED), 60)
        after_kills = len(users.accepted)
        await asyncio.to_thread(wait_for, "users served again", lambda: len(users.accepted) > after_kills + 20, 60)
        stop.set()
        await asyncio.gather(*tasks)

    try:
        asyncio.run(scenario())

        def settled() -> bool:
            applied = read_metrics(run_dir, "applied")
            return applied.height > 0 and users.accepted <= set(applied["task_id"].to_list())

        wait_for("every accepted feedback applied", settled, timeout_s=60, every_s=1)
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=60)
        output.append(rest)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 0, "".join(output[-40:])
    assert len(kills) == len(KILLED), kills
    assert len(users.acknowledged) > 50 and len(users.accepted) > 50

    recorded = read_recordings(run_dir, "traffic")["request_id"].to_list()
    assert users.acknowledged <= set(recorded), "an acknowledged request is missing from the recordings"
    assert len(recorded) == len(set(recorded)), "a request was recorded twice"
    feedback = read_recordings(run_dir, "feedback")["request_id"].to_list()
    assert users.accepted <= set(feedback), "an accepted feedback is missing from the recordings"

    applied: list[str] = [str(m) for m in effective_applied(run_dir)["message_id"].to_list()]
    assert all(m.startswith("joined.") for m in applied)
    once = [m.removeprefix("joined.") for m in applied]
    assert sorted(once) == sorted(set(once)), "a feedback was applied twice"
    assert set(once) == users.accepted, "applied feedback differs from what the gateway accepted"
    assert len({e["version"] for e in read_decisions(run_dir)}) >= 2  # the gate decided, before and after its kill


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_shipped_service_spec_answers_the_official_openai_client(tmp_path: Path) -> None:
    """`flywheel up specs/service.yaml` as a user runs it: the URL and the key file are printed; the official client
    gets chat, streaming, completions and models; bad input is an OpenAI-shaped 4xx; feedback needs the key."""
    import openai

    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLYWHEEL_GATEWAY_PORT": "0", "FLYWHEEL_METRICS_PORT": "0"}
    env.pop("FLYWHEEL_API_KEYS", None)
    up = subprocess.Popen(
        [sys.executable, "-m", "topology.cli", "up", "specs/service.yaml", "--run-dir", str(tmp_path), "--every", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert up.stdout is not None
    seen: dict[str, str] = {}
    output: list[str] = []
    try:
        while len(seen) < 3:
            line = up.stdout.readline()
            assert line, "flywheel up ended early:\n" + "".join(output[-30:])
            output.append(line)
            if line.startswith("gateway:") and "API key in" in line:
                seen["key_file"] = line.split("API key in", 1)[1].strip()
            elif line.startswith("gateway:"):
                seen["url"] = line.split(None, 1)[1].strip()
            elif line.startswith("metrics: "):
                seen["metrics"] = line.split(None, 1)[1].strip()
        assert seen["key_file"].startswith(str(tmp_path)) and seen["key_file"].endswith("/gateway/api_key")
        key = Path(seen["key_file"]).read_text().strip()

        def healthy() -> bool:  # the serving generator answers (it starts beside the gateway, not before it)
            return httpx.get(seen["url"] + "/healthz", timeout=5).status_code == 200

        wait_for("the serving generator", healthy, timeout_s=90, every_s=0.5)
        client = openai.OpenAI(base_url=seen["url"] + "/v1", api_key=key, max_retries=0, timeout=30)
        assert [m.id for m in client.models.list().data] == ["flywheel"]
        chat = client.chat.completions.create(model="flywheel", messages=[{"role": "user", "content": "7+5+9+3="}])
        assert chat.id.startswith("fw-") and isinstance(chat.choices[0].message.content, str)
        done = client.completions.create(model="flywheel", prompt="7+5+9+3=", max_tokens=8)
        assert done.id.startswith("fw-") and done.choices[0].finish_reason in ("stop", "length")
        chunks = list(
            client.chat.completions.create(
                model="flywheel", messages=[{"role": "user", "content": "1+2="}], stream=True
            )
        )
        assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(model="flywheel", prompt="x", max_tokens=100_000)
        assert bad.value.status_code == 400 and "max_tokens" in str(bad.value)
        refused = httpx.post(seen["url"] + "/v1/feedback", json={"request_id": done.id, "score": 1}, timeout=10)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "missing_api_key"
        accepted = httpx.post(
            seen["url"] + "/v1/feedback",
            json={"request_id": done.id, "label": "thumbs_up"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )
        assert accepted.status_code == 200 and accepted.json()["request_id"] == done.id
        assert "flywheel_replica_up" in httpx.get(seen["metrics"], timeout=10).text
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
