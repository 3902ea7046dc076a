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
