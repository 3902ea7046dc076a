"""The promotion gate: replay recent recordings with each new version before it may serve users; roll back a
serving version whose live feedback drops.

Contract:
- Watches the weights bucket's ``current`` key. For the newest version not yet decided, the gate first takes its own
  copy of it (``hold``: the learner's stores may prune ``vN`` at any time, never the gate's copy), then: with nothing
  serving yet it is promoted unconditionally; otherwise the newest ``max_samples`` scorable samples recorded within
  ``recent_window_s`` (``replay_from``: users' requests, scored by their domain's verifier, and/or the domains'
  training samples; a request recorded twice counts once) are replayed (the same :class:`~actors.replay.Replayer` as
  ``flywheel replay``, same seed for every side) with the candidate, the serving version and the best version served
  so far, and ``actors.replay.decide`` promotes, rejects (a drop beyond ``threshold`` against either) or holds
  (without enough evidence).
- The best version served so far (the champion) is the first promoted version, then any promoted version whose
  replayed mean reward was at least the champion's on the same samples; it stays pinned. So the serving version
  is always within ``threshold`` of it, and it never goes down: a chain of slightly worse versions cannot
  ratchet what users are served down.
- Promotion pins the version and moves ``serving`` (see ``actors.replay._promote``); a rejection logs
  ``gate.rejected`` with the figures and leaves ``serving`` alone, so the candidate stays on the training
  generators only. Every decision is a line of ``<run_dir>/gate/decisions.jsonl`` carrying ``best_version`` and
  its ``best_mean_reward`` (a promotion that makes a new champion: the candidate's, the champion it was measured
  against in ``previous_best_version`` / ``previous_best_mean_reward``) — but
  holds for want of evidence (fewer than ``min_samples`` recorded requests to replay, as with every version until
  users come) at most one a minute, the others counted (``holds_not_logged``). The log is read once at start, then
  only its new lines (`DecisionLog`).
- Rollback (``rollback_margin`` not null): every ``rollback_check_s`` the gate reads the new traffic and feedback
  recordings; when the serving version was promoted over a previous one and users' mean feedback score on its
  answers is below the previous version's by more than ``rollback_margin`` and by more than twice the standard
  error (each side ``rollback_min_feedback`` events or more), ``serving`` goes back to the previous version
  (logged as ``rollback`` with the figures; the champion too, when it was the rolled-back version). A version
  that served after a rollback is judged again only once a new version is promoted.
- Paused (an operator's ``flywheel promote`` / ``rollback`` / ``gate pause``; see ``actors.replay._promote``) the
  gate holds every version without replaying it and rolls nothing back, until ``flywheel gate resume``; such holds
  are logged once a minute like those for want of evidence. The pause is read from the log before a decision and
  again before it acts (a replay takes seconds), so an operator's move in between stands.
- Versions published while a decision runs are not queued: the next decision takes the newest one.
- A restart resumes after the newest version in the decisions log, with its champion (after holds that were only
  counted, it decides on the learner's current version again).

Counters: ``serving_version`` (the ``serving`` key, whoever moved it), ``best_version``, ``paused`` (1 while
paused), ``last_decision`` (text), ``last_decision_version``, ``last_decision_ts``, ``decisions.<action>``,
``superseded`` (versions pruned before the gate could hold them), ``live_serving_mean_score`` /
``live_previous_mean_score`` and their feedback counts.

Non-goals: gating on anything but mean verifier reward; several gates per topology.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson

from actors.gate._config import GateConfig
from actors.gate._feedback import FeedbackByVersion
from actors.protocol import CURRENT, SERVING, weights_bucket
from actors.replay import (
    DecisionLog,
    RecordingsTail,
    Replayer,
    ReplayItem,
    ReplayRun,
    build_report,
    decide,
    hold,
    items_from_scored,
    items_from_traffic,
    mean_reward,
    promote,
    record,
    release,
    rollback,
    serving_manifest,
)
from actors.weights import WeightManifest, WeightPayloadError, weight_transports
from topology.runtime import Actor, ActorContext, iterate_until

__all__ = ["GateActor"]

_DECIDES = ("promote", "reject", "hold")
HOLD_LOG_EVERY_S = 60.0


@dataclass(frozen=True)
class _Best:
    version: int
    manifest: WeightManifest  # pinned (serving-vN)


class GateActor(Actor[GateConfig]):
    def __init__(self, ctx: ActorContext, config: GateConfig) -> None:
        super().__init__(ctx, config)
        folder = Path(config.recordings)
        self.recordings = folder if folder.is_absolute() else ctx.run_dir / folder
        self.replayer: Replayer | None = None
        self.log = DecisionLog(ctx.run_dir)  # read once here, then only what is appended
        decisions = self.log.update()
        self.decided = max(
            (int(e["version"]) for e in decisions if e.get("action") in _DECIDES and "version" in e), default=0
        )
        self.best = _restore_best(decisions)
        self._transports = weight_transports(ctx)
        self._bucket = weights_bucket(ctx.topology)
        self._tails = {c: RecordingsTail(self.recordings, c) for c in ("traffic", "feedback", "scored")}
        pool = max(4 * config.max_samples, 1024)
        self._items: dict[str, deque[ReplayItem]] = {"traffic": deque(maxlen=pool), "scored": deque(maxlen=pool)}
        self.feedback = FeedbackByVersion()
        self._refreshing = anyio.Lock()
        # a hold that comes with every version (for want of evidence; paused): which, and when it was last logged
        self._repeating: str | None = None
        self._repeat_logged = -math.inf
        # "<action> v<N>: <reason>" of the newest decision (heartbeats carry it as text)
        self.last_decision = next(
            (f"{e['action']} v{e['version']}: {e.get('reason', '')}" for e in reversed(decisions) if "version" in e),
            "",
        )

    async def start(self) -> None:
        threads = self.ctx.threads
        self.replayer = await anyio.to_thread.run_sync(lambda: Replayer(self.ctx.spec, num_threads=threads))
        await self.replayer.__aenter__()
        serving = await serving_manifest(self.ctx.bus)
        if serving is not None:
            self.ctx.counters.set("serving_version", serving.version)
        if self.best is not None:
            self.ctx.counters.set("best_version", self.best.version)
        self.ctx.log.info(
            "gate.ready",
            threshold=self.config.threshold,
            decided=self.decided,
            best=self.best.version if self.best else None,
            replay_from=self.config.replay_from,
        )

    async def stop(self) -> None:
        if self.replayer is not None:
            await self.replayer.__aexit__(None, None, None)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            if self.config.rollback_margin is not None:
                tg.start_soon(self._watch_feedback)
            tg.start_soon(self._watch_serving)
            await self._watch_versions()
            tg.cancel_scope.cancel()

    async def _watch_versions(self) -> None:
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

    async def _watch_serving(self) -> None:
        """``serving_version`` follows the ``serving`` key whoever moves it: an operator's ``flywheel promote`` or
        ``rollback`` writes it from another process, and the live view and ``flywheel status`` read this counter as
        the version users get. ``paused`` is re-read with it, since such a move pauses the gate."""
        async for raw in iterate_until(self.ctx.bus.kv_watch(self._bucket, SERVING), self.ctx.stopping):
            self.ctx.counters.set("serving_version", WeightManifest.from_json(raw).version)
            self._paused()

    def report(self) -> dict[str, Any]:
        report: dict[str, Any] = dict(self.ctx.counters.snapshot())
        if self.last_decision:
            report["last_decision"] = self.last_decision
        return report

    # -- promotion ------------------------------------------------------------------------------------
    async def consider(self, candidate: WeightManifest) -> dict[str, Any] | None:
        """Decide on one version (and act on the decision); returns the logged entry, or None when the version was
        pruned before the gate could hold it (a newer one is current then)."""
        try:
            held = await hold(self.ctx.bus, self.ctx.run_dir, candidate)
        except WeightPayloadError as exc:
            self.ctx.counters.inc("superseded")
            self.ctx.log.info("gate.superseded", version=candidate.version, reason=str(exc))
            return None
        try:
            return await self._decide(candidate, held)
        finally:
            await release(self.ctx.bus, self.ctx.run_dir, held)

    async def _promote(
        self,
        candidate: WeightManifest,
        held: WeightManifest,
        reason: str,
        figures: dict[str, Any],
        *,
        keep: Iterable[int],
        becomes_best: bool,
    ) -> dict[str, Any]:
        """Serve ``held`` (the pinned copy of ``candidate``); remember it as the best version when it becomes one."""
        entry = await promote(
            self.ctx.bus,
            self.ctx.run_dir,
            held,
            by=self.ctx.replica_id,
            reason=reason,
            figures=figures,
            keep=keep,
            log=self.log,
        )
        if becomes_best:
            self.best = _Best(candidate.version, WeightManifest.from_json(orjson.dumps(entry["manifest"])))
        return entry

    def _paused(self) -> bool:
        """Whether an operator paused the gate (their move stands until ``flywheel gate resume``): the log's newest
        lines are read first (``flywheel promote`` / ``rollback`` / ``gate`` append to it from another process)."""
        self.log.update()
        self.ctx.counters.set("paused", 1.0 if self.log.paused is not None else 0.0)
        return self.log.paused is not None

    async def _decide(self, candidate: WeightManifest, held: WeightManifest) -> dict[str, Any]:
        serving = await serving_manifest(self.ctx.bus)
        who = self.ctx.replica_id
        if self._paused():
            return self._hold_paused(candidate, serving)
        if serving is None:
            decision = decide(None, None, has_serving=False, threshold=self.config.threshold, samples=0, min_samples=1)
            first: dict[str, Any] = {"best_version": candidate.version}
            entry = await self._promote(candidate, held, decision.reason, first, keep=(), becomes_best=True)
            self._counted(entry)
            return entry
        figures = await self._compare(held, serving)
        if self._paused():  # paused while the versions were replayed
            return self._hold_paused(candidate, await serving_manifest(self.ctx.bus))
        decision = decide(
            figures["candidate_mean_reward"],
            figures["serving_mean_reward"],
            has_serving=True,
            threshold=self.config.threshold,
            samples=figures["samples"],
            min_samples=self.config.min_samples,
            without_evidence=self.config.without_evidence,
            best=figures.get("best_mean_reward"),
            best_version=figures.get("best_version"),
        )
        if decision.action == "promote":
            becomes_best = self.best is None or _at_least(
                figures["candidate_mean_reward"], figures.get("best_mean_reward")
            )
            if becomes_best and self.best is not None:  # the entry names the new champion with its own figure; the
                #   champion it was measured against stays in the entry as the previous one
                figures["previous_best_version"] = self.best.version
                figures["previous_best_mean_reward"] = figures.get("best_mean_reward")
                figures["best_mean_reward"] = figures["candidate_mean_reward"]
            figures["best_version"] = candidate.version if becomes_best or self.best is None else self.best.version
            keep = {self.best.version} if self.best is not None else set()
            entry = await self._promote(candidate, held, decision.reason, figures, keep=keep, becomes_best=becomes_best)
        else:
            entry = {
                "action": decision.action,
                "version": candidate.version,
                "by": who,
                "reason": decision.reason,
                "serving": False,
                "kept": serving.version,
                "manifest": orjson.loads(candidate.to_json()),
                **figures,
                "best_version": self.best.version if self.best is not None else None,
            }
            unproven = decision.action == "hold" and figures["samples"] < self.config.min_samples
            if self._repeated_hold(entry, "unproven" if unproven else None):
                return entry
            self.ctx.log.warning(
                "gate.rejected" if decision.action == "reject" else "gate.held",
                version=candidate.version,
                serving=serving.version,
                reason=decision.reason,
                candidate_mean_reward=figures["candidate_mean_reward"],
                serving_mean_reward=figures["serving_mean_reward"],
                best_mean_reward=figures.get("best_mean_reward"),
                samples=figures["samples"],
            )
        self._counted(entry)
        return entry

    def _repeated_hold(self, entry: dict[str, Any], why: str | None) -> bool:
        """Log ``entry`` — unless it is a hold that comes with every version (``why``: for want of evidence, until
        users' requests are recorded; paused by an operator), of which one line a minute is written and the others
        counted (``holds_not_logged``), not a line per version. True when it was only counted."""
        if why is not None and why == self._repeating and time.monotonic() - self._repeat_logged < HOLD_LOG_EVERY_S:
            self.ctx.counters.inc("holds_not_logged")
            entry["ts"] = time.time()
            self._counted(entry, quiet=True)
            return True
        entry.update(record(self.ctx.run_dir, entry))
        self._repeating, self._repeat_logged = why, (time.monotonic() if why is not None else -math.inf)
        return False

    def _hold_paused(self, candidate: WeightManifest, serving: WeightManifest | None) -> dict[str, Any]:
        paused = self.log.paused
        assert paused is not None
        what = f"{paused['action']} of v{paused['version']}" if "version" in paused else str(paused["action"])
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(paused.get("ts", time.time()))))
        entry = {
            "action": "hold",
            "version": candidate.version,
            "by": self.ctx.replica_id,
            "reason": f"paused by {paused.get('by', '?')}'s {what} at {since} (flywheel gate resume ends it)",
            "serving": False,
            "kept": serving.version if serving is not None else None,
            "manifest": orjson.loads(candidate.to_json()),
            "best_version": self.best.version if self.best is not None else None,
        }
        if self._repeated_hold(entry, "paused"):
            return entry
        self.ctx.log.info("gate.paused", version=candidate.version, reason=entry["reason"])
        self._counted(entry)
        return entry

    async def _compare(self, held: WeightManifest, serving: WeightManifest) -> dict[str, Any]:
        assert self.replayer is not None
        items = await self.recent_items()
        best = self.best if self.best is not None and self.best.version not in (serving.version,) else None
        figures: dict[str, Any] = {
            "samples": len(items),
            "replayed_from": dict(_count_sources(items)),
            "serving_version": serving.version,
            "candidate_mean_reward": None,
            "serving_mean_reward": None,
            "best_version": self.best.version if self.best is not None else None,
            "best_mean_reward": None,
        }
        if len(items) < self.config.min_samples:
            return figures
        mine = await self._replay(items, held)
        theirs = await self._replay(items, serving)
        figures["candidate_mean_reward"] = mean_reward(mine)
        figures["serving_mean_reward"] = mean_reward(theirs)
        if self.best is not None and best is None:  # the serving version is the best one
            figures["best_mean_reward"] = figures["serving_mean_reward"]
        elif best is not None:
            try:
                figures["best_mean_reward"] = mean_reward(await self._replay(items, best.manifest))
            except WeightPayloadError as exc:  # its pinned copy is gone (removed by hand): no champion any more
                self.ctx.log.warning("gate.best_lost", version=best.version, error=str(exc))
                self.best = None
                figures["best_version"] = None
        report = build_report(items, mine, theirs, seed=self.config.seed)
        figures["by_domain"] = {
            d: {"candidate": r["replayed_mean_reward"], "serving": r["against_mean_reward"], "samples": r["scored"]}
            for d, r in report["domains"].items()
        }
        return figures

    async def _replay(self, items: list[ReplayItem], manifest: WeightManifest) -> ReplayRun:
        assert self.replayer is not None
        return await self.replayer.run(
            items,
            await self._load(manifest),
            label=f"v{manifest.version}",
            version=manifest.version,
            seed=self.config.seed,
            concurrency=self.config.concurrency,
            greedy=self.config.greedy,
        )

    async def recent_items(self) -> list[ReplayItem]:
        """The newest ``max_samples`` scorable samples recorded within ``recent_window_s`` (see ``replay_from``)."""
        await self.refresh()
        horizon = time.time() - self.config.recent_window_s
        fresh = {name: _newest_each([i for i in pool if i.ts >= horizon]) for name, pool in self._items.items()}
        wanted = self.config.max_samples
        if self.config.replay_from == "traffic":
            chosen = fresh["traffic"][-wanted:]
        elif self.config.replay_from == "scored":
            chosen = fresh["scored"][-wanted:]
        else:
            users = fresh["traffic"][-wanted:]
            chosen = fresh["scored"][len(fresh["scored"]) - (wanted - len(users)) :] if len(users) < wanted else []
            chosen = [*chosen, *users]
        return sorted(chosen, key=lambda item: (item.ts, item.key))

    async def refresh(self) -> None:
        """Read what the recorder wrote since the last look: scorable samples into the replay pools, traffic and
        feedback into the live-feedback tally."""
        assert self.replayer is not None
        replayer = self.replayer
        async with self._refreshing:

            def read() -> None:
                traffic = self._tails["traffic"].new_rows()
                feedback = self._tails["feedback"].new_rows()
                self.feedback.add_traffic(traffic)
                self.feedback.add_feedback(feedback)
                if self.config.replay_from != "scored":
                    empty = feedback.clear()
                    self._items["traffic"].extend(
                        i for i in map(replayer.with_fields, items_from_traffic(traffic, empty)) if replayer.scorable(i)
                    )
                if self.config.replay_from != "traffic":
                    scored = self._tails["scored"].new_rows()
                    self._items["scored"].extend(i for i in items_from_scored(scored) if replayer.scorable(i))

            await anyio.to_thread.run_sync(read)

    async def _load(self, manifest: WeightManifest) -> Any:
        transport = self._transports.get(manifest.transport)
        if transport is None:
            raise ValueError(f"v{manifest.version}: transport {manifest.transport!r} is not readable by the gate")
        return await transport.get(manifest)

    # -- rollback -------------------------------------------------------------------------------------
    async def _watch_feedback(self) -> None:
        while True:
            await anyio.sleep(self.config.rollback_check_s)
            try:
                await self.check_feedback()
            except (WeightPayloadError, OSError, ValueError) as exc:
                self.ctx.counters.inc("errors")
                self.ctx.log.warning("gate.feedback_check_failed", error=str(exc))

    async def check_feedback(self) -> dict[str, Any] | None:
        """Compare users' feedback on the serving version with the version it replaced; roll back on a drop.
        Returns the rollback's log entry, or None."""
        margin = self.config.rollback_margin
        if margin is None:
            return None
        await self.refresh()
        if self._paused():  # an operator's choice stands, whatever users' feedback says
            return None
        serving_entries = self.log.serving
        if not serving_entries:
            return None
        last = serving_entries[-1]
        current = await serving_manifest(self.ctx.bus)
        if last.get("action") != "promote" or last.get("previous") is None or current is None:
            return None
        if current.version != int(last["version"]):
            return None
        comparison = self.feedback.compare(
            current.version, int(last["previous"]), margin=margin, min_feedback=self.config.rollback_min_feedback
        )
        if comparison is None:
            return None
        counters = self.ctx.counters
        counters.set("live_serving_mean_score", round(comparison.serving_mean, 4))
        counters.set("live_serving_feedback", comparison.serving_n)
        counters.set("live_previous_mean_score", round(comparison.previous_mean, 4))
        counters.set("live_previous_feedback", comparison.previous_n)
        if not comparison.dropped:
            return None
        reason = (
            f"live feedback on v{comparison.serving} {comparison.serving_mean:.4f} (n={comparison.serving_n}) < "
            f"v{comparison.previous} {comparison.previous_mean:.4f} (n={comparison.previous_n}) - {margin}"
        )
        best_version = self.best.version if self.best is not None else None
        if best_version == comparison.serving:
            best_version = comparison.previous
        entry = await rollback(
            self.ctx.bus,
            self.ctx.run_dir,
            log=self.log,
            by=self.ctx.replica_id,
            reason=reason,
            figures={**comparison.figures(), "best_version": best_version},
        )
        if self.best is not None and self.best.version == comparison.serving:
            self.best = _Best(int(entry["version"]), WeightManifest.from_json(orjson.dumps(entry["manifest"])))
        self.ctx.log.warning("gate.rolled_back", **comparison.figures(), to=entry["version"])
        self._counted(entry)
        return entry

    def _counted(self, entry: dict[str, Any], *, quiet: bool = False) -> None:
        counters = self.ctx.counters
        counters.inc(f"decisions.{entry['action']}")
        if entry.get("serving"):
            counters.set("serving_version", entry["version"])
        if self.best is not None:
            counters.set("best_version", self.best.version)
        self.last_decision = f"{entry['action']} v{entry['version']}: {entry['reason']}"
        counters.set("last_decision_version", entry["version"])
        counters.set("last_decision_ts", round(float(entry.get("ts", time.time())), 3))
        if not quiet:
            self.ctx.log.info("gate.decided", action=entry["action"], version=entry["version"], reason=entry["reason"])


def _newest_each(items: list[ReplayItem]) -> list[ReplayItem]:
    """One item per key, the one added last, in the order they were added. A request published again once the bus's
    dedupe window was over is recorded twice, and a later refresh reads its second row: replayed twice, it would
    weigh twice in a decision (the replay keeps a request's newest row too, ``items_from_traffic``)."""
    last = {item.key: n for n, item in enumerate(items)}
    return [item for n, item in enumerate(items) if last[item.key] == n]


def _at_least(value: float | None, other: float | None) -> bool:
    return value is not None and (other is None or value >= other)


def _count_sources(items: list[ReplayItem]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item.source] = counts.get(item.source, 0) + 1
    return counts


def _restore_best(decisions: list[dict[str, Any]]) -> _Best | None:
    """The champion after the newest decision that names one, with its pinned manifest."""
    version = next((e["best_version"] for e in reversed(decisions) if "best_version" in e), None)
    if version is None:
        return None
    for entry in reversed(decisions):
        if entry.get("serving") and entry.get("version") == version and "manifest" in entry:
            return _Best(int(version), WeightManifest.from_json(orjson.dumps(entry["manifest"])))
    return None
