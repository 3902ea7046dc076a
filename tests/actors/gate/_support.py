"""A gate over a real nats-server with recorded *users' traffic*: prompts of a JSONL domain whose rows say what
the greedy answer of the spec's own policy is, so those weights score 1 and other weights score low."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import orjson

from actors.gate._actor import GateActor
from actors.gate._config import GateConfig
from actors.protocol import rows_of
from actors.recorder import ChannelWriter
from actors.replay import Replayer, ReplayItem
from actors.testing import actor_context
from actors.weights import SafetensorsDirTransport, WeightManifest, WeightPublisher
from tests.actors.replay._support import POLICY, PROMPTS, _ids
from topology import Spec, load_spec
from topology.bus import Bus
from topology.runtime import ActorContext


def gate_spec(tmp_path: Path, gate: str) -> Spec:
    """A spec with the JSONL domain ``users`` (answers filled in by :func:`expected_answers`) and a gate."""
    rows = [orjson.dumps({"prompt": p, "verifier_fields": {"expected": "?"}}).decode() for p in PROMPTS]
    (tmp_path / "users.jsonl").write_text("\n".join(rows) + "\n")
    path = tmp_path / "spec.yaml"
    path.write_text(
        f"name: gt-{uuid.uuid4().hex[:8]}\nbus: {{embedded: true}}\nruntime: local\n"
        f"policy: {{model: builtin:tiny-gpt, config: {orjson.dumps(POLICY).decode()}}}\n"
        "domains:\n  users: {source: 'jsonl:users.jsonl', verifier: 'tests.actors.replay._verifier:exact',"
        " heldout: 0, max_new_tokens: 6}\n"
        f"actors:\n  recorder: {{}}\n  gate: {gate}\n"
        "channels:\n  traffic: {external: true}\n  feedback: {external: true}\n  scored: {external: true}\n"
    )
    return load_spec(path)


async def expected_answers(spec: Spec) -> dict[str, str]:
    """The spec policy's greedy answer to every prompt, written into the domain's file as what is expected."""
    items = [
        ReplayItem(key=f"p{i}", source="scored", domain="users", prompt=p, prompt_ids=_ids(p), temperature=0.0)
        for i, p in enumerate(PROMPTS)
    ]
    async with Replayer(spec) as replayer:
        run = await replayer.run(items, None, label="initial", version=1, greedy=True)
    answers = {PROMPTS[int(o.key[1:])]: o.text for o in run.outcomes}
    rows = [orjson.dumps({"prompt": p, "verifier_fields": {"expected": answers[p]}}).decode() for p in PROMPTS]
    (spec.source_path.parent / "users.jsonl").write_text("\n".join(rows) + "\n")
    return answers


def record_traffic(
    run_dir: Path,
    requests: Sequence[tuple[str, int, float | None]],
    *,
    first_seq: int = 1,
    domain: str = "users",
    ids: Sequence[str] | None = None,
) -> None:
    """Traffic rows (prompt, served version, feedback score or None) as the recorder writes them, with feedback;
    ``ids``: the requests' ids (default: new ones)."""
    now = time.time()
    traffic, feedback = {}, {}
    for seq, (prompt, version, score) in enumerate(requests, start=first_seq):
        rid = f"fw-{uuid.uuid4().hex}" if ids is None else ids[seq - first_seq]
        payload = {
            "request_id": rid,
            "ts": now,
            "model": "flywheel",
            "route": "completions",
            "domain": domain,
            "prompt": prompt,
            "prompt_ids": list(_ids(prompt)),
            "completion": {
                "text": "x",
                "token_ids": [1],
                "logprobs": [0.0],
                "versions": [version],
                "finish_reason": "stop",
            },
            "temperature": 0.0,
            "max_tokens": 6,
        }
        traffic[seq] = (now, rows_of("traffic", payload, seq=seq, id=rid, ts=now, source="gateway/0"))
        if score is not None:
            body = {"request_id": rid, "score": score, "ts": now}
            feedback[seq] = (now, rows_of("feedback", body, seq=seq, id=f"fb-{rid}", ts=now, source="gateway/0"))
    ChannelWriter(run_dir / "recordings", "traffic").write(traffic)
    if feedback:
        ChannelWriter(run_dir / "recordings", "feedback").write(feedback)


@dataclass
class GateRig:
    gate: GateActor
    ctx: ActorContext
    bus: Bus
    publisher: WeightPublisher
    store: SafetensorsDirTransport
    run_dir: Path

    async def publish(self, version: int, weights: dict[str, object]) -> WeightManifest:
        """Publish a version and wait for the store's pruning, which trails a publish by a quarter second."""
        manifest = await self.publisher.publish(version, weights)  # type: ignore[arg-type]
        await anyio.to_thread.run_sync(self.store.wait_tidy, 10.0)
        return manifest

    async def decided(self, version: int, weights: dict[str, object]) -> None:
        """Publish a version and wait until the running gate has decided on it."""
        await self.publish(version, weights)
        with anyio.fail_after(30):
            while True:
                if self.gate.decided >= version:
                    break
                await anyio.sleep(0.05)


@asynccontextmanager
async def gate_rig(spec: Spec, url: str, run_dir: Path, *, run: bool = False) -> AsyncIterator[GateRig]:
    """A started gate (its watch loop running when ``run``) and a publisher of disk versions."""
    async with await Bus.connect(url, topology=spec.name, name="gate-test") as bus:
        store = SafetensorsDirTransport(run_dir / "weights")
        publisher = WeightPublisher(bus, spec.name, store)
        ctx = actor_context(spec, "gate", bus, run_dir)
        config = spec.actors["gate"].config
        assert isinstance(config, GateConfig)
        gate = GateActor(ctx, config)
        await gate.start()
        try:
            async with anyio.create_task_group() as tg:
                if run:
                    tg.start_soon(gate.run)
                yield GateRig(gate, ctx, bus, publisher, store, run_dir)
                ctx.stopping.set()
                tg.cancel_scope.cancel()
        finally:
            await gate.stop()
