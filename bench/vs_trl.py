"""How much sooner does flywheel reach a held-out accuracy than TRL's GRPO trainer? Reads two results files.

Inputs: ``bench/results/learn.json`` (``bench/learn.py --spec TASK/spec.yaml``) and ``bench/results/trl_grpo.json``
(``bench/trl_grpo.py TASK``), both run on the same ``bench/make_hf_task.py`` dir (same warm-start model, task,
reward and held-out prompts), each scored greedy (what a served model answers; the headline) and sampled at T=1.
Each curve is held-out accuracy over seconds of RL: flywheel's from its post-warm-start evaluation, TRL's with its
evaluation time left out (flywheel's evaluation rounds run on the same two cores as its training and are not left
out).

Method: each curve after its first point is smoothed by a centred 3-point mean (a centred mean does not shift a rising
curve later in time, a trailing one would). Two readings, per decoding:

- fixed targets (``--targets``, default 70 % and 75 %): each trainer's time to reach them (the first crossing of its
  smoothed curve, linear between rounds) and TRL's time over flywheel's;
- TRL's own curve: for every TRL evaluation after the first, the target is TRL's smoothed accuracy there, and the
  speedup is TRL's time over flywheel's time to it (median and lowest over the targets flywheel reached). A target at
  or below flywheel's start counts as "at start" (no speedup).

Then each run's mean accuracy over its last 3 rounds within the time both ran, and both sides' settings (TRL's lr and
how it was chosen; the flywheel learner settings the run overrode — none but the evaluation's decodings means
flywheel ran at its defaults).

    .venv/bin/python bench/vs_trl.py                         # the latest results of both benches
    .venv/bin/python bench/vs_trl.py --learn a.json --trl b.json --domain addition

Writes bench/results/vs_trl.json and prints markdown tables. Non-goals: running either trainer.
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


def compare(flywheel: Curve, trl: Curve, targets: tuple[float, ...] = ()) -> dict[str, Any]:
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
    fixed = []
    for target in targets:
        t_trl, t_fw = time_to_reach(tr, target), time_to_reach(fw, target)
        ratio = t_trl / t_fw if t_trl is not None and t_fw is not None and t_fw > 0 else None
        fixed.append({"target": target, "trl_s": t_trl, "flywheel_s": t_fw, "speedup": ratio})
    speedups = [r["speedup"] for r in rows if r["speedup"] is not None]
    until = min(flywheel[-1][0], trl[-1][0])
    return {
        "targets": fixed,
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


def load_flywheel(
    path: Path, variant: str, domain: str | None
) -> tuple[str, dict[str, Curve], float, dict[str, Any], dict[str, Any]]:
    """The domain, its held-out curve per decoding ("greedy", "sampled"), samples/s, the learner overrides and what
    the learner resolved (``lr``, ``params``, from 2026-12-06 ``ema_decay``; empty for a run of a tree before
    2026-12-05)."""
    data = json.loads(path.read_text())
    variants = data.get("variants", {})
    if variant not in variants:
        raise SystemExit(f"{path}: no variant {variant!r} (has: {', '.join(variants) or 'none'})")
    run = variants[variant]
    decodings = run.get("decodings") or {"greedy": {"curves": run["curves"]}}
    names = {d for dec in decodings.values() for d in dec.get("curves", {})}
    if domain is None:
        if len(names) != 1:
            raise SystemExit(f"{path}: {len(names)} domains ({', '.join(sorted(names))}); pick one with --domain")
        domain = next(iter(names))
    curves = {}
    for name, decoding in decodings.items():
        points = decoding.get("curves", {}).get(domain, [])
        if len(points) >= 2:
            curves[name] = [(float(p["t_s"]), float(p["accuracy"])) for p in points]
    if not curves:
        raise SystemExit(f"{path}: fewer than 2 evaluations of {domain!r} in variant {variant!r}; run longer")
    overrides = run.get("overrides", {}).get("actors", {}).get("learner", {})
    resolved = {key: run[key] for key in ("lr", "params", "ema_decay") if key in run}
    return domain, curves, float(run.get("samples_per_s", 0.0)), overrides, resolved


def load_trl(path: Path) -> tuple[dict[str, Curve], float, str, dict[str, Any]]:
    data = json.loads(path.read_text())
    curves = {
        name: [(float(r["rl_s"]), float(r[name])) for r in data["evals"]]
        for name in ("greedy", "sampled")
        if all(name in r for r in data["evals"])
    }
    if len(data["evals"]) < 2:
        raise SystemExit(f"{path}: fewer than 2 evaluations; run longer")
    settings = {
        "lr": data.get("lr"),
        "lr_chosen_by": data.get("lr_chosen_by", "given"),
        "sweep": {f"{r['lr']:g}": round(100 * r["greedy_last3"], 1) for r in data.get("sweep", [])},
        "best_at_edge": bool(data.get("best_at_edge", False)),
        "prompts_x_group": f"{data.get('prompts')} x {data.get('group')}",
        **(data.get("trl_config") or {}),
    }
    return curves, float(data.get("samples_per_s", 0.0)), str(data.get("trainer", "trl")), settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learn", type=Path, default=RESULTS_DIR / "learn.json")
    parser.add_argument("--trl", type=Path, default=RESULTS_DIR / "trl_grpo.json")
    parser.add_argument("--variant", default="async")
    parser.add_argument("--domain", default=None, help="flywheel domain (default: the only one)")
    parser.add_argument("--targets", default="0.70,0.75", help="fixed held-out accuracies to time (comma-separated)")
    args = parser.parse_args()
    for path in (args.learn, args.trl):
        if not path.exists():
            raise SystemExit(f"{path}: not found (run bench/learn.py --spec TASK/spec.yaml and bench/trl_grpo.py TASK)")

    targets = tuple(float(t) for t in args.targets.split(",") if t.strip())
    domain, flywheel, fw_rate, overrides, resolved = load_flywheel(args.learn, args.variant, args.domain)
    trl, trl_rate, trainer, trl_settings = load_trl(args.trl)
    results = {
        name: compare(flywheel[name], trl[name], targets)
        for name in ("greedy", "sampled")
        if name in flywheel and name in trl
    }
    if not results:
        raise SystemExit(f"no decoding in common: flywheel has {', '.join(flywheel)}, {trainer} {', '.join(trl)}")

    def pct(value: float) -> str:
        return f"{100 * value:.1f}"

    def secs(value: float | None) -> str:
        return "not reached" if value is None else "at start" if value == 0 else f"{value:.1f}"

    tuned = {k: v for k, v in overrides.items() if k != "eval_temperature"}
    print(
        f"{trainer}: lr {trl_settings['lr']:g} ({trl_settings['lr_chosen_by']}"
        + (f"; sweep, greedy % of the last 3 rounds: {trl_settings['sweep']}" if trl_settings["sweep"] else "")
        + (
            "; the best at an end of the swept range: TRL's best may lie beyond it"
            if trl_settings["best_at_edge"]
            else ""
        )
        + f"), {trl_settings['prompts_x_group']} per step; flywheel: "
        + (f"learner overrides {json.dumps(tuned)}" if tuned else "its defaults")
        + (
            f" (lr {resolved['lr']:.3g} for {resolved['params'] / 1e6:.2f}M parameters)"
            if {"lr", "params"} <= resolved.keys()
            else ""
        )
        + (
            f"; its rounds measure the weights' average (ema_decay {resolved['ema_decay']:g})"
            if resolved.get("ema_decay") is not None
            else ""
        )
    )
    for name, result in results.items():
        print(f"\n{name} held-out accuracy")
        print(
            markdown_table(
                ["target %", f"{trainer} s", "flywheel s", "sooner"],
                [
                    [
                        pct(r["target"]),
                        secs(r["trl_s"]),
                        secs(r["flywheel_s"]),
                        "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
                    ]
                    for r in result["targets"]
                ],
            )
        )
        median, low = result["median_speedup"], result["min_speedup"]
        print(
            f"{domain} ({name}): along {trainer}'s curve, speedup median "
            f"{'-' if median is None else f'{median:.2f}x'}, "
            f"lowest {'-' if low is None else f'{low:.2f}x'} over the {len(result['rows']) - result['not_reached']} of "
            f"{len(result['rows'])} targets flywheel reached in its {result['flywheel_s']:.0f} s; "
            f"start {pct(result['start_flywheel'])} % (flywheel) vs {pct(result['start_trl'])} % ({trainer}); "
            f"last 3 rounds within the first {result['common_s']:.0f} s: flywheel {pct(result['final_flywheel'])} %, "
            f"{trainer} {pct(result['final_trl'])} %"
        )
    print(f"samples/s: flywheel {fw_rate:.0f}, {trainer} {trl_rate:.0f}")
    path = write_results(
        "vs_trl",
        {
            "learn": str(args.learn),
            "trl": str(args.trl),
            "variant": args.variant,
            "domain": domain,
            "trainer": trainer,
            "trl_settings": trl_settings,
            "flywheel_overrides": tuned,
            "flywheel_resolved": resolved,
            "flywheel_samples_per_s": fw_rate,
            "trl_samples_per_s": trl_rate,
            "decodings": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
