"""The held-out plot: sampled rounds carry a band of their own sampling noise, greedy rounds none."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from actors.learner import MetricsWriter, plot_heldout


def test_sampled_rounds_are_drawn_with_a_band_of_two_standard_deviations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.axes import Axes

    bands: list[tuple[list[float], list[float]]] = []
    original = Axes.fill_between

    def record(self: Axes, x: Any, low: Any, high: Any, **kwargs: Any) -> Any:
        bands.append((list(low), list(high)))
        return original(self, x, low, high, **kwargs)

    monkeypatch.setattr(Axes, "fill_between", record)
    writer = MetricsWriter(tmp_path, "life-1")
    for i, (greedy, sampled) in enumerate([(0.3, 0.25), (0.5, 0.4)]):
        for temperature, accuracy, n in ((0.0, greedy, 200), (1.0, sampled, 400)):
            row = {"ts": 100.0 + 30 * i, "step": 20 * i, "version": 1 + 10 * i, "domain": "arithmetic"}
            writer.add("eval", {**row, "n": n, "accuracy": accuracy, "temperature": temperature, "samples": n // 200})
    writer.flush()

    out = plot_heldout(tmp_path)

    assert out is not None and out.stat().st_size > 0
    assert len(bands) == 1  # the sampled curve only
    low, high = bands[0]
    two_sd = [2 * math.sqrt(a * (1 - a) / 400) for a in (0.25, 0.4)]
    assert low == pytest.approx([0.25 - two_sd[0], 0.4 - two_sd[1]])
    assert high == pytest.approx([0.25 + two_sd[0], 0.4 + two_sd[1]])


def test_held_out_plot_keeps_every_label_inside_the_figure_and_the_legend_off_the_curves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three domains decoded two ways (the embedded default's rounds): the legend's six entries and the long
    description of the decodings must neither leave the image nor sit on the panels (both did before)."""
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure plot_heldout is done with
    writer = MetricsWriter(tmp_path, "life-1")
    for i in range(4):
        for domain in ("arithmetic", "extract", "pyexpr"):
            for temperature, n in ((0.0, 200), (1.0, 400)):
                row = {"ts": 100.0 + 30 * i, "step": 20 * i, "version": 1 + 10 * i, "domain": domain}
                samples = 4 if i == 0 and temperature else n // 200
                writer.add("eval", {**row, "n": n, "accuracy": 0.1 * i, "temperature": temperature, "samples": samples})
    writer.flush()

    assert plot_heldout(tmp_path) is not None
    (figure,) = figures
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    texts = [t.get_text() for t in figure.findobj(Text)]
    assert any("post-warm-start" in t for t in texts)  # the decodings are described somewhere
    drawn, frame = figure.get_tightbbox(renderer), figure.bbox_inches  # everything drawn, in inches
    assert drawn.x0 >= -0.01 and drawn.y0 >= -0.01, f"a label leaves the figure: {drawn} in {frame}"
    assert drawn.x1 <= frame.x1 + 0.01 and drawn.y1 <= frame.y1 + 0.01, f"a label leaves the figure: {drawn} in {frame}"
    legend = figure.legends[0].get_window_extent(renderer)
    assert len(figure.legends[0].get_texts()) == 6
    for axes in figure.axes:
        assert not legend.overlaps(axes.get_window_extent(renderer)), "the legend sits on a panel"


def test_held_out_plot_never_joins_the_rounds_of_two_series(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run resumed with another eval set: its domain's rounds before and after are two lines under one legend entry
    (one line drew a climb or a fall from one set of prompts to another)."""
    import matplotlib.pyplot as plt

    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)
    writer = MetricsWriter(tmp_path, "life-1")
    for i, series in enumerate(("eight", "eight", "four", "four", "four")):
        row = {"ts": 100.0 + i, "step": i, "version": i + 1, "domain": "arithmetic", "n": 8, "accuracy": 0.1 * i}
        writer.add("eval", {**row, "temperature": 0.0, "samples": 1, "series": series})
    writer.flush()

    assert plot_heldout(tmp_path) is not None
    (figure,) = figures
    by_time = figure.axes[0]
    assert [len(line.get_xdata()) for line in by_time.get_lines()] == [2, 3]
    assert len(figure.legends[0].get_texts()) == 1


def test_effective_applied_cuts_a_life_at_the_time_its_resumed_checkpoint_was_taken(tmp_path: Path) -> None:
    """A learner accounts groups without signal at the step it is at, so some are accounted at step 10 after the
    checkpoint at step 10 was taken; killed before that checkpoint's own lifecycle row reached disk, the audit trail
    cut the life by step and counted them, and a resumed life that consumed them again (they were not in the
    checkpoint's ledger) read as applying them twice (a CI run of tests/test_resume.py: a racy check, not a double
    apply). The resume row names when its checkpoint's state was taken; the cut is made there."""
    from actors.learner import effective_applied

    def applied(writer: MetricsWriter, ts: float, message_id: str) -> None:
        row = {"ts": ts, "step": 10, "message_id": message_id, "domain": "d", "completions": 4, "how": "consumed"}
        writer.add("applied", {**row, "reward": 0.0, "task_id": "t"})

    first = MetricsWriter(tmp_path, "life-1")
    first.add("lifecycle", {"ts": 0.0, "event": "start", "step": 0})
    applied(first, 1.0, "before")  # in the checkpoint taken at 2.0 (its row never flushed)
    applied(first, 3.0, "after")  # accounted after it, then the kill: rolled back, redelivered
    first.flush()
    second = MetricsWriter(tmp_path, "life-2")
    second.add("lifecycle", {"ts": 10.0, "event": "resume", "step": 10, "checkpoint_ts": 2.0})
    applied(second, 11.0, "after")
    second.flush()
    assert sorted(effective_applied(tmp_path)["message_id"].to_list()) == ["after", "before"]
