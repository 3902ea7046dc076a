"""The learner's metrics on disk: parquet parts under ``<run_dir>/metrics/`` and a held-out accuracy plot.

Contract:
- Rows are buffered in memory and written by :meth:`MetricsWriter.flush` to a new part file
  ``<kind>-<incarnation>-<n:05d>.parquet`` (written to a temporary name, then renamed: a reader never sees a
  partial file). Kinds: ``step`` (one row per optimizer step), ``eval`` (one row per held-out evaluation of a
  domain), ``applied`` (one row per applied message: the exactly-once audit trail), ``lifecycle`` (start,
  resume, warm start, checkpoints).
- ``incarnation`` names one life of the learner process (a restart is a new incarnation), so parts of different
  lives never collide and the audit trail can tell them apart.
- :meth:`MetricsWriter.compact` merges small parts into larger ones in the background (``_parts``: merged parts
  name the parts they hold, a kill during a merge neither loses nor repeats a row), so the number of files grows
  with the logarithm of the run's length, not with the length.
- :func:`read_metrics` concatenates every part of one kind (columns missing in a part are null), merged or not: the
  same rows in the same order;
  :func:`heldout_first_and_last` reads the run's first and newest held-out accuracy by domain back from the ``eval``
  rows of the domain's current series (`EvalSeries`), so a resumed learner reports them before its next round;
  :func:`heldout_series_changes` says which domains' series the spec a run resumed with ended, and why;
  :func:`newest_version` the newest weight version the run's ``lifecycle`` rows name.
- :func:`effective_applied` reads the audit trail back: the ``applied`` rows whose effect is in the final weights —
  each incarnation's rows up to the checkpoint the next one resumed from (later ones were rolled back with the
  weights), plus all of the last incarnation's. Each message id appears there once when nothing was lost or
  applied twice.
- :func:`plot_heldout` draws held-out accuracy by domain over wall-clock time and by version (matplotlib Agg),
  sampled rounds with a band of ±2 :func:`sampling_sd`; a domain's rounds of two series are two lines, not one.

Non-goals: live dashboards (``flywheel status`` shows the live counters).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from actors.learner._eval import EvalSeries
from actors.learner._parts import LOCK, TURN, compact, read_parts

__all__ = [
    "MetricsWriter",
    "effective_applied",
    "heldout_first_and_last",
    "heldout_series_changes",
    "newest_version",
    "plot_heldout",
    "read_metrics",
    "sampling_sd",
]


class MetricsWriter:
    def __init__(self, run_dir: Path, incarnation: str) -> None:
        self.dir = Path(run_dir) / "metrics"
        self.dir.mkdir(parents=True, exist_ok=True)
        for lock in (TURN, LOCK):  # readers lock them from the first part on (see ``_parts``)
            (self.dir / lock).touch()
        self.incarnation = incarnation
        self._rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._parts = 0
        self._flushing = threading.Lock()  # flushes come from the event loop and from a worker thread
        self._compacting = threading.Lock()

    def add(self, kind: str, row: dict[str, Any]) -> None:
        self._rows[kind].append({"incarnation": self.incarnation, **row})

    def pending(self) -> int:
        return sum(len(rows) for rows in self._rows.values())

    def flush(self, kinds: tuple[str, ...] | None = None) -> list[Path]:
        """Write the buffered rows (of ``kinds``, default all) to new part files; returns the files written. One flush
        at a time: two at once could number two parts alike, and the second would replace the first."""
        with self._flushing:
            return self._flush(kinds)

    def _flush(self, kinds: tuple[str, ...] | None) -> list[Path]:
        written = []
        for kind in list(self._rows):
            rows = self._rows[kind]
            if not rows or (kinds is not None and kind not in kinds):
                continue
            self._rows[kind] = []
            self._parts += 1
            final = self.dir / f"{kind}-{self.incarnation}-{self._parts:05d}.parquet"
            tmp = final.with_name("." + final.name + ".tmp")
            pl.from_dicts(rows, infer_schema_length=None).write_parquet(tmp)
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, final)
            written.append(final)
        return written

    def compact(self, fan_in: int) -> list[Path]:
        """Merge the parts that are due (``fan_in`` of one level; see ``_parts``), every life's; returns the merged
        parts written. Runs beside flushes: those only add parts numbered above every part a merge takes."""
        with self._compacting:
            return compact(self.dir, fan_in=fan_in, keep=self.incarnation)


def read_metrics(run_dir: Path, kind: str = "step") -> pl.DataFrame:
    """Every row of ``kind`` written under ``run_dir/metrics`` (empty frame when there is none)."""
    return read_parts(Path(run_dir) / "metrics", kind)


def heldout_first_and_last(
    run_dir: Path, temperature: float, series: Mapping[str, EvalSeries] | None = None
) -> dict[str, tuple[float, float]]:
    """``{domain: (first, newest)}`` held-out accuracy at ``temperature`` over every life of the run, by time; with
    ``series``, of each domain's rounds in that series only (and only of the domains it names)."""
    evals = read_metrics(run_dir, "eval")
    if evals.height == 0 or not {"ts", "domain", "accuracy"} <= set(evals.columns):
        return {}
    if "temperature" in evals.columns:  # older parts have no temperature: those were rounds at the first one
        evals = evals.filter(pl.col("temperature").is_null() | (pl.col("temperature") == temperature))
    if series is not None:
        evals = evals.filter(pl.col("domain").is_in(list(series)))
        if "series" in evals.columns:  # rounds recorded before series were: taken as the current one's
            current = pl.col("domain").replace_strict({d: s.key for d, s in series.items()}, default=None)
            evals = evals.filter(pl.col("series").is_null() | (pl.col("series") == current))
    ends = (
        evals.sort("ts")
        .group_by("domain")
        .agg(pl.col("accuracy").first().alias("first"), pl.col("accuracy").last().alias("last"))
    )
    return {row["domain"]: (float(row["first"]), float(row["last"])) for row in ends.iter_rows(named=True)}


