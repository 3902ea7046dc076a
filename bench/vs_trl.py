"""How much sooner does flywheel reach a held-out accuracy than TRL's GRPO trainer? Reads two results files.

Inputs: ``bench/results/learn.json`` (``bench/learn.py --spec TASK/spec.yaml``) and ``bench/results/trl_grpo.json``
(``bench/trl_grpo.py TASK``), both run on the same ``bench/make_hf_task.py`` dir (same warm-start model, task,
reward and held-out prompts; both sampled at T=1 with the same number of samples per prompt). Each curve is
held-out accuracy over seconds of RL: flywheel's from its post-warm-start evaluation, TRL's with its evaluation
time left out (flywheel's evaluation rounds run on the same two cores as its training and are not left out).

Method: each curve after its first point is smoothed by a centred 3-point mean (a single round is ±1.5-3 points of
noise; a centred mean does not shift a rising curve later in time, a trailing one would). For every TRL evaluation
after the first, the target is TRL's smoothed accuracy there; flywheel's time to it is the first crossing of its
own smoothed curve (linear between rounds), and the speedup is TRL's time over flywheel's. A target at or below
flywheel's start counts as "at start" (no speedup). The summary is the median speedup and the lowest over the
targets flywheel reached, how many it did not reach within its run, and each run's mean accuracy over its last 3
rounds within the time both ran.

    .venv/bin/python bench/vs_trl.py                         # the latest results of both benches
    .venv/bin/python bench/vs_trl.py --learn a.json --trl b.json --domain addition

Writes bench/results/vs_trl.json and prints a markdown table. Non-goals: running either trainer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import RESULTS_DIR, markdown_table, write_results  # noqa: E402

Curve = list[tuple[float, float]]  # (seconds of RL, accuracy in [0, 1]), time-ordered


def smooth(curve: Curve) -> Curve:
    """Centred 3-point mean (2 points at the last one); times unchanged. The first point, the warm-started model
    before any RL, is kept as measured: averaging it with a trained round would credit RL before it ran."""
    out = curve[:1]
    for i in range(1, len(curve)):
        window = [a for _, a in curve[i - 1 : i + 2]]
        out.append((curve[i][0], sum(window) / len(window)))
    return out


def time_to_reach(curve: Curve, target: float) -> float | None:
    """First time ``curve`` reaches ``target`` (linear between points); None when it never does."""
    for i, (t, a) in enumerate(curve):
        if a >= target:
            if i == 0:
                return t
            t0, a0 = curve[i - 1]
            return t0 + (t - t0) * (target - a0) / (a - a0)
    return None


def final_mean(curve: Curve, until: float, last: int = 3) -> float:
    """Mean accuracy of the last ``last`` points at or before ``until``."""
    points = [a for t, a in curve if t <= until + 1e-9][-last:]
    return sum(points) / len(points) if points else float("nan")


def compare(flywheel: Curve, trl: Curve) -> dict[str, Any]:
    fw, tr = smooth(flywheel), smooth(trl)
    rows = []
    for t_trl, target in tr[1:]:
        t_fw = time_to_reach(fw, target)
        # a target at or below flywheel's own start (the two measure the same model: noise) has no speedup
        rows.append(
            {
                "trl_s": t_trl,
                "target": target,
                "flywheel_s": t_fw,
                "speedup": t_trl / t_fw if t_fw is not None and t_fw > 0 else None,
            }
        )
    speedups = [r["speedup"] for r in rows if r["speedup"] is not None]
    until = min(flywheel[-1][0], trl[-1][0])
    return {
        "rows": rows,
        "median_speedup": statistics.median(speedups) if speedups else None,
        "min_speedup": min(speedups) if speedups else None,
        "flywheel_s": flywheel[-1][0],
        "not_reached": sum(r["flywheel_s"] is None for r in rows),
        "common_s": until,
        "final_flywheel": final_mean(flywheel, until),
        "final_trl": final_mean(trl, until),
        "start_flywheel": flywheel[0][1],
        "start_trl": trl[0][1],
    }


def load_flywheel(path: Path, variant: str, domain: str | None) -> tuple[str, Curve, float]:
    data = json.loads(path.read_text())
    variants = data.get("variants", {})
    if variant not in variants:
        raise SystemExit(f"{path}: no variant {variant!r} (has: {', '.join(variants) or 'none'})")
    curves = variants[variant]["curves"]
    if domain is None:
        if len(curves) != 1:
            raise SystemExit(f"{path}: {len(curves)} domains ({', '.join(curves)}); pick one with --domain")
        domain = next(iter(curves))
    if domain not in curves:
        raise SystemExit(f"{path}: no domain {domain!r} in variant {variant!r} (has: {', '.join(curves)})")
    curve = [(float(p["t_s"]), float(p["accuracy"])) for p in curves[domain]]
    if len(curve) < 2:
        raise SystemExit(f"{path}: fewer than 2 evaluations of {domain!r}; run longer")
    return domain, curve, float(variants[variant].get("samples_per_s", 0.0))


def load_trl(path: Path) -> tuple[Curve, float, str]:
    data = json.loads(path.read_text())
    curve = [(float(r["rl_s"]), float(r["sampled"])) for r in data["evals"]]
    if len(curve) < 2:
        raise SystemExit(f"{path}: fewer than 2 evaluations; run longer")
    return curve, float(data.get("samples_per_s", 0.0)), str(data.get("trainer", "trl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learn", type=Path, default=RESULTS_DIR / "learn.json")
    parser.add_argument("--trl", type=Path, default=RESULTS_DIR / "trl_grpo.json")
    parser.add_argument("--variant", default="async")
    parser.add_argument("--domain", default=None, help="flywheel domain (default: the only one)")
    args = parser.parse_args()
    for path in (args.learn, args.trl):
        if not path.exists():
            raise SystemExit(f"{path}: not found (run bench/learn.py --spec TASK/spec.yaml and bench/trl_grpo.py TASK)")

    domain, flywheel, fw_rate = load_flywheel(args.learn, args.variant, args.domain)
    trl, trl_rate, trainer = load_trl(args.trl)
    result = compare(flywheel, trl)

    def pct(value: float) -> str:
        return f"{100 * value:.1f}"

    print(
        markdown_table(
            [f"{trainer} s", "its accuracy % (smoothed)", "flywheel s to it", "speedup"],
            [
                [
                    round(r["trl_s"]),
                    pct(r["target"]),
                    "not reached"
                    if r["flywheel_s"] is None
                    else "at start"
                    if r["flywheel_s"] == 0
                    else round(r["flywheel_s"], 1),
                    "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
                ]
                for r in result["rows"]
            ],
        )
    )
    median = result["median_speedup"]
    low = result["min_speedup"]
    print(
        f"\n{domain}: speedup median {'-' if median is None else f'{median:.2f}x'}, lowest "
        f"{'-' if low is None else f'{low:.2f}x'} over the {len(result['rows']) - result['not_reached']} of "
        f"{len(result['rows'])} targets flywheel reached in its {result['flywheel_s']:.0f} s; "
        f"start {pct(result['start_flywheel'])} % (flywheel) vs {pct(result['start_trl'])} % ({trainer}); "
        f"last 3 rounds within the first {result['common_s']:.0f} s: flywheel {pct(result['final_flywheel'])} %, "
        f"{trainer} {pct(result['final_trl'])} %; samples/s {fw_rate:.0f} vs {trl_rate:.0f}"
    )
    path = write_results(
        "vs_trl",
        {
            "learn": str(args.learn),
            "trl": str(args.trl),
            "variant": args.variant,
            "domain": domain,
            "trainer": trainer,
            "flywheel_samples_per_s": fw_rate,
            "trl_samples_per_s": trl_rate,
            **result,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
