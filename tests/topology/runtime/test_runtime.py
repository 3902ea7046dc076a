"""crash_reason: the one line a crash warning quotes from a replica's log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from topology.runtime._runtime import crash_reason, disk_full, life_banner

TRACEBACK = """Traceback (most recent call last):
  File "/x/_policy.py", line 284, in read_safetensors
    raise StateDictError(f"no safetensors weights at {str(target)!r}")
actors.policy._policy.StateDictError: no safetensors weights at '/w/nope.safetensors'
"""


def test_crash_reason_is_the_last_lifes_exception_line_without_its_module(tmp_path: Path) -> None:
    log = tmp_path / "learner-0.log"
    log.write_text(life_banner("learner", 0, 0) + TRACEBACK + life_banner("learner", 0, 1) + "loading\n" + TRACEBACK)
    assert crash_reason(log) == "StateDictError: no safetensors weights at '/w/nope.safetensors'"


def test_a_life_without_a_traceback_has_no_reason(tmp_path: Path) -> None:
    log = tmp_path / "gateway-0.log"
    log.write_text(life_banner("gateway", 0, 0) + TRACEBACK + life_banner("gateway", 0, 1) + "INFO: Started server\n")
    assert crash_reason(log) is None, "an earlier life's exception is not this crash's reason"
    assert crash_reason(tmp_path / "missing.log") is None


def test_a_long_reason_is_cut_to_one_short_line(tmp_path: Path) -> None:
    log = tmp_path / "x-0.log"
    log.write_text("Traceback (most recent call last):\nValueError: " + "x" * 1000 + "\n")
    reason = crash_reason(log)
    assert reason is not None and len(reason) <= 160 and reason.endswith("…")


def test_a_traceback_handled_long_before_the_end_is_no_reason_but_a_last_error_line_is(tmp_path: Path) -> None:
    """A gateway logs a request's error with its traceback and goes on serving: if it dies later (killed, say), that
    old exception is not why. A child that exits on an error it logs (a spec no longer valid) says so instead."""
    log = tmp_path / "gateway-0.log"
    served = "".join(f"14:00:0{i % 10} [info     ] served request_id=r{i}\n" for i in range(20))
    log.write_text(life_banner("gateway", 0, 0) + TRACEBACK + served)
    assert crash_reason(log) is None
    log.write_text(life_banner("gateway", 0, 0) + served + "14:01:00 [error    ] spec no longer valid errors='x'\n")
    assert crash_reason(log) == "spec no longer valid errors='x'"


def test_a_crash_on_a_full_disk_says_the_disk_is_full(tmp_path: Path, monkeypatch: Any) -> None:
    """A replica that crashed on a full disk left a log cut short (no exception line to quote) and the supervisor
    named no cause; the crash now says the disk holding the run dir is full when it is (under 1 MiB and 0.5 % free)."""
    import shutil

    from topology.runtime import _runtime

    def usage(free: int, total: int = 40 << 20) -> Any:
        return lambda path: shutil._ntuple_diskusage(total, total - free, free)  # type: ignore[attr-defined]

    monkeypatch.setattr(_runtime.shutil, "disk_usage", usage(12 * 1024))
    assert disk_full(tmp_path) == f"the disk holding {tmp_path} is full (12 KiB free)"
    monkeypatch.setattr(_runtime.shutil, "disk_usage", usage(300 * 1024))  # under 1 MiB, but 0.7 % of 40 MiB
    assert disk_full(tmp_path) is None
    monkeypatch.setattr(_runtime.shutil, "disk_usage", usage(3 << 30, total=2 << 40))  # 3 GiB of 2 TiB: not full
    assert disk_full(tmp_path) is None
