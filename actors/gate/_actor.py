"""The promotion gate: replay recent recordings with each new version before it may serve users.

Contract:
- Watches the weights bucket's ``current`` key. For the newest version not yet decided: with nothing serving
  yet it is promoted unconditionally; otherwise the newest ``max_samples`` scorable samples recorded within
  ``recent_window_s`` are replayed (the same :class:`~actors.replay.Replayer` as ``flywheel replay``, same
  seed for both sides) with the candidate and with the serving version, and ``actors.replay.decide``
  promotes or rejects (or holds, without enough evidence).
- Promotion pins the version and moves ``serving`` (see ``actors.replay._promote``); a rejection logs
  ``gate.rejected`` with the figures and leaves ``serving`` alone, so the candidate stays on the training
  generators only. Every decision is a line of ``<run_dir>/gate/decisions.jsonl``.
- Versions published while a decision runs are not queued: the next decision takes the newest one.
- A restart resumes after the newest version in the decisions log.

Non-goals: gating on anything but mean verifier reward; several gates per topology.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import orjson

from actors.gate._config import GateConfig
from actors.protocol import CURRENT, weights_bucket
from actors.replay import (
    Replayer,
    build_report,
    decide,
    load_items,
    mean_reward,
    promote,
    read_decisions,
    record,
    serving_manifest,
)
from actors.weights import WeightManifest, WeightPayloadError, weight_transports
from topology.runtime import Actor, ActorContext, iterate_until

__all__ = ["GateActor"]


class GateActor(Actor[GateConfig]):
    def __init__(self, ctx: ActorContext, config: GateConfig) -> None:
        super().__init__(ctx, config)
        folder = Path(config.recordings)
        self.recordings = folder if folder.is_absolute() else ctx.run_dir / folder
        self.replayer: Replayer | None = None
        self.decided = max(
            (
                int(e["version"])
                for e in read_decisions(ctx.run_dir)
                if e.get("action") in ("promote", "reject", "hold") and "version" in e
            ),
            default=0,
        )
        self._transports = weight_transports(ctx)
        self._bucket = weights_bucket(ctx.topology)

    async def start(self) -> None:
        threads = self.ctx.threads
        self.replayer = await anyio.to_thread.run_sync(lambda: Replayer(self.ctx.spec, num_threads=threads))
        await self.replayer.__aenter__()
        self.ctx.log.info("gate.ready", threshold=self.config.threshold, decided=self.decided)

    async def stop(self) -> None:
        if self.replayer is not None:
            await self.replayer.__aexit__(None, None, None)

    async def run(self) -> None:
        async for _ in iterate_until(self.ctx.bus.kv_watch(self._bucket, CURRENT), self.ctx.stopping):
            raw = await self.ctx.bus.kv_get(self._bucket, CURRENT)  # the newest, not the one that woke us
            if raw is None:
                continue
            manifest = WeightManifest.from_json(raw)
            if manifest.version > self.decided:
                try:
                    await self.consider(manifest)
                except (WeightPayloadError, OSError, ValueError) as exc:
                    self.ctx.counters.inc("errors")
                    self.ctx.log.warning("gate.failed", version=manifest.version, error=str(exc))
                self.decided = max(self.decided, manifest.version)

    async def consider(self, candidate: WeightManifest) -> dict[str, Any]:
        """Decide on one version (and act on the decision); returns the logged entry."""
        assert self.replayer is not None
        serving = await serving_manifest(self.ctx.bus)
        who = self.ctx.replica_id
        if serving is None:
            decision = decide(
                None,
                None,
                has_serving=False,
                threshold=self.config.threshold,
                samples=0,
                min_samples=self.config.min_samples,
            )
            entry = await promote(self.ctx.bus, self.ctx.run_dir, candidate, by=who, reason=decision.reason)
            self._counted(entry)
            return entry
        figures = await self._compare(candidate, serving)
        decision = decide(
            figures["candidate_mean_reward"],
            figures["serving_mean_reward"],
            has_serving=True,
            threshold=self.config.threshold,
            samples=figures["samples"],
            min_samples=self.config.min_samples,
            without_evidence=self.config.without_evidence,
        )
        if decision.action == "promote":
            entry = await promote(
                self.ctx.bus, self.ctx.run_dir, candidate, by=who, reason=decision.reason, figures=figures
            )
        else:
            entry = record(
                self.ctx.run_dir,
                {
                    "action": decision.action,
                    "version": candidate.version,
                    "by": who,
                    "reason": decision.reason,
                    "serving": False,
                    "kept": serving.version,
                    "manifest": orjson.loads(candidate.to_json()),
                    **figures,
                },
            )
            self.ctx.log.warning(
                "gate.rejected" if decision.action == "reject" else "gate.held",
                version=candidate.version,
                serving=serving.version,
                reason=decision.reason,
                candidate_mean_reward=figures["candidate_mean_reward"],
                serving_mean_reward=figures["serving_mean_reward"],
                samples=figures["samples"],
            )
        self._counted(entry)
        return entry

    async def _compare(self, candidate: WeightManifest, serving: WeightManifest) -> dict[str, Any]:
        assert self.replayer is not None
        replayer = self.replayer
        items = await anyio.to_thread.run_sync(lambda: load_items(self.recordings, since_s=self.config.recent_window_s))
        items = [item for item in items if replayer.scorable(item)][-self.config.max_samples :]
        figures: dict[str, Any] = {
            "samples": len(items),
            "serving_version": serving.version,
            "candidate_mean_reward": None,
            "serving_mean_reward": None,
        }
        if len(items) < self.config.min_samples:
            return figures
        options: dict[str, Any] = {
            "seed": self.config.seed,
            "concurrency": self.config.concurrency,
            "greedy": self.config.greedy,
        }
        mine = await replayer.run(
            items, await self._load(candidate), label=f"v{candidate.version}", version=candidate.version, **options
        )
        theirs = await replayer.run(
            items, await self._load(serving), label=f"v{serving.version}", version=serving.version, **options
        )
        report = build_report(items, mine, theirs, seed=self.config.seed)
        figures.update(
            {
                "candidate_mean_reward": mean_reward(mine),
                "serving_mean_reward": mean_reward(theirs),
                "by_domain": {
                    d: {
                        "candidate": r["replayed_mean_reward"],
                        "serving": r["against_mean_reward"],
                        "samples": r["scored"],
                    }
                    for d, r in report["domains"].items()
                },
            }
        )
        return figures

    async def _load(self, manifest: WeightManifest) -> Any:
        transport = self._transports.get(manifest.transport)
        if transport is None:
            raise ValueError(f"v{manifest.version}: transport {manifest.transport!r} is not readable by the gate")
        return await transport.get(manifest)

    def _counted(self, entry: dict[str, Any]) -> None:
        self.ctx.counters.inc(f"decisions.{entry['action']}")
        if entry["action"] == "promote":
            self.ctx.counters.set("serving_version", entry["version"])
        self.ctx.log.info("gate.decided", action=entry["action"], version=entry["version"], reason=entry["reason"])
