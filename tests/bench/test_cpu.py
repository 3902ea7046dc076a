"""bench/_cpu.py: a run's CPU time by actor, read from real processes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench._cpu import CpuSampler, cores_by_actor, process_name


def test_process_name_is_the_actor_else_the_executable() -> None:
    replica = ["/usr/bin/python", "-m", "topology.runtime._child", "--actor", "learner", "--replica", "0"]
    assert process_name(replica) == "learner"
    assert process_name(["/work/.venv/bin/nats-server", "-c", "nats.conf"]) == "nats-server"
    assert process_name([]) == "?"


def test_cores_add_up_the_processes_of_one_name_over_the_span() -> None:
    readings = {10: ("generator", 3.0), 11: ("generator", 1.0), 12: ("learner", 6.0), -1: ("runtime", 0.5)}
    assert cores_by_actor(readings, 10.0) == pytest.approx({"learner": 0.6, "generator": 0.4, "runtime": 0.05})
    assert list(cores_by_actor(readings, 10.0)) == ["learner", "generator", "runtime"]  # largest first
    assert cores_by_actor(readings, 0.0) == {}


def test_a_busy_child_reads_about_one_core_and_an_idle_one_about_none() -> None:
    busy = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass"
    children = [
        subprocess.Popen([sys.executable, "-c", busy, "--actor", "busy"]),
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)", "--actor", "idle"]),
    ]
    try:
        with CpuSampler(interval_s=0.25) as sampler:
            time.sleep(2.5)
    finally:
        for child in children:
            child.kill()
            child.wait()
    cores = sampler.cores()
    # a core of its own at most; under a loaded machine it gets less, never nothing
    assert 0.2 < cores["busy"] <= 1.1
    assert cores["idle"] < 0.1
    assert "runtime" in cores