def heldout_series_changes(run_dir: Path, series: Mapping[str, EvalSeries]) -> dict[str, str]:
    """``{domain: why}`` for each domain of ``series`` whose latest recorded round is of another series: what changed
    (the number of held-out prompts, the verifier, or the prompts themselves)."""
    evals = read_metrics(run_dir, "eval")
    if evals.height == 0 or not {"ts", "domain", "series"} <= set(evals.columns):
        return {}
    last = evals.filter(pl.col("series").is_not_null()).sort("ts").group_by("domain").last()
    changes = {}
    for row in last.iter_rows(named=True):
        now = series.get(row["domain"])
        if now is None or row["series"] == now.key:
            continue
        if row.get("prompts") is not None and row["prompts"] != now.prompts:
            changes[row["domain"]] = f"{row['prompts']} held-out prompts → {now.prompts} (eval_size or heldout)"
        elif row.get("verifier") is not None and row["verifier"] != now.verifier:
            changes[row["domain"]] = f"verifier {row['verifier']} → {now.verifier}"
        else:
            changes[row["domain"]] = "the held-out prompts or the verifier's settings changed"
    return changes


def newest_version(run_dir: Path) -> int:
    """The newest weight version the ``lifecycle`` rows name (0: none): the newest a run published, as far as its
    rows reached disk."""
    rows = read_metrics(run_dir, "lifecycle")
    if rows.height == 0 or "version" not in rows.columns:
        return 0
    newest = rows["version"].max()
    return int(newest) if isinstance(newest, int | float) else 0


def effective_applied(run_dir: Path) -> pl.DataFrame:
    """The ``applied`` rows whose effect is in the final weights (see the module docstring), oldest life first.

    A life's rows count up to the checkpoint the next life resumed from, by time: groups without signal are
    accounted at the step the learner is at, so a life can account some at step N after its checkpoint at step N,
    and those were rolled back with the weights. The time is the one the resume row names (``checkpoint_ts``: when
    the checkpoint's state, its ledger with it, was taken), else the checkpoint's own lifecycle row; when neither is
    there (a checkpoint of an older version, its row never flushed: killed right after the save), by step — which
    cannot tell the groups consumed at step N after the checkpoint from those before it."""
    applied = read_metrics(run_dir, "applied")
    lifecycle = read_metrics(run_dir, "lifecycle")
    if applied.height == 0 or lifecycle.height == 0:
        return applied
    order = lifecycle.group_by("incarnation").agg(pl.col("ts").min().alias("first")).sort("first")
    incarnations = order["incarnation"].to_list()
    resume_rows = lifecycle.filter(event="resume")
    has_cut = "checkpoint_ts" in resume_rows.columns
    resumes = {
        r["incarnation"]: (r["step"], r["checkpoint_ts"] if has_cut else None)
        for r in resume_rows.iter_rows(named=True)
    }
    checkpoints = lifecycle.filter(event="checkpoint")
    kept = []
    for index, incarnation in enumerate(incarnations):
        rows = applied.filter(pl.col("incarnation") == incarnation)
        later = [resumes[i] for i in incarnations[index + 1 :] if i in resumes]
        if later and rows.height:
            step, taken_ts = later[0]
            written = checkpoints.filter(
                pl.col("incarnation").is_in(incarnations[: index + 1]) & (pl.col("step") == step)
            )
            if taken_ts is not None:
                rows = rows.filter(pl.col("ts") <= taken_ts)
            elif written.height:
                rows = rows.filter(pl.col("ts") <= written["ts"].max())
            else:
                rows = rows.filter(pl.col("step") <= step)
        kept.append(rows)
    return pl.concat(kept, how="diagonal_relaxed")


def decodings(evals: Any) -> list[float]:
    """The temperatures the ``eval`` rows were decoded at, greedy (0) first."""
    if "temperature" not in evals.columns:
        return [0.0]
    return sorted({float(t or 0.0) for t in evals["temperature"]})


