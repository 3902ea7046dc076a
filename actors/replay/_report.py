"""The replay report, by domain: recorded vs replayed (vs another version), as JSON, markdown and a PNG.

Per domain: samples; how many a verifier scored; mean reward recorded / replayed / against; the fraction of
scored samples whose replayed verdict equals the recorded one (``agreement``), over the scored samples that have
a recorded outcome; the fraction whose replayed text equals the recorded text (``text_match``); and for
``against`` how many samples changed outcome. A recorded outcome is not there for every sample (served traffic
has one only when a user rated it): ``recorded_samples`` says how many the recorded mean is over, and the
markdown shows it beside that mean when it is not every sample. ``changed`` lists the samples whose outcome differs
between the two versions (key, domain, prompt, each version's verdict, reward and text); the markdown shows the
first ``CHANGED_SHOWN`` of them.
Samples without verifier fields (served prompts that are no task of their domain: its verifier has no answer to
check) are marked "prompts that are no task of the domain: compared by text only", those of a domain the spec
replayed with does not have "not a domain of the spec replayed with". A sample the verifier failed on
(``VERIFIER_ERROR``) has no reward — its 0 would read as the version answering worse (for the gate, a candidate
rejected over a broken verifier): replayed, it is left out of the replayed means and counted in ``verifier_errors``;
recorded, out of the recorded mean and agreement. Throughput: replay's tokens/s beside the bare engine's on the
same prompts.

Non-goals: statistical tests (the gate's threshold is a plain difference of means).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from actors.protocol import VERIFIER_ERROR
from actors.replay._items import ReplayItem
from actors.replay._run import NOT_IN_SPEC, Outcome, ReplayRun

__all__ = ["build_report", "mean_reward", "write_report"]

CHANGED_SHOWN = 20  # changed samples listed in report.md (report.json has all of them)


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def mean_reward(run: ReplayRun) -> float | None:
    return _mean([o.reward for o in run.outcomes if o.reward is not None])


def _passed(verdict: str, reward: float | None) -> bool:
    return verdict == "pass" or (reward is not None and reward >= 1.0)


def build_report(
    items: Sequence[ReplayItem],
    replayed: ReplayRun,
    against: ReplayRun | None = None,
    *,
    seed: int,
    raw: tuple[int, float] | None = None,
) -> dict[str, Any]:
    by_key = {o.key: o for o in replayed.outcomes}
    other = {o.key: o for o in against.outcomes} if against is not None else {}
    domains: dict[str, dict[str, Any]] = {}
    changed: list[dict[str, Any]] = []
    for item in items:
        row = domains.setdefault(
            item.domain or "(none)",
            {
                "samples": 0,
                "scored": 0,
                "recorded": [],
                "replayed": [],
                "against": [],
                "agree": 0,
                "rated": 0,
                "text_match": 0,
                "changed_vs_against": 0,
                "text_only": 0,
                "not_in_spec": 0,
                "verifier_errors": 0,
            },
        )
        mine: Outcome | None = by_key.get(item.key)
        if mine is None:
            continue
        row["samples"] += 1
        row["text_match"] += int(mine.text == item.recorded_text)
        # a verifier's error, recorded or replayed, scored no answer: its reward 0 is no outcome
        recorded = None if item.recorded_verdict == VERIFIER_ERROR else item.recorded_reward
        if mine.reward is None:
            if mine.verdict == VERIFIER_ERROR:  # replayed, but the verifier failed on it
                row["verifier_errors"] += 1
            else:
                row["text_only"] += 1
                row["not_in_spec"] += mine.verdict == NOT_IN_SPEC
            if recorded is not None:
                row["recorded"].append(recorded)
            continue
        row["scored"] += 1
        row["replayed"].append(mine.reward)
        if recorded is not None:
            row["recorded"].append(recorded)
            row["rated"] += 1
            row["agree"] += int(_passed(mine.verdict, mine.reward) == _passed(item.recorded_verdict, recorded))
        theirs = other.get(item.key)
        if theirs is not None and theirs.reward is not None:
            row["against"].append(theirs.reward)
            if theirs.verdict != mine.verdict:
                row["changed_vs_against"] += 1
                changed.append(
                    {
                        "key": item.key,
                        "domain": mine.domain,
                        "prompt": item.prompt,
                        "weights": {"verdict": mine.verdict, "reward": mine.reward, "text": mine.text},
                        "against": {"verdict": theirs.verdict, "reward": theirs.reward, "text": theirs.text},
                    }
                )
    table: dict[str, dict[str, Any]] = {}
    for domain, row in sorted(domains.items()):
        scored = row["scored"]
        table[domain] = {
            "samples": row["samples"],
            "scored": scored,
            "recorded_mean_reward": _mean(row["recorded"]),
            "recorded_samples": len(row["recorded"]),
            "replayed_mean_reward": _mean(row["replayed"]),
            "against_mean_reward": _mean(row["against"]) if against is not None else None,
            # over the samples with both outcomes: one with no recorded outcome can neither agree nor disagree
            "agreement": round(row["agree"] / row["rated"], 4) if row["rated"] else None,
            "text_match": round(row["text_match"] / row["samples"], 4) if row["samples"] else None,
            "changed_vs_against": row["changed_vs_against"] if against is not None else None,
            "verifier_errors": row["verifier_errors"],
            "note": _note(row),
        }
    report: dict[str, Any] = {
        "seed": seed,
        "samples": len(items),
        "weights": {"label": replayed.label, "version": replayed.version, "mean_reward": mean_reward(replayed)},
        "against": (
            {"label": against.label, "version": against.version, "mean_reward": mean_reward(against)}
            if against is not None
            else None
        ),
        "domains": table,
        "changed": changed if against is not None else None,
        "throughput": {
            "replay_tokens": replayed.tokens,
            "replay_s": round(replayed.wall_s, 4),
            "replay_tokens_per_s": round(replayed.tokens_per_s, 1),
        },
        "outcomes": [
            {"key": o.key, "domain": o.domain, "reward": o.reward, "verdict": o.verdict, "text": o.text}
            for o in replayed.outcomes
        ],
    }
    if raw is not None:
        tokens, seconds = raw
        engine_tps = tokens / seconds if seconds > 0 else 0.0
        report["throughput"].update(
            {
                "engine_tokens": tokens,
                "engine_s": round(seconds, 4),
                "engine_tokens_per_s": round(engine_tps, 1),
                "replay_vs_engine": round(replayed.tokens_per_s / engine_tps, 3) if engine_tps else None,
            }
        )
    return report


def _note(row: dict[str, Any]) -> str:
    if row["verifier_errors"]:
        return f"the verifier failed on {row['verifier_errors']}: left out of the means"
    if not row["text_only"] or row["scored"]:
        return ""
    if row["not_in_spec"]:  # replayed with another spec than the run's (--spec)
        return "not a domain of the spec replayed with: compared by text only"
    return "prompts that are no task of the domain: compared by text only"  # its verifier has no answer to check


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _cell(text: str, width: int = 40) -> str:
    """``text`` on one line of a markdown table: code-quoted, pipes escaped, cut at ``width`` characters."""
    flat = text.replace("\n", "⏎").replace("|", "\\|").replace("`", "'")
    return f"`{flat[:width]}`" + ("…" if len(flat) > width else "")


def _recorded(row: dict[str, Any]) -> str:
    """The recorded mean, with how many samples it is over when that is not all of them (traffic: the rated)."""
    mean = _fmt(row["recorded_mean_reward"])
    if row["recorded_mean_reward"] is None or row["recorded_samples"] == row["samples"]:
        return mean
    return f"{mean} (of {row['recorded_samples']})"


def markdown(report: dict[str, Any]) -> str:
    w, a = report["weights"], report["against"]
    lines = [
        f"# Replay of {report['samples']} recorded samples",
        "",
        f"weights **{w['label']}** (mean reward {_fmt(w['mean_reward'])})"
        + (f" against **{a['label']}** (mean reward {_fmt(a['mean_reward'])})" if a else "")
        + f", seed {report['seed']}",
        "",
        "| domain | samples | scored | recorded | replayed | against | agreement | text match | changed | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for domain, row in report["domains"].items():
        lines.append(
            "| "
            + " | ".join(
                _fmt(v)
                for v in (
                    domain,
                    row["samples"],
                    row["scored"],
                    _recorded(row),
                    row["replayed_mean_reward"],
                    row["against_mean_reward"],
                    row["agreement"],
                    row["text_match"],
                    row["changed_vs_against"],
                    row["note"],
                )
            )
            + " |"
        )
    changed = report.get("changed") or []
    if changed and a:
        shown = changed[:CHANGED_SHOWN]
        more = f" (the first {len(shown)}; report.json has all)" if len(changed) > len(shown) else ""
        lines += [
            "",
            f"## {len(changed)} samples changed outcome{more}",
            "",
            f"| domain | prompt | {w['label']} | {a['label']} |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {c['domain']} | {_cell(c['prompt'])} | {c['weights']['verdict']}: {_cell(c['weights']['text'])} "
            f"| {c['against']['verdict']}: {_cell(c['against']['text'])} |"
            for c in shown
        ]
    t = report["throughput"]
    lines += [
        "",
        f"Throughput: replay {t['replay_tokens_per_s']} tokens/s"
        + (
            f", bare engine {t['engine_tokens_per_s']} tokens/s on the same prompts "
            f"({_fmt(t['replay_vs_engine'])} of it)"
            if "engine_tokens_per_s" in t
            else ""
        ),
        "",
    ]
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """report.json, report.md and report.png in ``out_dir`` (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "report.json", out_dir / "report.md", out_dir / "report.png"]
    paths[0].write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    paths[1].write_text(markdown(report))
    _plot(report, paths[2])
    return paths


