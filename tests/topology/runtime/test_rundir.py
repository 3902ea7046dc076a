import os
from pathlib import Path

import pytest

from topology.runtime import RunInfo, RunLocked, RunNotFound, bus_token, find_run, read_run_info
from topology.runtime._rundir import (
    create_run_dir,
    lock_run_dir,
    resume_run_dir,
    run_token,
    supervisor_alive,
    write_run_info,
)


def info() -> RunInfo:
    return RunInfo(
        topology="t",
        bus_url="nats://127.0.0.1:1",
        pid=1,
        spec_path="/x.yaml",
        started_at=0.0,
        heartbeat_s=1.0,
        replicas={"a": 2},
    )


def test_run_dir_layout_and_latest_link(tmp_path: Path) -> None:
    run = create_run_dir(tmp_path, "demo", now=0.0)
    assert run.name.startswith("demo-") and len(run.name) == len("demo-YYYYmmdd-HHMMSS")
    assert {p.name for p in run.iterdir()} == {"logs", "state", "nats"}
    assert (tmp_path / "latest").resolve() == run.resolve()


def test_two_runs_in_the_same_second_get_distinct_dirs(tmp_path: Path) -> None:
    first = create_run_dir(tmp_path, "demo", now=0.0)
    second = create_run_dir(tmp_path, "demo", now=0.0)
    assert first != second and second.name == first.name + "-2"
    assert (tmp_path / "latest").resolve() == second.resolve()


def test_run_json_round_trips_and_find_run_follows_latest(tmp_path: Path) -> None:
    run = create_run_dir(tmp_path, "demo")
    write_run_info(run, info())
    assert read_run_info(run) == info()
    assert info().replica_keys() == [("a", 0), ("a", 1)]
    assert find_run(tmp_path) == run.resolve()
    assert find_run(run) == run


def test_find_run_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(RunNotFound, match="no run found at"):
        find_run(tmp_path)


def test_one_supervisor_per_run_dir_and_the_lock_dies_with_its_holder(tmp_path: Path) -> None:
    run = create_run_dir(tmp_path, "demo")
    held = lock_run_dir(run)
    try:
        with pytest.raises(RunLocked, match="is live"):
            lock_run_dir(run)
    finally:
        os.close(held)
    os.close(lock_run_dir(run))  # released: free again


def test_a_run_is_live_while_its_lock_is_held_whoever_has_its_pid_now(tmp_path: Path) -> None:
    """A run killed with ``kill -9`` (or a reboot) leaves a pid in run.json that another process may have by now: it
    read as live. The run dir's lock says it: held by a supervisor, dropped by the kernel when it dies."""
    run = create_run_dir(tmp_path, "demo")
    mine = os.getpid()  # a live process, but not the run's supervisor
    assert not supervisor_alive(run, mine), "no lock file yet"
    held = lock_run_dir(run)
    try:
        assert supervisor_alive(run, mine) and supervisor_alive(run, mine), "asking does not take the lock"
    finally:
        os.close(held)
    assert not supervisor_alive(run, mine)
    os.close(lock_run_dir(run))  # asking left nothing held


def test_the_run_token_is_private_and_stable(tmp_path: Path) -> None:
    run = create_run_dir(tmp_path, "demo")
    token = run_token(run)
    assert len(token) >= 32 and run_token(run) == token
    path = run / "nats" / "token"
    assert path.stat().st_mode & 0o777 == 0o600 and (run / "nats").stat().st_mode & 0o777 == 0o700
    assert bus_token(info_with(token_file=str(path))) == token


def test_resume_needs_a_run_json(tmp_path: Path) -> None:
    with pytest.raises(RunNotFound, match="not a run directory"):
        resume_run_dir(tmp_path)
    run = create_run_dir(tmp_path, "demo")
    write_run_info(run, info())
    assert resume_run_dir(run) == run.resolve()


def info_with(**fields: object) -> RunInfo:
    return RunInfo(**{**info().__dict__, **fields})  # type: ignore[arg-type]