def eval_mode(evals: Any, temperature: float | None = None) -> str:
    """How the ``eval`` rows (those decoded at ``temperature``; None: every decoding) were decoded, for labels:
    "greedy" or "sampled at T=1, 2 per prompt" (plus the post-warm-start round's count when it drew more); several
    decodings are joined by " / "."""
    if temperature is None:
        return " / ".join(eval_mode(evals, t) for t in decodings(evals))
    if temperature == 0.0:
        return "greedy"
    label = f"sampled at T={temperature:g}"
    if "samples" not in evals.columns:
        return f"{label}, 1 per prompt"
    rows = evals.filter(pl.col("temperature") == temperature) if "temperature" in evals.columns else evals
    counts = [int(s) for s in rows.sort("ts")["samples"]]
    first, usual = counts[0], counts[-1]
    return f"{label}, {usual} per prompt" + (f" ({first} in the post-warm-start round)" if first != usual else "")


def sampling_sd(accuracy: float, completions: int) -> float:
    """Standard deviation of a sampled held-out round's accuracy from sampling alone (binomial): sqrt(p(1-p)/n)."""
    return math.sqrt(accuracy * (1 - accuracy) / max(completions, 1))


def _series_parts(rows: pl.DataFrame) -> list[pl.DataFrame]:
    """``rows`` (one domain and decoding, by time) cut where their series changes (rows without one: the series
    of the rows before them)."""
    if "series" not in rows.columns or rows.height == 0:
        return [rows]
    keys = rows["series"].fill_null(strategy="forward").to_list()
    cuts = [0, *(i for i in range(1, len(keys)) if keys[i] != keys[i - 1]), len(keys)]
    return [rows.slice(start, end - start) for start, end in itertools.pairwise(cuts)]


def plot_heldout(run_dir: Path, out: Path | None = None) -> Path | None:
    """``run_dir/heldout_accuracy.png`` from the ``eval`` rows; None when there is nothing to plot yet.

    One colour per domain, one line style per decoding; the legend goes below both panels and the figure grows
    with it, so that any number of domains and decodings fits. The margins are fixed rather than fitted: tight_layout
    would draw the whole figure a second time, and the learner renders while it trains (bench/RESULTS.md)."""
    evals = read_metrics(run_dir, "eval")
    if evals.is_empty():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = out or Path(run_dir) / "heldout_accuracy.png"
    t0 = float(evals["ts"].min())  # type: ignore[arg-type]
    temperatures = decodings(evals)
    domains = sorted(evals["domain"].unique().to_list())
    columns = min(len(domains) * len(temperatures), 3)
    legend_rows = -(-len(domains) * len(temperatures) // columns)
    width, plots, legend = 11.0, 3.4, 0.55 + 0.25 * legend_rows  # inches: the panels' height, the legend's below
    height = plots + legend + 0.75  # and the title above
    fig, (by_time, by_version) = plt.subplots(1, 2, figsize=(width, height), sharey=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for d, domain in enumerate(domains):
        for i, temperature in enumerate(temperatures):
            rows = evals.filter(pl.col("domain") == domain)
            if "temperature" in evals.columns:
                rows = rows.filter(pl.col("temperature").fill_null(0.0) == temperature)
            decoding = "greedy" if temperature == 0.0 else f"sampled, T={temperature:g}"
            label: str | None = domain if len(temperatures) == 1 else f"{domain}, {decoding}"
            style = {"linestyle": ("-", "--", ":", "-.")[i % 4], "marker": "o", "color": colours[d % len(colours)]}
            for part in _series_parts(rows.sort("ts")):  # rounds of two series are never joined by a line
                seconds = [float(t) - t0 for t in part["ts"].to_list()]
                accuracy = part["accuracy"].to_list()
                by_time.plot(seconds, accuracy, label=label, **style)
                by_version.plot(part["version"].to_list(), accuracy, **style)
                label = None  # one legend entry per domain and decoding
                if temperature > 0 and "n" in part.columns:  # sampled: a band of two standard deviations (binomial)
                    two_sd = [2 * sampling_sd(a, int(n)) for a, n in zip(accuracy, part["n"], strict=True)]
                    low = [a - d for a, d in zip(accuracy, two_sd, strict=True)]
                    high = [a + d for a, d in zip(accuracy, two_sd, strict=True)]
                    by_time.fill_between(seconds, low, high, color=style["color"], alpha=0.12, linewidth=0)
    by_time.set_xlabel("seconds since the first evaluation")
    by_version.set_xlabel("weights version")
    by_time.set_ylabel("held-out accuracy")
    by_time.set_ylim(-0.02, 1.02)
    for axis in (by_time, by_version):
        axis.grid(alpha=0.3)
    band = "; shaded: ±2 sd of a sampled round's own sampling noise" if any(t > 0 for t in temperatures) else ""
    fig.suptitle(f"held-out accuracy by domain\n{eval_mode(evals)}{band}", fontsize=10)
    fig.legend(loc="lower center", ncol=columns, frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.subplots_adjust(
        left=0.75 / width,
        right=1 - 0.2 / width,
        bottom=(legend + 0.1) / height,
        top=1 - 0.75 / height,
        wspace=0.06,
    )
    tmp = out.with_name("." + out.name + ".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, out)
    return out
