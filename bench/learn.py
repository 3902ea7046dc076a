"""Does the loop learn, and what does async buy? Runs a topology (default specs/embedded.yaml) per variant.

Variants (each a fresh run for ``--duration`` seconds of the topology, warm start included):

* ``async``  — the spec as it is;
* ``sync``   — ``learner.mode: sync`` (one batch per weights version: the baseline async is measured against);
* ``nonorm`` — async without per-domain normalization: ``learner.normalize: none`` (raw centred rewards;
  ``--nonorm group`` for GRPO's per-group std instead);
* ``guided`` — async with ``learner.failed_groups: reference``: a group whose completions all scored 0 gets the
  task's reference answer as one more completion (off-policy guidance);

Each variant is a temporary spec that ``include:``s the original and overrides the learner (deep merge), run with
``topology.runtime.LocalRuntime`` (``--runtime ray``: each variant runs locally, then with ``RayRuntime``
(``ray_init={"num_cpus": 2}``), and the Ray runtime's overhead on the same work is printed). From each
run's ``metrics/*.parquet``: held-out accuracy per domain (decoded as the spec's learner says: greedy, or sampled
with ``eval_temperature``/``eval_samples``) over wall-clock (eval rows), samples/s trained
(step rows), the training rollouts' accuracy per domain when RL starts and when it ends (see
``rollout_accuracy``) and, from the sync run, the pipelining ceiling: in sync mode one cycle generates and
verifies a batch (``T_gen``: per step the slowest group's ``generate_s + verify_s``, median over steps) then trains on
it (``T_train``: ``step_s``), so ``ceiling = (T_gen + T_train) / max(T_gen, T_train)``; async/sync throughput is
reported beside it, and the sync cycle's remaining time (waiting for weights to reach the generators) as overhead.
The "learner drift" table gives, per ``DRIFT_WINDOW_S`` of a run's steps, the gradient's norm before clipping
(median, 95th percentile, largest) and the mean behavior KL per token (how far the policy moved from the one that
sampled the batch): a run whose gradients and moves grow while its held-out rounds start to swing shows it there.
The "no signal" column is the share of a domain's groups the learner consumed without a step because all their
rewards were equal (generated, verified and thrown away), and in brackets the shares that were all full marks
(solved) and all zero (failed). "cores used" gives, per run, the CPU time of each actor's processes (and
nats-server's, and the supervising runtime's) over the run, in cores (``bench/_cpu.py``): on a machine the loop
fills, the learner's share is what its steps get.

Held-out rounds are decoded greedy (what a served model answers) and sampled at T=1 (the policy RL trains) side by
side (``--decodings both``, the default: the learner's ``eval_temperature`` becomes the spec's decoding plus the
other; ``--decodings spec`` keeps the spec's alone). Per variant and domain the bench prints both curves round by
round and, per decoding, the spread of consecutive rounds once past the first minute (the largest and the mean
change between neighbours): a served model's quality should not swing from one version to the next. For sampled
rounds it also prints what sampling alone moves two rounds by (two standard deviations of the difference, from each
round's completions) and how many pairs moved by more: the part of a swing that is the policy's. Beside it, the
largest fall of the training rollouts' accuracy after the first minute (``rollout_fall``: the learner's running
accuracy averaged over ``FALL_WINDOW_STEPS`` steps, from its peak since the minute to its trough, and when): rounds
come every ``eval_every_steps`` and may measure the weights' average, the rollouts follow the policy that trains
step by step, so a regression of that policy shows in both (chance moves the running accuracy too, by 10-20 points
where a domain has few groups a step, as on the embedded default's three domains). ``--learner
KEY=VALUE`` overrides a learner setting in every variant (e.g. ``--learner lr=5e-5``), so a setting can be measured
without editing the spec.

    .venv/bin/python bench/learn.py --quick                 # ≤ 60 s: async only, a tiny warm start
    .venv/bin/python bench/learn.py --duration 420          # three variants, ~21 min
    .venv/bin/python bench/learn.py --spec my.yaml --variants async,sync
    .venv/bin/python bench/learn.py --runtime ray --quick   # the same run locally and on Ray: the Ray overhead
    .venv/bin/python bench/learn.py --spec /tmp/hf-task/spec.yaml --variants async --learner lr=5e-5

Writes bench/results/learn.json (per variant: ``decodings`` with each decoding's curves, post-warm-start, last-3 and
best accuracy and ``spread``; ``curves``/``baseline``/``final``/``best`` repeat the spec's own decoding;
``rollout_fall`` per domain; ``source``: the source's counters at its stop, e.g. tasks published and passed over)
and bench/results/learn.png (accuracy per domain vs wall-clock, one line style per
variant) and prints markdown tables. Runs go to runs/ (``runs/latest`` is the last one).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from actors.learner import LearnerConfig  # noqa: E402
from actors.learner._samples import REWARD_WINDOW as ROLLOUT_WINDOW  # noqa: E402  # the learner's accuracy window
from actors.protocol import policy_of  # noqa: E402
from bench._common import RESULTS_DIR, percentile, write_results  # noqa: E402
from bench._cpu import CpuSampler  # noqa: E402
from bench._learn_report import (  # noqa: E402
    print_accuracy,
    print_cpu,
    print_decodings,
    print_drift,
    print_ray_overhead,
    print_rollout_fall,
    print_source,
)

_STYLES: dict[str, Any] = {"async": "-", "sync": ":", "nonorm": "--", "guided": (0, (5, 1, 1, 1))}
_QUICK = {"actors": {"learner": {"eval_every_steps": 10, "eval_size": 32, "checkpoint_every_steps": 10}}}


VARIANTS = ("async", "sync", "nonorm", "guided")


def variant_overrides(name: str, nonorm: str) -> dict[str, Any]:
    if name not in VARIANTS:
        raise SystemExit(f"unknown variant {name!r}; expected some of: {', '.join(VARIANTS)}")
    learner: dict[str, Any] = {
        "async": {},
        "sync": {"mode": "sync"},
        "nonorm": {"normalize": nonorm},
        "guided": {"failed_groups": "reference"},
    }[name]
    return {"actors": {"learner": learner}} if learner else {}


def learner_overrides(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs (VALUE parsed as YAML, a number in any notation) as a learner override mapping."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--learner: expected KEY=VALUE, got {pair!r}")
        parsed = yaml.safe_load(value)
        if isinstance(parsed, str):  # YAML 1.1 reads 5e-5 (no dot) as a string
            try:
                parsed = float(parsed)
            except ValueError:
                pass
        out[key.strip()] = parsed
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def write_variant_spec(spec_path: Path, overrides: dict[str, Any], folder: Path, name: str) -> Path:
    """A spec that includes the original and deep-merges ``overrides``. Written by a YAML dumper, not as JSON: the
    spec loader reads YAML 1.1, where JSON's ``5e-05`` is a string (``5.0e-05`` is the number)."""
    import yaml

    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"include": str(spec_path.resolve()), **overrides}, sort_keys=False))
    return path


