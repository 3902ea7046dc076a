"""Compaction of the learner's metrics parts: fewer files, the same rows in the same order, whatever kills it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from actors.learner import MetricsWriter, read_metrics
from actors.learner._parts import compact, live_parts

ROOT = Path(__file__).resolve().parents[3]


def write_parts(run_dir: Path, incarnation: str, flushes: int, *, start: int = 0) -> MetricsWriter:
    """``flushes`` flushes of a step row and two applied rows each (the applied rows' columns vary, as they may)."""
    writer = MetricsWriter(run_dir, incarnation)
    for i in range(start, start + flushes):
        writer.add("step", {"ts": float(i), "step": i, "loss": 0.5 / (i + 1)})
        writer.add("applied", {"ts": float(i), "step": i, "message_id": f"{incarnation}-a{i}"})
        extra = {"origin": "feedback"} if i % 3 == 0 else {}
        writer.add("applied", {"ts": float(i), "step": i, "message_id": f"{incarnation}-b{i}", **extra})
        writer.flush()
    return writer


def frames(run_dir: Path) -> dict[str, pl.DataFrame]:
    return {kind: read_metrics(run_dir, kind) for kind in ("step", "applied")}


def files(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "metrics").glob("*.parquet"))


def test_compaction_keeps_every_row_in_order_in_a_number_of_files_that_grows_with_the_log(tmp_path: Path) -> None:
    plain, compacted = tmp_path / "plain", tmp_path / "compacted"
    write_parts(plain, "0001-1-aa", 200)
    writer = MetricsWriter(compacted, "0001-1-aa")
    for i in range(200):  # the learner's rhythm: a flush, then a compaction
        writer.add("step", {"ts": float(i), "step": i, "loss": 0.5 / (i + 1)})
        writer.add("applied", {"ts": float(i), "step": i, "message_id": f"0001-1-aa-a{i}"})
        extra = {"origin": "feedback"} if i % 3 == 0 else {}
        writer.add("applied", {"ts": float(i), "step": i, "message_id": f"0001-1-aa-b{i}", **extra})
        writer.flush()
        writer.compact(fan_in=4)

    expected, got = frames(plain), frames(compacted)
    for kind in expected:
        assert_frame_equal(got[kind], expected[kind])
    assert len(files(plain)) == 400
    # 200 parts a kind at 4 per merge: at most 3 of each level (levels 0..3) remain
    assert len(files(compacted)) <= 2 * 3 * 4
    assert {part.level for part in live_parts(compacted / "metrics", "step")} >= {3}


def test_parts_numbered_past_five_digits_are_read_in_the_order_they_were_written(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path, "0001-1-aa")
    writer._parts = 99_998  # a learner that has run for days (a part every few seconds)
    for i in range(4):
        writer.add("step", {"ts": float(i), "step": i})
        writer.flush()
    assert read_metrics(tmp_path, "step")["step"].to_list() == [0, 1, 2, 3]
    writer.compact(fan_in=2)
    assert read_metrics(tmp_path, "step")["step"].to_list() == [0, 1, 2, 3]


def test_every_life_of_the_learner_is_compacted_apart_and_read_in_order(tmp_path: Path) -> None:
    plain, compacted = tmp_path / "plain", tmp_path / "compacted"
    for run_dir in (plain, compacted):
        write_parts(run_dir, "0001-1-aa", 9)
        write_parts(run_dir, "0002-7-bb", 10, start=9)
    # the second life compacts the first life's parts too (nothing writes them any more)
    MetricsWriter(compacted, "0002-7-bb").compact(fan_in=3)

    expected, got = frames(plain), frames(compacted)
    for kind in expected:
        assert_frame_equal(got[kind], expected[kind])
    incarnations = {part.incarnation for part in live_parts(compacted / "metrics", "applied") if part.level > 0}
    assert incarnations == {"0001-1-aa", "0002-7-bb"}


def test_a_merge_whose_sources_were_not_deleted_yet_is_read_once_and_its_sources_removed_later(tmp_path: Path) -> None:
    """The state a kill between a merge's rename and the deletion of its sources leaves."""
    write_parts(tmp_path, "0001-1-aa", 6)
    expected = frames(tmp_path)
    saved = tmp_path / "saved"
    shutil.copytree(tmp_path / "metrics", saved)
    compact(tmp_path / "metrics", fan_in=3)
    for path in saved.glob("*.parquet"):  # the sources back beside their merges
        shutil.copy(path, tmp_path / "metrics" / path.name)

    for kind, frame in frames(tmp_path).items():
        assert_frame_equal(frame, expected[kind])
    compact(tmp_path / "metrics", fan_in=3)
    assert not any(part.level == 0 for part in live_parts(tmp_path / "metrics", "step"))
    assert len(files(tmp_path)) == 4  # two merges a kind: the leftover sources are gone
    for kind, frame in frames(tmp_path).items():
        assert_frame_equal(frame, expected[kind])


COMPACT_FOREVER = """
import sys, time
from pathlib import Path
from actors.learner._parts import compact
while True:
    compact(Path(sys.argv[1]), fan_in=2)
    time.sleep(0.001)
"""


@pytest.mark.timeout(120)
def test_a_sigkill_during_compaction_neither_loses_nor_repeats_a_row(tmp_path: Path) -> None:
    """Kill -9 a compacting process at many moments; after each kill, and after the compaction it left half done is
    finished, the rows read back are exactly the rows written."""
    run_dir = tmp_path / "run"
    write_parts(run_dir, "0001-1-aa", 64)
    expected = frames(run_dir)
    script = tmp_path / "compact_forever.py"
    script.write_text(COMPACT_FOREVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for round_ in range(10):
        fresh = tmp_path / f"round-{round_}"
        shutil.copytree(run_dir, fresh)
        proc = subprocess.Popen([sys.executable, str(script), str(fresh / "metrics")], env=env)
        deadline = time.monotonic() + 60
        while not any("-L" in name for name in os.listdir(fresh / "metrics")):  # the first merge is in
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.001)
        time.sleep(0.003 * round_)  # then a little further into the merges each round
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert len(files(fresh)) > 2  # killed part-way: the merges were not all done
        for kind, frame in frames(fresh).items():
            assert_frame_equal(frame, expected[kind])
        compact(fresh / "metrics", fan_in=2)
        assert not list((fresh / "metrics").glob(".*.tmp"))
        for kind, frame in frames(fresh).items():
            assert_frame_equal(frame, expected[kind])
        assert len(files(fresh)) == 2  # 64 parts a kind at 2 a merge: one part of level 6 each


@pytest.mark.timeout(120)
def test_a_reader_during_compaction_reads_every_row_once(tmp_path: Path) -> None:
    write_parts(tmp_path, "0001-1-aa", 3)
    writer = MetricsWriter(tmp_path, "0001-1-aa")
    writer._parts = 100
    heights: list[int] = []
    done = threading.Event()

    def write_and_compact() -> None:
        for i in range(3, 300):
            writer.add("applied", {"ts": float(i), "step": i, "message_id": f"m{i}"})
            writer.flush()
            writer.compact(fan_in=2)
        done.set()

    thread = threading.Thread(target=write_and_compact)
    thread.start()
    while not done.is_set():
        applied = read_metrics(tmp_path, "applied")
        heights.append(applied.height)
        assert applied["message_id"].n_unique() == applied.height  # no row twice
    thread.join()
    assert heights == sorted(heights)  # no row missing from a later read that an earlier one had
    assert len(heights) > 1 and heights[-1] <= read_metrics(tmp_path, "applied").height == 6 + 297
