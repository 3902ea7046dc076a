"""The live learning view of ``flywheel up``: version, reward and held-out accuracy by domain, throughput.

Everything shown comes from the replicas' heartbeat counters, so the view works the same for every runtime
and needs no extra channel. It reads these counter names (absent ones are simply not shown):

- learner: ``version``, ``step``, ``samples_applied``, ``staleness_mean``, ``reward.<domain>``,
  ``heldout_acc.<domain>``, ``heldout_acc_start.<domain>`` (the run's first round, every life of it),
  ``dropped_stale.<domain>``, ``phase`` (``warmstart`` / ``rl``, or 0 / 1), and during the warm start
  ``warmstart_step``, ``warmstart_steps`` and ``warmstart_loss`` (its RL ``step`` stays 0 until it ends), and
  ``eval_out`` (held-out prompts not scored yet: at step 0 the baseline round RL waits for);
- generators: ``tokens_per_s`` (summed over replicas), ``version`` (min and max over the replicas that train: those
  with ``follow: serving`` stay on the promoted version by design and count as serving, as those that answer
  requests do) and ``weights_error``:
  why a replica does not hold the newest version (an SGLang/vLLM server down, or refusing it: serving another
  model, say), shown with the replica's log to read — a generator stuck behind is never read as a slow learner;
- verify: ``isolation``, the sandbox level in force (shown so that a weaker-than-bubblewrap opt-in stays visible), and
  ``verifier_errors.<domain>`` (summed over replicas): answers the domain's verifier could not score — a user's
  function that raised, say. They score 0 and are not trained on; a domain with any shows how many and where the
  verify actor logged why, so a broken verifier is never read as a model that learns nothing.

The baseline a domain's climb is measured from is the learner's ``heldout_acc_start`` (its round right after the
warm start; a resumed learner reads it back from the run's metrics), so ``flywheel status``'s one look and the view
of a resumed run show the climb since the run began; without it (an older learner), the first accuracy seen.

With a production loop (a gateway, a joiner or a gate) a service line follows: the version serving users (the
gate's ``serving_version``, else the version of the generators that answer requests) against the learner's,
requests/s (the gateway replicas' ``served``: completions and chat answered, differenced between two looks), feedback
joined, waiting and, when any, unmatched (the joiner's ``feedback.joined``, ``feedback_waiting`` and
``feedback.unmatched``: feedback whose request never came within the join window), the served answers' accuracy as users
rate them (the joiner's ``feedback_score``: mean score of the last 200 ratings), whether an operator paused the gate
and its ``last_decision``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LearningView"]

# where a verifier's errors are explained: the verify actor logs the first of each domain, then one a minute
_ERRORS_HINT = "verifier errors: answers scored 0 and not trained on; why: 'verify.verifier_error' in logs/verify-*.log"
_PHASES: dict[float, str] = {0: "warmstart", 1: "rl"}  # counters are numbers: the learner reports its phase as one


@dataclass
class LearningView:
    baseline: dict[str, float] = field(default_factory=dict)
    _requests: tuple[float, float] | None = None  # (monotonic time, requests served) at the previous look
    _rate: float | None = None

    def summarize(self, records: Iterable[Any]) -> dict[str, Any] | None:
        learner: dict[str, Any] = {}
        tokens_per_s = 0.0
        gen_versions: list[float] = []
        service: dict[str, Any] = {}
        serving_versions: list[float] = []
        promoted: list[float] = []  # versions of the generators kept on the promoted one (follow: serving)
        isolation: set[str] = set()
        verifier_errors: dict[str, float] = {}
        weights_errors: dict[str, str] = {}  # generator replica (as its log is named) → why it is behind
        for record in records:
            counters = dict(getattr(record, "counters", {}) or {})
            kind = getattr(record, "kind", "") or ""
            if isinstance(counters.get("isolation"), str) and counters["isolation"]:
                isolation.add(counters["isolation"])
            for key, value in counters.items():
                if key.startswith("verifier_errors.") and isinstance(value, int | float):
                    domain = key.split(".", 1)[1]
                    verifier_errors[domain] = verifier_errors.get(domain, 0.0) + float(value)
            if kind == "learner" or "samples_applied" in counters:
                learner = counters
            elif kind == "generator" or "tokens_per_s" in counters:
                tokens_per_s += float(counters.get("tokens_per_s", 0.0))
                if isinstance(counters.get("weights_error"), str) and counters["weights_error"]:
                    who = f"{getattr(record, 'actor', 'generator')}-{getattr(record, 'replica', 0)}"
                    weights_errors[who] = counters["weights_error"]
                if "version" in counters:
                    follows_serving = counters.get("follow") == "serving"  # kept on the promoted version, by design
                    if follows_serving:
                        promoted.append(float(counters["version"]))
                    if not follows_serving:
                        gen_versions.append(float(counters["version"]))
                    if follows_serving or "serve_requests" in counters:
                        serving_versions.append(float(counters["version"]))
            elif kind == "gateway":
                served = counters["served"] if "served" in counters else counters.get("requests", 0.0)  # older run
                service["requests"] = service.get("requests", 0.0) + float(served)
                service["feedback_accepted"] = service.get("feedback_accepted", 0.0) + float(
                    counters.get("feedback", 0.0)
                )
            elif kind == "joiner":
                service["joined"] = service.get("joined", 0.0) + float(counters.get("feedback.joined", 0.0))
                service["waiting"] = service.get("waiting", 0.0) + float(counters.get("feedback_waiting", 0.0))
                service["unmatched"] = service.get("unmatched", 0.0) + float(counters.get("feedback.unmatched", 0.0))
                if "feedback_score" in counters:
                    service["users_score"] = float(counters["feedback_score"])
            elif kind == "gate":
                if "serving_version" in counters:
                    service["serving"] = float(counters["serving_version"])
                if counters.get("last_decision"):
                    service["last_decision"] = str(counters["last_decision"])
                if counters.get("paused"):
                    service["paused"] = 1.0
        if service:
            if "serving" not in service and promoted and max(promoted) == 0:  # v0 is no promotion: the API
                service["unpromoted"] = 1.0  # answers 503 until the gate promotes a version; say what users get
            elif "serving" not in service and serving_versions:
                service["serving"] = min(serving_versions)
            service["requests_per_s"] = self._requests_per_s(service.get("requests"))
        if not learner and not gen_versions and not service:
            return None
        domains = sorted(
            {key.split(".", 1)[1] for key in learner if key.startswith(("reward.", "heldout_acc.", "dropped_stale."))}
            | {domain for domain, count in verifier_errors.items() if count}
        )
        rows = []
        for domain in domains:
            acc = learner.get(f"heldout_acc.{domain}")
            start = learner.get(f"heldout_acc_start.{domain}")
            if start is not None:
                self.baseline[domain] = float(start)
            elif acc is not None and domain not in self.baseline:
                self.baseline[domain] = float(acc)
            rows.append(
                {
                    "domain": domain,
                    "reward": learner.get(f"reward.{domain}"),
                    "heldout_acc": acc,
                    "baseline": self.baseline.get(domain),
                    "dropped": learner.get(f"dropped_stale.{domain}", 0),
                    "verifier_errors": verifier_errors.get(domain, 0.0),
                }
            )
        phase = learner.get("phase")
        return {
            "phase": _PHASES.get(phase, phase) if isinstance(phase, int | float) else phase,
            "version": learner.get("version"),
            "step": learner.get("step"),
            "warmstart": {key: learner.get(f"warmstart_{key}") for key in ("step", "steps", "loss")},
            "eval_out": learner.get("eval_out"),
            "samples": learner.get("samples_applied"),
            "staleness": learner.get("staleness_mean"),
            "tokens_per_s": tokens_per_s,
            "generator_versions": (min(gen_versions), max(gen_versions)) if gen_versions else None,
            "sandbox": "/".join(sorted(isolation)) or None,
            "domains": rows,
            "service": service or None,
            "weights_errors": weights_errors,
        }

    def _requests_per_s(self, total: float | None) -> float | None:
        if total is None:
            return None
        now = time.monotonic()
        if self._requests is not None and now - self._requests[0] >= 0.5:
            then, before = self._requests
            self._rate = max(0.0, total - before) / (now - then)  # a gateway restart resets its count: not < 0
        if self._requests is None or now - self._requests[0] >= 0.5:
            self._requests = (now, total)
        return self._rate

    @staticmethod
    def service_line(summary: dict[str, Any]) -> str | None:
        service = summary.get("service")
        if not service:
            return None
        bits = []
        if service.get("serving") is not None:
            bits.append(f"serving v{int(service['serving'])}")
        elif service.get("unpromoted"):
            bits.append("nothing promoted yet (the API answers 503 until the gate promotes a version)")
        if summary.get("version") is not None:
            bits.append(f"training v{int(summary['version'])}")
        rate = service.get("requests_per_s")
        if rate is not None:
            bits.append(f"{rate:,.1f} req/s")
        elif service.get("requests") is not None:  # one look (`flywheel status`): the gateways' own count, which
            #   starts over with each gateway process, where the joiner's feedback counts are the run's
            bits.append(f"{int(service['requests']):,} requests since the gateway started")
        if "joined" in service:
            feedback = f"feedback {int(service['joined']):,} joined, {int(service.get('waiting', 0)):,} waiting"
            if service.get("unmatched"):  # waited the whole join window for a request that never came
                feedback += f", {int(service['unmatched']):,} unmatched"
            bits.append(feedback)
        if service.get("users_score") is not None:
            bits.append(f"users' score {service['users_score']:.2f}")
        if service.get("paused"):
            bits.append("gate paused (flywheel gate resume)")
        if service.get("last_decision"):
            bits.append(f"gate: {service['last_decision']}")
        return "service: " + " · ".join(bits)

    def renderable(self, records: Iterable[Any]) -> Any:
        summary = self.summarize(records)
        if summary is None:
            return None
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        # the headline above the table, not its title: a title wraps at the table's width (about 64 columns)
        table = Table(show_edge=False, pad_edge=False)
        for column in ("domain", "reward", "held-out acc", "Δ since start", "dropped (stale)"):
            table.add_column(column, justify="left" if column == "domain" else "right")
        errors = any(row["verifier_errors"] for row in summary["domains"])
        if errors:
            table.add_column("verifier errors", justify="right")
        for row in summary["domains"]:
            table.add_row(
                row["domain"],
                _pct(row["reward"], raw=True),
                _pct(row["heldout_acc"]),
                _delta(row["heldout_acc"], row["baseline"]),
                str(int(row["dropped"] or 0)),
                *([f"{int(row['verifier_errors']):,}"] if errors else []),
            )
        parts: list[Any] = [Text(service)] if (service := self.service_line(summary)) is not None else []
        if errors:
            parts.append(Text(_ERRORS_HINT, style="bold red"))
        parts += [Text(hint, style="bold red") for hint in _weights_hints(summary)]
        return Group(*parts, Text(self.headline(summary), style="italic"), table)

    def line(self, records: Iterable[Any]) -> str | None:
        summary = self.summarize(records)
        if summary is None:
            return None
        parts = [self.headline(summary)]
        service = self.service_line(summary)
        if service is not None:
            parts.append(service)
        for row in summary["domains"]:
            errors = int(row["verifier_errors"] or 0)
            parts.append(
                f"{row['domain']}: acc {_pct(row['heldout_acc'])} ({_delta(row['heldout_acc'], row['baseline'])})"
                f" reward {_pct(row['reward'], raw=True)}" + (f" verifier errors {errors:,}" if errors else "")
            )
        if any(row["verifier_errors"] for row in summary["domains"]):
            parts.append(_ERRORS_HINT)
        parts += _weights_hints(summary)
        return " | ".join(parts)

    @staticmethod
    def headline(summary: dict[str, Any]) -> str:
        bits = []
        if summary["phase"] is not None:
            bits.append(str(summary["phase"]))
        if summary["version"] is not None:
            bits.append(f"v{int(summary['version'])}")
        warm = summary.get("warmstart") or {}
        if summary["phase"] == "warmstart" and warm.get("steps"):  # RL's step is 0 all along: show the warm start's
            bits.append(f"step {int(warm.get('step') or 0)}/{int(warm['steps'])}")
            if warm.get("loss") is not None:
                bits.append(f"loss {float(warm['loss']):.3f}")
        elif summary["step"] is not None:
            bits.append(f"step {int(summary['step'])}")
            if summary["phase"] == "rl" and not summary["step"] and summary.get("eval_out"):  # RL waits for it
                bits.append(f"held-out baseline round: {int(summary['eval_out']):,} prompts to score")
        if summary["samples"] is not None:
            bits.append(f"{int(summary['samples']):,} samples")
        bits.append(f"{summary['tokens_per_s']:,.0f} tok/s")
        if summary["generator_versions"] is not None:
            low, high = summary["generator_versions"]
            bits.append(f"generators v{int(low)}" + (f"–v{int(high)}" if high != low else ""))
        if summary["staleness"] is not None:
            bits.append(f"staleness {float(summary['staleness']):.1f}")
        if summary.get("sandbox"):
            bits.append(f"sandbox {summary['sandbox']}")
        return "learning: " + " · ".join(bits)


def _weights_hints(summary: dict[str, Any]) -> list[str]:
    return [
        f"{who} cannot load {error} (more: 'weights.rejected' in logs/{who}.log)"
        for who, error in sorted((summary.get("weights_errors") or {}).items())
    ]


def _pct(value: Any, *, raw: bool = False) -> str:
    if value is None:
        return "—"
    return f"{float(value):.2f}" if raw else f"{100 * float(value):.0f}%"


def _delta(value: Any, baseline: Any) -> str:
    if value is None or baseline is None:
        return "—"
    return f"{100 * (float(value) - float(baseline)):+.0f} pts"