def run_topology(spec_file: Path, duration_s: float, runtime_kind: str) -> tuple[Path, float, float]:
    """Run the spec for ``duration_s``; its run dir, the wall-clock start (epoch s) and the seconds it took."""
    from topology import load_spec

    spec = load_spec(spec_file)
    run_root = ROOT / "runs"
    runtime: Any
    if runtime_kind == "ray":
        from topology.runtime import RayRuntime

        runtime = RayRuntime(spec, run_root=run_root, handle_signals=False, ray_init={"num_cpus": 2})
    else:
        from topology.runtime import LocalRuntime

        runtime = LocalRuntime(spec, run_root=run_root, handle_signals=False)
    started, clock = time.time(), time.monotonic()
    result = anyio.run(lambda: runtime.run(duration_s=duration_s), backend="asyncio")
    if not result.ok:
        raise SystemExit(f"{spec_file.name}: {result.message}")
    return Path(result.run_dir), started, time.monotonic() - clock


def runtime_overhead(results: dict[str, dict[str, Any]], variant: str) -> dict[str, float] | None:
    """Ray against local on the same variant: wall time, time to the first RL step, trained samples/s."""
    ray, local = results.get(variant), results.get(f"{variant} (local)")
    if ray is None or local is None or not local.get("samples_per_s"):
        return None
    return {
        "wall_ratio": ray["wall_s"] / local["wall_s"],
        "first_step_delay_s": ray.get("first_step_s", 0.0) - local.get("first_step_s", 0.0),
        "samples_per_s_ratio": ray.get("samples_per_s", 0.0) / local["samples_per_s"],
    }


