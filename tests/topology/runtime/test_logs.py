"""Replica logs rotated in place while a process appends to them: bounded, in order, no line twice, no hole."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from topology.runtime._logs import rotate

WRITER = """
import sys, time
with open(sys.argv[1], "ab", buffering=0) as log:  # as the supervisor opens a replica's log: O_APPEND
    for i in range(int(sys.argv[2])):
        log.write(f"line {i:06d} ".encode() + b"x" * 80 + b"\\n")
        if i % 50 == 0:
            time.sleep(0.001)
"""


def test_a_log_written_while_it_is_rotated_stays_bounded_and_in_order(tmp_path: Path) -> None:
    log = tmp_path / "tally-0.log"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log), "20000"])
    rotations = 0
    try:
        while writer.poll() is None:
            rotations += rotate(log, max_bytes=64 * 1024, keep=3)
            time.sleep(0.01)
    finally:
        writer.wait(30)
    assert writer.returncode == 0 and rotations > 3
    copies = sorted(tmp_path.glob("tally-0.log.*"), key=lambda p: -int(p.suffix[1:]))
    assert [p.name for p in copies] == ["tally-0.log.3", "tally-0.log.2", "tally-0.log.1"]
    lines: list[str] = []
    for path in [*copies, log]:
        text = path.read_bytes()
        assert not text.startswith(b"\0")  # the writer went on at the start of the emptied file, not past a hole
        lines += [line.split()[1] for line in text.decode().splitlines()]
    numbers = [int(n) for n in lines]
    assert numbers == sorted(set(numbers))  # in order, none twice
    assert numbers[-1] == 19_999
    assert not rotate(log, max_bytes=64 * 1024 * 1024, keep=3)  # under the limit: left alone