def plot_series(report: dict[str, Any]) -> list[tuple[str, list[float], list[float], list[float]]]:
    """The plot's bars, per series (recorded, the replayed version, the other one): its name, the x and height of
    each bar, and the x of each domain that has no such mean (nothing recorded or scored there: no bar)."""
    columns = [("recorded", "recorded_mean_reward"), (report["weights"]["label"], "replayed_mean_reward")]
    if report["against"]:
        columns.append((report["against"]["label"], "against_mean_reward"))
    width = 0.8 / len(columns)
    series = []
    for i, (name, column) in enumerate(columns):
        xs, heights, missing = [], [], []
        for position, row in enumerate(report["domains"].values()):
            x = position + i * width
            if row[column] is None:
                missing.append(x)
            else:
                xs.append(x)
                heights.append(float(row[column]))
        series.append((name, xs, heights, missing))
    return series


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    domains = list(report["domains"])
    series = plot_series(report)
    # constrained layout makes room for long version labels and domain names (tight_layout gives up and warns)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(domains) + 2), 4.0), layout="constrained")
    width = 0.8 / len(series)
    for name, xs, heights, missing in series:
        ax.bar(xs, heights, width, label=name if len(name) <= 40 else "…" + name[-39:])  # a path's end names it
        for x in missing:  # no bar: a bar of 0 would read as a mean reward of 0
            ax.text(x, 0.02, "n/a", ha="center", va="bottom", fontsize=7, rotation=90, color="0.4")
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(domains))], domains)
    ax.set_ylabel("mean reward")
    ax.set_ylim(0, 1.05)
    fig.legend(loc="outside lower center", ncols=len(series), fontsize=8)
    ax.set_title("replay by domain")
    fig.savefig(path, dpi=100)
    plt.close(fig)