DRIFT_WINDOW_S = 100.0  # the learner-drift table's windows of step time
SETTLED_S = 60.0  # changes into rounds before this (seconds since the post-warm-start round) do not count in the spread
FALL_WINDOW_STEPS = 50  # step rows averaged before `rollout_fall` looks for the rollouts' largest fall


def spread(
    curve: list[dict[str, Any]], settled_s: float = SETTLED_S, *, sampled: bool = False
) -> dict[str, float] | None:
    """How much consecutive held-out rounds of one curve differ once past ``settled_s``: the largest and the mean
    absolute change between neighbours (accuracy in [0, 1]), over how many pairs, and the largest fall (a rise is
    learning; a swing is a fall and the rise back); None with no round past ``settled_s``. A pair counts when its
    later round is past ``settled_s``: a fall into the first round after the minute is a fall after the minute.

    ``sampled`` (rounds of fresh samples, each point with its completion count ``n``): also what sampling alone
    moves a pair by — ``noise``, the median over pairs of two standard deviations of the difference of two binomial
    proportions, sqrt(p1(1-p1)/n1 + p2(1-p2)/n2) — and ``beyond``, how many pairs changed by more than their own two
    standard deviations (a policy that did not move gives about one pair in twenty). Greedy rounds decode the same
    prompts the same way, so their changes are all the policy's: no noise figure."""
    first = next((i for i, p in enumerate(curve) if p["t_s"] >= settled_s), len(curve))
    points = curve[max(0, first - 1) :]
    changes = [b["accuracy"] - a["accuracy"] for a, b in itertools.pairwise(points)]
    if not changes:
        return None
    steps = [abs(c) for c in changes]
    out = {
        "max": max(steps),
        "mean": sum(steps) / len(steps),
        "pairs": float(len(steps)),
        "fall": max(0.0, -min(changes)),
    }
    if sampled and all(p.get("n") for p in points):
        from actors.learner import sampling_sd

        two_sd = [
            2 * math.hypot(*(sampling_sd(p["accuracy"], p["n"]) for p in pair)) for pair in itertools.pairwise(points)
        ]
        out["noise"] = statistics.median(two_sd)
        out["beyond"] = float(sum(step > bound for step, bound in zip(steps, two_sd, strict=True)))
    return out


def decoding_name(temperature: float) -> str:
    return "greedy" if temperature <= 0 else "sampled" if temperature == 1.0 else f"sampled at T={temperature:g}"


