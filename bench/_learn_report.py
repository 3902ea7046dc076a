"""The markdown tables bench/learn.py prints from its results: held-out accuracy per variant and domain, the cores
each actor used, the held-out rounds per decoding and their spread, the training rollouts' largest fall, the
learner's drift, the Ray runtime's overhead.

Non-goal: reading or analysing a run. The figures come in ``results`` (``bench.learn.analyse``) and the windows they
were computed over come in as arguments, so a caption names the ones bench/learn.py used.
"""

from __future__ import annotations

import os
from typing import Any

from actors.learner._samples import REWARD_WINDOW as ROLLOUT_WINDOW  # the learner's accuracy window
from bench._common import markdown_table

__all__ = ["print_accuracy", "print_cpu", "print_decodings", "print_drift", "print_ray_overhead", "print_rollout_fall"]


def print_accuracy(results: dict[str, dict[str, Any]]) -> None:
    """Per variant and domain: held-out accuracy when RL starts and at the end, the training rollouts', samples/s,
    staleness and the groups without signal; exits when no run returned a held-out round."""
    domains = sorted({d for r in results.values() for d in r["curves"]})
    rows = []
    for variant, res in results.items():
        for domain in domains:
            base, final = res["baseline"].get(domain), res["final"].get(domain)
            roll = res.get("rollout", {}).get(domain, {})
            rows.append(
                [
                    variant,
                    domain,
                    _pct(base),
                    _pct(final),
                    _pct(None if base is None or final is None else final - base),
                    _pct(res.get("best", {}).get(domain)),
                    f"{_pct(roll.get('start'))} → {_pct(roll.get('end'))}" if roll else "-",
                    _pct(roll["end"] - roll["start"]) if roll else "-",
                    round(res.get("samples_per_s", 0.0), 1),
                    round(res.get("staleness_mean", 0.0), 2),
                    _no_signal(res, domain),
                ]
            )
    if not rows:
        logs = ", ".join(f"{v}: {r['run_dir']}/logs" for v, r in results.items())
        raise SystemExit(f"no held-out evaluation came back from any run; see the logs ({logs})")
    modes = sorted({r.get("eval_mode", "greedy") for r in results.values()})
    print(f"held-out accuracy: {' / '.join(modes)}")
    print(
        markdown_table(
            [
                "variant",
                "domain",
                "post-warm-start %",
                "final % (last 3 evals)",
                "Δ pts",
                "best %",
                "rollouts %",
                "rollouts Δ",
                "samples/s",
                "staleness",
                "no signal % (solved/failed)",
            ],
            rows,
        )
    )
    print(
        f"rollouts: the training rollouts' running accuracy over a domain's last {ROLLOUT_WINDOW} groups, when the "
        "window first fills and at the end (same task distribution, ~4x the completions of a held-out round)"
    )


def print_cpu(results: dict[str, dict[str, Any]]) -> None:
    """Where each run's cores went, by actor (``bench/_cpu.py``): what a machine-bound loop spends on what."""
    lines = []
    for variant, res in results.items():
        cores = res.get("cpu_cores") or {}
        if cores:
            shown = {name: value for name, value in cores.items() if value >= 0.005}
            parts = ", ".join(f"{name} {value:.2f}" for name, value in shown.items())
            if len(shown) < len(cores):
                parts += f" (and {len(cores) - len(shown)} others below 0.005)"
            lines.append(f"  {variant}: {sum(cores.values()):.2f} in all: {parts}")
    if lines:
        print(f"cores used, by actor ({os.cpu_count()} on this machine):")
        print("\n".join(lines))


def print_source(results: dict[str, dict[str, Any]]) -> None:
    """Per run, the tasks the source published and, with ``skip_no_signal``, passed over (``learn.source_counters``),
    per domain; nothing when no source passed over any."""
    lines = []
    for variant, res in results.items():
        counters = res.get("source") or {}
        passed = {k.split(".", 1)[1]: v for k, v in counters.items() if k.startswith("passed_over.")}
        if passed:
            parts = []
            for domain, count in sorted(passed.items()):
                published = counters.get(f"published.{domain}", 0)
                share = count / (count + published) if count + published else 0.0
                parts.append(f"{domain} {count:,} of {count + published:,} draws ({100 * share:.1f} %)")
            lines.append(f"  {variant}: " + ", ".join(parts))
    if lines:
        print("tasks the source passed over (skip_no_signal), by domain:")
        print("\n".join(lines))


def print_ray_overhead(results: dict[str, dict[str, Any]], variant: str, overhead: dict[str, float]) -> None:
    """The same variant run locally and on Ray side by side, and what Ray cost (``runtime_overhead``)."""
    print(f"\nRay runtime vs local on the same work ({variant}):")
    print(
        markdown_table(
            ["runtime", "wall s", "first RL step after s", "samples trained", "samples/s"],
            [
                [
                    r["runtime"],
                    round(r["wall_s"], 1),
                    round(r.get("first_step_s", 0.0), 1),
                    r.get("samples_trained", 0),
                    round(r.get("samples_per_s", 0.0), 1),
                ]
                for r in (results[f"{variant} (local)"], results[variant])
            ],
        )
    )
    print(
        f"Ray: {100 * (overhead['wall_ratio'] - 1):+.0f} % wall clock, first RL step "
        f"{overhead['first_step_delay_s']:+.1f} s later, {100 * (overhead['samples_per_s_ratio'] - 1):+.0f} % "
        "trained samples/s"
    )


