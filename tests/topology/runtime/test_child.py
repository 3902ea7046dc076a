"""The replica process entry: torch threads from num_cpus, and no torch import by the runtime itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

from topology.runtime._threads import size_torch, thread_env


def test_runtime_and_cli_do_not_import_torch() -> None:
    code = "import sys, topology.runtime, topology.runtime._child, topology.cli._up; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_thread_env_rounds_num_cpus_up_and_never_below_one() -> None:
    assert thread_env(0.5)["OMP_NUM_THREADS"] == "1"
    assert thread_env(0)["MKL_NUM_THREADS"] == "1"
    assert thread_env(2)["OMP_NUM_THREADS"] == "2"
    assert thread_env(1.5)["OMP_NUM_THREADS"] == "2"


def test_torch_threads_are_sized_from_num_cpus() -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        assert size_torch(0.5) == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