def analyse(run_dir: Path, run_started: float | None = None, headline: float | None = None) -> dict[str, Any]:
    """One run's figures. Held-out curves per decoding (``decodings``: greedy / sampled, each with its curves,
    post-warm-start accuracy, last-3 mean, best and the spread of consecutive rounds); ``curves`` / ``baseline`` /
    ``final`` / ``best`` repeat the ``headline`` decoding's (the spec's first; default the first found)."""
    from actors.learner import read_metrics

    evals = read_metrics(run_dir, "eval")
    steps = read_metrics(run_dir, "step")
    applied = read_metrics(run_dir, "applied")
    out: dict[str, Any] = {"run_dir": str(run_dir), "curves": {}, "baseline": {}, "final": {}, "decodings": {}}
    t0: float | None = None  # seconds of RL count from the post-warm-start round (without rounds: the first step)
    if len(evals):
        from actors.learner._metrics import eval_mode

        out["eval_mode"] = eval_mode(evals)
        # the post-warm-start baseline round: RL time starts here
        t0 = float(evals["ts"].cast(float).min())  # type: ignore[arg-type]
        temperature_of = "temperature" in evals.columns
        for row in evals.sort("ts").iter_rows(named=True):
            temperature = float(row["temperature"] or 0.0) if temperature_of else 0.0
            decoding = out["decodings"].setdefault(decoding_name(temperature), {"temperature": temperature})
            decoding.setdefault("curves", {}).setdefault(row["domain"], []).append(
                {
                    "t_s": round(float(row["ts"]) - t0, 2),
                    "version": int(row["version"]),
                    "accuracy": row["accuracy"],
                    "n": int(row["n"]) if row.get("n") is not None else None,
                }
            )
        for decoding in out["decodings"].values():
            for domain, curve in decoding["curves"].items():
                decoding.setdefault("baseline", {})[domain] = curve[0]["accuracy"]
                tail = [p["accuracy"] for p in curve[-3:]]  # mean of the last three rounds: less eval noise
                decoding.setdefault("final", {})[domain] = sum(tail) / len(tail)
                decoding.setdefault("best", {})[domain] = max(p["accuracy"] for p in curve)
                decoding.setdefault("spread", {})[domain] = spread(curve, sampled=decoding["temperature"] > 0)
        first = next(iter(out["decodings"]))
        key = first if headline is None else decoding_name(headline)
        main = out["decodings"].get(key, out["decodings"][first])
        out.update(
            headline=key,
            curves=main["curves"],
            baseline=main["baseline"],
            final=main["final"],
            best=main["best"],
        )
    lifecycle = read_metrics(run_dir, "lifecycle")
    if "lr" in lifecycle.columns:  # what the learner resolved (lr: auto) at its first start
        started = lifecycle.filter(event="start").drop_nulls("lr")
        if started.height:
            out["lr"] = float(started["lr"][0])
            out["params"] = int(started["params"][0])
            if "ema_decay" in started.columns:  # rounds measure the weights' average (from 2026-12-06), or null
                decay = started["ema_decay"][0]
                out["ema_decay"] = None if decay is None else float(decay)
    if len(steps) >= 2:
        steps = steps.sort("ts")
        ts = [float(t) for t in steps["ts"]]
        samples = [int(s) for s in steps["samples"]]
        span = ts[-1] - ts[0]
        out["steps"] = len(ts)
        out["samples_trained"] = sum(samples)
        out["batch_samples"] = statistics.median(samples)
        if run_started is not None:
            out["first_step_s"] = ts[0] - run_started  # start-up + warm start + the first batch
        out["samples_per_s"] = sum(samples[1:]) / span if span > 0 else 0.0
        cycles = [b - a for a, b in itertools.pairwise(ts)]
        out["cycle_s"] = statistics.median(cycles)
        if "step_s" in steps.columns:
            out["t_train_s"] = statistics.median(float(s) for s in steps["step_s"] if s is not None)
        if "generate_s_max" in steps.columns:
            out["t_gen_s"] = statistics.median(
                float(g or 0.0) + float(v or 0.0)
                for g, v in zip(steps["generate_s_max"], steps["verify_s_max"], strict=True)
            )
        if "iw_mean" in steps.columns:
            out["iw_mean"] = statistics.fmean(float(v) for v in steps["iw_mean"])
        if "staleness_mean" in steps.columns:
            out["staleness_mean"] = statistics.fmean(float(v) for v in steps["staleness_mean"])
        out["rollout"] = rollout_accuracy(steps, applied)
        out["drift"] = drift(steps)
        out["rollout_fall"] = rollout_fall(steps, t0)
    if len(applied) and "how" in applied.columns:
        # shares of a domain's groups: [trained, no signal, no signal with full marks, no signal with all zero]
        groups: dict[str, list[int]] = {}
        rewards = applied["reward"] if "reward" in applied.columns else [None] * len(applied)
        for domain, how, reward in zip(applied["domain"], applied["how"], rewards, strict=True):
            counts = groups.setdefault(domain, [0, 0, 0, 0])
            counts[how == "consumed"] += 1
            if how == "consumed" and reward is not None and reward >= 1.0:
                counts[2] += 1
            elif how == "consumed" and reward is not None and reward <= 0.0:
                counts[3] += 1
        out["no_signal"] = {d: c[1] / (c[0] + c[1]) for d, c in groups.items() if c[0] + c[1]}
        if "reward" in applied.columns:
            out["no_signal_solved"] = {d: c[2] / (c[0] + c[1]) for d, c in groups.items() if c[0] + c[1]}
            out["no_signal_failed"] = {d: c[3] / (c[0] + c[1]) for d, c in groups.items() if c[0] + c[1]}
    out["source"] = source_counters(run_dir)
    return out