def print_decodings(results: dict[str, dict[str, Any]], *, settled_s: float) -> None:
    """Per variant and domain: the held-out curves of every decoding side by side (one row per round, a decoding's
    round matched to the other's of the same version), then each curve's spread of consecutive rounds."""
    spread_rows = []
    for variant, res in results.items():
        decodings = res.get("decodings", {})
        names = list(decodings)
        for domain in sorted({d for dec in decodings.values() for d in dec.get("curves", {})}):
            by_version: dict[int, dict[str, Any]] = {}
            for name in names:
                for point in decodings[name].get("curves", {}).get(domain, []):
                    row = by_version.setdefault(point["version"], {"t_s": point["t_s"]})
                    row[name] = point["accuracy"]
                    row["t_s"] = min(row["t_s"], point["t_s"])
                gap = decodings[name].get("spread", {}).get(domain)
                spread_rows.append(
                    [
                        variant,
                        domain,
                        name,
                        _pct(decodings[name]["baseline"].get(domain)),
                        _pct(decodings[name]["final"].get(domain)),
                        "-" if gap is None else _pct(gap["max"]),
                        "-" if gap is None else _pct(gap["mean"]),
                        "-" if gap is None else _pct(gap["fall"]),
                        "-" if gap is None else int(gap["pairs"]),
                        "-" if gap is None or "noise" not in gap else _pct(gap["noise"]),
                        "-" if gap is None or "beyond" not in gap else int(gap["beyond"]),
                    ]
                )
            if len(names) > 1:
                print(f"\n{variant} · {domain}: held-out accuracy % per round")
                print(
                    markdown_table(
                        ["s", "version", *names],
                        [
                            [round(r["t_s"]), v, *(_pct(r.get(n)) for n in names)]
                            for v, r in sorted(by_version.items(), key=lambda item: item[1]["t_s"])
                        ],
                    )
                )
    if spread_rows:
        print(f"\nspread of consecutive held-out rounds after the first {settled_s:.0f} s (points)")
        print(
            markdown_table(
                [
                    "variant",
                    "domain",
                    "decoding",
                    "post-warm-start %",
                    "final % (last 3)",
                    "max Δ",
                    "mean Δ",
                    "largest fall",
                    "pairs",
                    "sampling noise (2 sd)",
                    "pairs beyond it",
                ],
                spread_rows,
            )
        )
        print(
            "sampling noise: two standard deviations of the change between two rounds of a policy that did not move "
            "(binomial, from each round's completions); greedy rounds have none"
        )


def print_rollout_fall(results: dict[str, dict[str, Any]], *, settled_s: float, window_steps: int) -> None:
    """Per variant and domain: the largest fall of the training rollouts' accuracy after the first minute
    (``rollout_fall``), beside the held-out rounds' spread."""
    rows = [
        [
            variant,
            domain,
            _pct(fall["peak"]),
            round(fall["peak_t_s"]),
            _pct(fall["trough"]),
            round(fall["trough_t_s"]),
            _pct(fall["fall"]),
        ]
        for variant, res in results.items()
        for domain, fall in sorted(res.get("rollout_fall", {}).items())
    ]
    if rows:
        print(f"\nlargest fall of the training rollouts' accuracy after the first {settled_s:.0f} s (points)")
        print(markdown_table(["variant", "domain", "peak %", "at s", "trough %", "at s", "largest fall"], rows))
        print(
            f"rollouts: the learner's running accuracy (each step's, over a domain's last {ROLLOUT_WINDOW} groups) "
            f"averaged over {window_steps} steps; the fall is from the highest such mean since the "
            f"{settled_s:.0f}-s mark (the first minute's peak does not count, as in the rounds' spread) to the lowest "
            "after it; s since the post-warm-start round. A fall the rounds show too is the policy's. Chance moves it "
            f"too: a group is mostly all right or all wrong, so {ROLLOUT_WINDOW} groups are few, and where a domain "
            "has few groups a step (the embedded default's three domains) chance alone makes falls of 10-20 points: "
            "read it beside the rounds, not alone"
        )


def print_drift(results: dict[str, dict[str, Any]], *, window_s: float) -> None:
    rows = [
        [
            variant,
            round(w["t_s"]),
            w["steps"],
            f"{w['grad_norm_median']:.2f}",
            f"{w['grad_norm_p95']:.2f}",
            f"{w['grad_norm_max']:.1f}",
            "-" if w["behavior_kl"] is None else f"{w['behavior_kl']:.4f}",
        ]
        for variant, res in results.items()
        for w in res.get("drift", [])
    ]
    if rows:
        print(f"\nlearner drift per {window_s:.0f} s of steps: gradient norm before clipping, behavior KL per token")
        print(markdown_table(["variant", "from s", "steps", "median", "p95", "max", "behavior KL"], rows))


def _no_signal(res: dict[str, Any], domain: str) -> str:
    share = res.get("no_signal", {}).get(domain)
    solved, failed = res.get("no_signal_solved", {}).get(domain), res.get("no_signal_failed", {}).get(domain)
    return _pct(share) + (f" ({_pct(solved)}/{_pct(failed)})" if solved is not None and failed is not None else "")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"