def source_counters(run_dir: Path) -> dict[str, int]:
    """The source actors' counters at their last stop, summed over replicas (``published.<domain>``, and
    ``passed_over.<domain>`` with ``skip_no_signal``), read from each source replica's ``stopped`` log line; the
    gauges (``backlog``, ``in_flight``) and the runtime's ``gc_*`` are left out. Empty when no source logged a stop."""
    import ast

    try:
        kinds = json.loads((run_dir / "run.json").read_text())["kinds"]
    except (OSError, ValueError, KeyError):
        return {}
    totals: dict[str, int] = {}
    for actor in (name for name, kind in kinds.items() if kind == "source"):
        for log in sorted((run_dir / "logs").glob(f"{actor}-*.log")):
            stops = [line for line in log.read_text().splitlines() if " stopped " in line and "counters={" in line]
            if not stops:
                continue
            text = stops[-1].split("counters=", 1)[1]
            try:
                counters = ast.literal_eval(text[: text.index("}") + 1])
            except (ValueError, SyntaxError):
                continue
            for key, value in counters.items():
                if isinstance(value, int) and key not in ("backlog", "in_flight") and not key.startswith("gc_"):
                    totals[key] = totals.get(key, 0) + value
    return totals


def drift(steps: Any, window_s: float = DRIFT_WINDOW_S) -> list[dict[str, float | None]]:
    """Per ``window_s`` of step rows (from the first step): steps, the gradient norm before clipping (median, 95th
    percentile, largest) and the mean behavior KL per token (None without the column); windows without a step are
    left out."""
    if not len(steps) or "grad_norm" not in steps.columns:
        return []
    t0 = float(steps["ts"].min())
    kl_of = "behavior_kl" in steps.columns
    windows: dict[int, list[tuple[float, float | None]]] = {}
    for row in steps.iter_rows(named=True):
        if row["grad_norm"] is None:
            continue
        kl = row["behavior_kl"] if kl_of else None
        windows.setdefault(int((float(row["ts"]) - t0) // window_s), []).append((float(row["grad_norm"]), kl))
    out = []
    for index, rows in sorted(windows.items()):
        norms = sorted(n for n, _ in rows)
        kls = [float(k) for _, k in rows if k is not None]
        out.append(
            {
                "t_s": index * window_s,
                "steps": len(rows),
                "grad_norm_median": statistics.median(norms),
                "grad_norm_p95": percentile(norms, 95),
                "grad_norm_max": norms[-1],
                "behavior_kl": statistics.fmean(kls) if kls else None,  # (NaN is not JSON)
            }
        )
    return out


def rollout_accuracy(steps: Any, applied: Any) -> dict[str, dict[str, float]]:
    """Accuracy of the training rollouts per domain, at the start and at the end of RL: the learner's running
    accuracy over the domain's last ``ROLLOUT_WINDOW`` groups (every group counts, zero-signal ones too), read at
    the first step whose window is full and at the last step. Training and held-out tasks come from one
    distribution, so this estimates the same quantity as a sampled held-out round from 4x its completions (800 at
    group size 8; a group's completions share a prompt, so the noise falls by less than 2x); it lags the policy by
    the window (~15-40 s of RL)."""
    if not len(applied) or "step" not in applied.columns:
        return {}
    groups: dict[str, dict[int, int]] = {}
    for row in applied.iter_rows(named=True):
        per_step = groups.setdefault(row["domain"], {})
        per_step[int(row["step"])] = per_step.get(int(row["step"]), 0) + 1
    out: dict[str, dict[str, float]] = {}
    for domain, per_step in groups.items():
        column = f"accuracy.{domain}"
        if column not in steps.columns:
            continue
        seen, start, end = 0, None, None
        for step, value in zip(steps["step"], steps[column], strict=True):
            seen += per_step.get(int(step), 0)
            if value is None:
                continue
            if start is None and seen >= ROLLOUT_WINDOW:
                start = float(value)
            end = float(value)
        if start is not None and end is not None:
            out[domain] = {"start": start, "end": end}
    return out


def rollout_fall(
    steps: Any, t0: float | None = None, settled_s: float = SETTLED_S, window: int = FALL_WINDOW_STEPS
) -> dict[str, dict[str, float]]:
    """Per domain, the largest fall of the training rollouts' accuracy once past ``settled_s`` (seconds since ``t0``,
    the post-warm-start round; default the first step row): the learner's running accuracy (each step row's
    ``accuracy.<domain>``) averaged over the domain's last ``window`` rows, and the largest drop of that mean below
    the highest one before it (peak to trough, accuracy in [0, 1]), with the peak, the trough and their times
    (``peak_t_s``, ``trough_t_s``; s since ``t0``) and ``window_steps``. A series that never falls gives 0 at its
    first mean.

    Only rows from ``settled_s`` on count, and only full windows: the first mean is of the first ``window`` rows past
    the mark, so the first minute's peak (the policy just out of its warm start) is not one to fall from, as in the
    held-out rounds' ``spread``. A row without the domain's value (before its first group) is skipped; a domain with
    fewer than ``window`` rows past the mark is left out.

    The held-out rounds come every ``eval_every_steps`` and may measure the weights' average; this follows the policy
    that trains, step by step, so a fall the rounds show too is the policy's. Chance moves it too: a group is mostly
    all right or all wrong, and where a domain has few groups a step (the embedded default's three domains) a
    window of them is few groups."""
    if not len(steps):
        return {}
    steps = steps.sort("ts")
    origin = float(steps["ts"].min()) if t0 is None else t0
    times = [float(t) - origin for t in steps["ts"]]
    out: dict[str, dict[str, float]] = {}
    for column in sorted(c for c in steps.columns if c.startswith("accuracy.")):
        rows = [(t, float(v)) for t, v in zip(times, steps[column], strict=True) if v is not None and t >= settled_s]
        if len(rows) < window:
            continue
        values = [v for _, v in rows]
        means = [(rows[i - 1][0], statistics.fmean(values[i - window : i])) for i in range(window, len(rows) + 1)]
        peak = trough = best_peak = means[0]
        for point in means[1:]:
            if point[1] > peak[1]:
                peak = point
            elif peak[1] - point[1] > best_peak[1] - trough[1]:
                best_peak, trough = peak, point
        out[column.removeprefix("accuracy.")] = {
            "fall": best_peak[1] - trough[1],
            "peak": best_peak[1],
            "peak_t_s": round(best_peak[0], 2),
            "trough": trough[1],
            "trough_t_s": round(trough[0], 2),
            "window_steps": window,
        }
    return out


def pipelining(sync: dict[str, Any]) -> dict[str, float] | None:
    """The ceiling of pipelining from the sync run's own timings: ``T_gen`` = generating and verifying one batch
    (the slowest group of each step, whose groups were generated together), ``T_train`` = its optimizer step."""
    if "t_train_s" not in sync or "t_gen_s" not in sync:
        return None
    t_train, t_gen = sync["t_train_s"], max(sync["t_gen_s"], 1e-9)
    out = {"t_gen_s": t_gen, "t_train_s": t_train, "ceiling": (t_gen + t_train) / max(t_gen, t_train)}
    if "cycle_s" in sync:  # what a sync cycle costs beyond generating and training: the coordination
        out["sync_overhead_s"] = max(sync["cycle_s"] - t_gen - t_train, 0.0)
    return out


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    """Held-out accuracy per domain over seconds, one panel per decoding (greedy, sampled), one line style per
    variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({n for r in results.values() for n in r.get("decodings", {})}) or ["greedy"]
    fig, axes = plt.subplots(1, len(names), figsize=(7 * len(names), 4.5), sharey=True, squeeze=False)
    colors: dict[str, str] = {}
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, name in zip(axes[0], names, strict=True):
        for variant, res in results.items():
            curves = res.get("decodings", {}).get(name, {}).get("curves", {})
            for domain, curve in sorted(curves.items()):
                color = colors.setdefault(domain, palette[len(colors) % len(palette)])
                ax.plot(
                    [p["t_s"] for p in curve],
                    [100 * p["accuracy"] for p in curve],
                    linestyle=_STYLES.get(variant, "-."),
                    marker=".",
                    color=color,
                    label=f"{domain} ({variant})",
                )
        ax.set_title(f"{name} held-out accuracy")
        ax.set_xlabel("seconds since the post-warm-start evaluation")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    axes[0][0].set_ylabel("held-out accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "specs" / "embedded.yaml")
    parser.add_argument("--duration", type=float, default=420.0, help="seconds per variant (warm start included)")
    parser.add_argument("--variants", default="async,sync,nonorm")
    parser.add_argument("--nonorm", choices=("none", "group"), default="none", help="normalize of the nonorm run")
    parser.add_argument("--runtime", choices=("local", "ray"), default="local")
    parser.add_argument("--quick", action="store_true", help="≤ 60 s: async only, ≤ 60 warm-start steps, 40 s run")
    parser.add_argument(
        "--decodings",
        choices=("both", "spec"),
        default="both",
        help="both: held-out rounds greedy and sampled at T=1 side by side (the spec's decoding first); spec: only "
        "the spec's",
    )
    parser.add_argument(
        "--learner",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a learner setting in every variant (VALUE is YAML), e.g. --learner lr=5e-5",
    )
    args = parser.parse_args()

    variants = ["async"] if args.quick else [v.strip() for v in args.variants.split(",") if v.strip()]
    duration = 40.0 if args.quick else args.duration
    results: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    from topology import load_spec

    base = load_spec(args.spec)
    # --quick shortens a warm start the spec would run; it never adds one (an hf: model starts as given)
    quick = _merge(_QUICK, {"policy": {"warm_start": {"steps": min(60, policy_of(base).warm_start_steps)}}})
    common = {"actors": {"learner": learner_overrides(args.learner)}} if args.learner else {}
    learner = base.actors.get("learner")
    spec_temperatures = (
        learner.config.eval_temperatures if learner and isinstance(learner.config, LearnerConfig) else (0.0,)
    )
    headline = spec_temperatures[0]
    if args.decodings == "both":
        both = (*spec_temperatures, *(t for t in (0.0, 1.0) if t not in spec_temperatures))
        common = _merge(common, {"actors": {"learner": {"eval_temperature": list(both)}}})
    with tempfile.TemporaryDirectory(prefix="flywheel-learn-") as tmp:
        for variant in variants:
            overrides = _merge(common, variant_overrides(variant, args.nonorm))
            if args.quick:
                overrides = _merge(quick, overrides)
            spec_file = write_variant_spec(args.spec, overrides, Path(tmp), variant)
            # --runtime ray also runs the same work locally first: the Ray runtime's overhead is measured, not guessed
            runs = (
                [("local", f"{variant} (local)"), ("ray", variant)] if args.runtime == "ray" else [("local", variant)]
            )
            for runtime_kind, key in runs:
                print(
                    f"== {key}: {duration:.0f} s of {args.spec} on the {runtime_kind} runtime "
                    f"(overrides {json.dumps(overrides)})",
                    flush=True,
                )
                with CpuSampler() as cpu:
                    run_dir, run_started, wall_s = run_topology(spec_file, duration, runtime_kind)
                results[key] = {
                    "overrides": overrides,
                    "runtime": runtime_kind,
                    "wall_s": wall_s,
                    "cpu_cores": cpu.cores(),
                    **analyse(run_dir, run_started, headline),
                }
                if "lr" in results[key]:
                    res = results[key]
                    rounds = (
                        ""
                        if "ema_decay" not in res
                        else "; rounds measure the current weights"
                        if res["ema_decay"] is None
                        else f"; rounds measure the weights' average (ema_decay {res['ema_decay']:g})"
                    )
                    print(
                        f"   learner: lr {res['lr']:.3g} for {res['params'] / 1e6:.2f}M parameters{rounds}", flush=True
                    )

    print_accuracy(results)
    print_cpu(results)
    print_source(results)
    print_decodings(results, settled_s=SETTLED_S)
    print_rollout_fall(results, settled_s=SETTLED_S, window_steps=FALL_WINDOW_STEPS)
    print_drift(results, window_s=DRIFT_WINDOW_S)
    summary: dict[str, Any] = {}
    if "sync" in results and "async" in results:
        pipe = pipelining(results["sync"])
        sync_rate, async_rate = results["sync"].get("samples_per_s", 0.0), results["async"].get("samples_per_s", 0.0)
        if pipe is not None and sync_rate > 0:
            ratio = async_rate / sync_rate
            # the ideal pipeline trains one batch per max(T_gen, T_train): async's rate against that rate is the
            # fraction of the ceiling that does not depend on how much time sync mode loses to coordination
            ideal = results["sync"].get("batch_samples", 0.0) / max(pipe["t_gen_s"], pipe["t_train_s"])
            summary = {
                **pipe,
                "async_over_sync": ratio,
                "fraction_of_ceiling": ratio / pipe["ceiling"],
                "async_over_ideal_pipeline": async_rate / ideal if ideal > 0 else 0.0,
            }
            print(
                f"\nT_gen {pipe['t_gen_s']:.2f} s, T_train {pipe['t_train_s']:.2f} s per batch (sync run; the cycle "
                f"also spends {pipe.get('sync_overhead_s', 0.0):.2f} s on coordination) → ceiling "
                f"{pipe['ceiling']:.2f}x; async/sync {ratio:.2f}x = {100 * ratio / pipe['ceiling']:.0f} % of the "
                f"ceiling; async trains {async_rate:.1f} samples/s = {100 * async_rate / ideal:.0f} % of an ideal "
                f"pipeline's {ideal:.1f} (one batch per max(T_gen, T_train))"
            )
    for variant in variants:
        overhead = runtime_overhead(results, variant)
        if overhead is None:
            continue
        summary.setdefault("ray_overhead", {})[variant] = overhead
        print_ray_overhead(results, variant, overhead)
    if "nonorm" in results and "async" in results and results["async"]["baseline"]:
        # the hardest domain: lowest accuracy when RL starts, from the rollouts when they are there (less noise)
        start = {d: r["start"] for d, r in results["async"].get("rollout", {}).items()} or results["async"]["baseline"]
        hardest = min(start, key=lambda d: start[d])
        gains = {
            v: results[v]["final"].get(hardest, 0.0) - results[v]["baseline"].get(hardest, 0.0)
            for v in ("async", "nonorm")
        }
        rollout = {v: results[v].get("rollout", {}).get(hardest) for v in ("async", "nonorm")}
        rollout_gains = {v: r["end"] - r["start"] for v, r in rollout.items() if r}
        summary["hardest_domain"] = {
            "domain": hardest,
            "gain_domain_norm": gains["async"],
            "gain_without": gains["nonorm"],
            "rollout_gain_domain_norm": rollout_gains.get("async"),
            "rollout_gain_without": rollout_gains.get("nonorm"),
        }
        print(
            f"hardest domain {hardest}: held-out {100 * gains['async']:+.1f} pts with per-domain normalization, "
            f"{100 * gains['nonorm']:+.1f} pts with normalize={args.nonorm}"
            + (
                f"; rollouts {100 * rollout_gains['async']:+.1f} vs {100 * rollout_gains['nonorm']:+.1f} pts"
                if len(rollout_gains) == 2
                else ""
            )
        )
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    png = RESULTS_DIR / "learn.png"
    plot(results, png)
    path = write_results(
        "learn",
        {
            "spec": str(args.spec),
            "duration_s": duration,
            "quick": args.quick,
            "runtime": args.runtime,
            "variants": results,
            "summary": summary,
            "wall_s": round(time.monotonic() - started, 1),
        },
    )
    print(f"\nwrote {path} and {png} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
