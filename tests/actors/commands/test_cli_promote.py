"""`flywheel promote` / `rollback` / `review` on a run whose spec has no gate, serving generator or joiner: they say
so (from the spec copy in run.json) instead of pointing at files and queues such a run never has; on a version
whose weights are gone they say that, in one line."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
import torch
from click.testing import CliRunner

from actors.commands._promote import run_roles
from actors.replay import promote, serving_manifest
from actors.weights import SafetensorsDirTransport
from tests.conftest import fresh_topology
from topology.bus import Bus, EmbeddedNats
from topology.cli import main
from topology.runtime._rundir import RunInfo, read_run_info, write_run_info

TRAINING = {
    "source": {},
    "generator": {"resources": {"num_cpus": 0.5}},
    "verify": {},
    "learner": {"lr": 0.001},
}
SERVICE = {
    **TRAINING,
    "serving": {"kind": "generator", "consumes": [], "publishes": [], "serve": True, "follow": "serving"},
    "gateway": {},
    "joiner": {"review_fraction": 0.05},
    "recorder": {},
    "gate": {"threshold": 0.03},
}

LiveRun = Callable[[Path], Path]  # the `live_run` fixture


async def _serving_version(url: str, topology: str) -> int:
    async with await Bus.connect(url, topology=topology, name="test") as bus:
        manifest = await serving_manifest(bus)
        assert manifest is not None
        return manifest.version


def _run(tmp_path: Path, actors: dict[str, Any] | None, *, bus_url: str = "nats://127.0.0.1:1") -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    spec = None if actors is None else {"name": "t", "policy": {"model": "builtin:tiny-gpt"}, "actors": actors}
    info = RunInfo(fresh_topology(), bus_url, os.getpid(), str(tmp_path / "gone.yaml"), time.time(), 1.0, spec=spec)
    write_run_info(run_dir, info)
    return run_dir


def test_run_roles_reads_the_spec_copy(tmp_path: Path) -> None:
    roles = run_roles(_run(tmp_path, SERVICE))
    assert roles is not None
    assert (roles.gates, roles.serving, roles.joiners, roles.reviewing) == (
        ("gate",),
        ("serving",),
        ("joiner",),
        ("joiner",),
    )
    assert run_roles(_run(tmp_path / "old", None)) is None, "a run.json without a spec concludes nothing"


@pytest.mark.parametrize("command", [["promote", "v7"], ["rollback"]])
def test_promote_and_rollback_say_the_run_promotes_nothing(tmp_path: Path, command: list[str]) -> None:
    run_dir = _run(tmp_path, TRAINING)
    result = CliRunner().invoke(main, [*command, str(run_dir)])
    assert result.exit_code == 1
    assert "has no gate and no serving generator (a generator with follow: serving)" in result.output
    assert "decisions.jsonl" not in result.output and "nothing is serving yet" not in result.output


@pytest.mark.parametrize("command", [["promote", "v7"], ["rollback"], ["gate", "pause"], ["review"], ["status"]])
def test_without_a_run_here_the_hint_works_for_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """Run outside the run's folder, every command says how to name the run — in a way it takes (a run folder as its
    argument), not an option only ``status`` has."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 1
    assert "no run found" in result.output and "--run-dir" not in result.output, result.output


@pytest.mark.parametrize("command", [["promote", "current"], ["rollback"], ["review", "--wait", "0"]])
def test_a_stopped_run_is_continued_with_resume_not_a_new_up(tmp_path: Path, command: list[str]) -> None:
    """On a stopped run these said 'start it with flywheel up', which starts another run (and moves runs/latest)
    that the command, given this run's folder, still could not reach."""
    run_dir = _run(tmp_path, SERVICE)
    info = read_run_info(run_dir)
    info.stopped_at, info.exit = time.time(), "ok"
    write_run_info(run_dir, info)
    result = CliRunner().invoke(main, [*command, str(run_dir)])
    assert result.exit_code == 1
    assert f"is not running (continue it with: flywheel up --resume {run_dir})" in result.output, result.output


@pytest.mark.parametrize("command", [["promote", "current"], ["rollback"], ["review", "--wait", "0"]])
def test_a_killed_run_whose_pid_another_process_has_now_is_not_running(tmp_path: Path, command: list[str]) -> None:
    """After a ``kill -9`` of the supervisor (or a reboot) its pid may belong to another process: these commands
    took the run for live and failed on its bus. No supervisor holds the run dir's lock: it is not running."""
    run_dir = _run(tmp_path, SERVICE)  # run.json names this test's process, which holds no lock on it
    result = CliRunner().invoke(main, [*command, str(run_dir)])
    assert result.exit_code == 1
    assert f"is not running (continue it with: flywheel up --resume {run_dir})" in result.output, result.output


def test_a_frozen_bus_is_said_to_not_answer(tmp_path: Path, live_run: LiveRun) -> None:
    """With the run's nats-server stopped (SIGSTOP) promote, rollback and review (one connect_run) said "cannot reach
    the run's bus at nats://…: " and nothing more (a timeout's text is empty); they say what happened and what to
    do, as `status` does."""
    with EmbeddedNats(tmp_path / "nats") as server:
        url = server.url
        run_dir = live_run(_run(tmp_path, SERVICE, bus_url=url))
        os.kill(server.pid, signal.SIGSTOP)
        try:
            result = CliRunner().invoke(main, ["promote", "current", str(run_dir)])
        finally:
            os.kill(server.pid, signal.SIGCONT)
    assert result.exit_code == 1, result.output
    error = result.output.strip().splitlines()[-1]
    assert error.startswith(f"Error: cannot reach the run's bus at {url}: no answer within 10 s"), error
    assert error.endswith("the nats-server may be stopped, overloaded or restarting; try again"), error


@pytest.mark.parametrize("version", ["²", "v²", "v1²", "v"])
def test_a_version_that_is_not_a_number_is_a_one_line_error(tmp_path: Path, version: str) -> None:
    """`flywheel promote ²` passed the check (str.isdigit accepts superscripts) and int() raised a traceback."""
    run_dir = _run(tmp_path, SERVICE)
    result = CliRunner().invoke(main, ["promote", version, str(run_dir)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.output.strip() == f"Error: expected a version like v3 or 3, or current, got {version!r}"


def test_promote_without_a_gate_names_what_can_be_promoted(
    embedded_nats: EmbeddedNats, tmp_path: Path, live_run: LiveRun
) -> None:
    actors = {**TRAINING, "serving": SERVICE["serving"]}
    run_dir = live_run(_run(tmp_path, actors, bus_url=embedded_nats.url))
    result = CliRunner().invoke(main, ["promote", "v7", str(run_dir)])
    assert result.exit_code == 1, result.output
    assert "version 7 is not available" in result.output and "this run has no gate" in result.output
    assert "decisions.jsonl" not in result.output


@pytest.mark.parametrize(
    ("joiner", "says"),
    [(None, "it has no joiner"), ({"review_fraction": 0}, "review_fraction is 0 on its joiner 'joiner'")],
)
def test_review_says_the_run_queues_nothing(tmp_path: Path, joiner: dict[str, Any] | None, says: str) -> None:
    run_dir = _run(tmp_path, {**TRAINING, **({"joiner": joiner} if joiner is not None else {})})
    result = CliRunner().invoke(main, ["review", str(run_dir), "--wait", "0"])
    assert result.exit_code == 1
    assert f"nothing to review in the run at {run_dir}: {says}" in result.output
    assert "review queue empty" not in result.output


def test_promote_and_rollback_refuse_a_version_whose_pinned_copy_is_gone(
    embedded_nats: EmbeddedNats, tmp_path: Path, live_run: LiveRun
) -> None:
    """A promoted version's pinned copy is removed once it is neither among the newest promoted ones nor the gate's
    best: moving ``serving`` back at it would leave the serving generators nothing to load (and the gate, comparing
    against it, nothing to replay). Both commands say so in one line and change nothing."""
    run_dir = live_run(_run(tmp_path, SERVICE, bus_url=embedded_nats.url))
    topology = read_run_info(run_dir).topology

    async def promote_two() -> None:
        transport = SafetensorsDirTransport(run_dir / "weights")
        async with await Bus.connect(embedded_nats.url, topology=topology, name="test") as bus:
            for version in (1, 2):
                manifest = await transport.put(version, {"w": torch.full((4,), float(version))})
                await promote(bus, run_dir, manifest, by="test", reason="setup")

    anyio.run(promote_two)
    shutil.rmtree(run_dir / "weights" / "serving-v1")  # unpinned since
    for command, said in ((["promote", "v1"], "serving-v1 is gone"), (["rollback"], "kept any more (v1 pruned)")):
        result = CliRunner().invoke(main, [*command, str(run_dir)])
        assert result.exit_code == 1, result.output
        assert said in result.output and "Traceback" not in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert anyio.run(_serving_version, embedded_nats.url, topology) == 2


def test_a_rollback_goes_past_an_earlier_version_whose_copy_is_gone(
    embedded_nats: EmbeddedNats, tmp_path: Path, live_run: LiveRun
) -> None:
    """After several moves the version served before the current one may be pruned while an earlier one is kept:
    `flywheel rollback` stopped at the pruned one ("its copy is gone") although it could go back further."""
    run_dir = live_run(_run(tmp_path, SERVICE, bus_url=embedded_nats.url))
    topology = read_run_info(run_dir).topology

    async def promote_three() -> None:
        transport = SafetensorsDirTransport(run_dir / "weights")
        async with await Bus.connect(embedded_nats.url, topology=topology, name="test") as bus:
            for version in (1, 2, 3):
                manifest = await transport.put(version, {"w": torch.full((4,), float(version))})
                await promote(bus, run_dir, manifest, by="test", reason="setup")

    anyio.run(promote_three)
    shutil.rmtree(run_dir / "weights" / "serving-v2")  # unpinned since
    result = CliRunner().invoke(main, ["rollback", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert anyio.run(_serving_version, embedded_nats.url, topology) == 1
    last = orjson.loads((run_dir / "gate" / "decisions.jsonl").read_text().splitlines()[-1])
    assert last["action"] == "rollback" and last["version"] == 1 and "past v2 (pruned)" in last["reason"], last


def test_promotions_keep_the_gates_best_version_pinned(embedded_nats: EmbeddedNats, tmp_path: Path) -> None:
    """The gate's best version (``best_version`` in its decisions) is what no later version may fall below: however
    many versions are promoted after it, by the gate or by hand, its pinned copy stays."""
    from actors.replay import record
    from actors.replay._promote import KEEP_PINNED

    run_dir = _run(tmp_path, SERVICE, bus_url=embedded_nats.url)
    topology = read_run_info(run_dir).topology

    async def promote_many() -> None:
        transport = SafetensorsDirTransport(run_dir / "weights", keep_versions=100)
        async with await Bus.connect(embedded_nats.url, topology=topology, name="test") as bus:
            for version in range(1, KEEP_PINNED + 4):
                manifest = await transport.put(version, {"w": torch.full((4,), float(version))})
                await promote(bus, run_dir, manifest, by="cli:test", reason="by hand")
                if version == 1:
                    record(run_dir, {"action": "hold", "version": 1, "by": "gate", "best_version": 1})

    anyio.run(promote_many)
    pinned = sorted(int(p.name.removeprefix("serving-v")) for p in (run_dir / "weights").glob("serving-v*"))
    assert pinned == [1, *range(4, KEEP_PINNED + 4)], pinned  # the best, and the newest KEEP_PINNED


def test_promote_current_takes_the_learners_newest_version(
    embedded_nats: EmbeddedNats, tmp_path: Path, live_run: LiveRun
) -> None:
    """A small model's learner publishes several versions a second: `promote current` reads the newest one itself
    (a number read from `flywheel status` is gone by the time a command starts)."""
    from actors.weights import WeightPublisher

    run_dir = live_run(_run(tmp_path, SERVICE, bus_url=embedded_nats.url))
    topology = read_run_info(run_dir).topology

    async def publish() -> None:
        async with await Bus.connect(embedded_nats.url, topology=topology, name="test") as bus:
            publisher = WeightPublisher(bus, topology, SafetensorsDirTransport(run_dir / "weights"))
            for version in (1, 2, 3):
                await publisher.publish(version, {"w": torch.full((4,), float(version))})

    anyio.run(publish)
    result = CliRunner().invoke(main, ["promote", "current", "--keep-gate", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "v3 is now serving"

    assert anyio.run(_serving_version, embedded_nats.url, topology) == 3


def test_a_move_by_hand_pauses_the_gate_until_it_is_resumed(
    embedded_nats: EmbeddedNats, tmp_path: Path, live_run: LiveRun
) -> None:
    """The gate decides on every new version (about one a second in the service spec): after `promote` or `rollback`
    by hand it would replace the operator's choice within seconds, so a move by hand pauses it (the pause is a line
    of the decisions log; `tests/actors/gate/test_pause.py` shows the gate keeping to it) until `gate resume`."""
    from actors.replay import DecisionLog
    from actors.weights import WeightPublisher

    run_dir = live_run(_run(tmp_path, SERVICE, bus_url=embedded_nats.url))
    topology = read_run_info(run_dir).topology

    async def publish(versions: tuple[int, ...] = (1, 2)) -> None:
        async with await Bus.connect(embedded_nats.url, topology=topology, name="test") as bus:
            publisher = WeightPublisher(bus, topology, SafetensorsDirTransport(run_dir / "weights"))
            for version in versions:
                await publisher.publish(version, {"w": torch.full((4,), float(version))})

    def flywheel(*args: str) -> str:
        result = CliRunner().invoke(main, [*args, str(run_dir)])
        assert result.exit_code == 0, result.output
        return result.output.strip()

    def paused() -> dict[str, Any] | None:
        log = DecisionLog(run_dir)
        log.update()
        return log.paused

    anyio.run(publish)
    until = "the gate promotes nothing over it until `flywheel gate resume`"
    assert flywheel("promote", "current", "--keep-gate") == "v2 is now serving" and paused() is None
    assert flywheel("promote", "v2") == f"v2 is now serving (it was already); {until}"
    pause = paused()
    assert pause is not None and (pause["action"], pause["version"]) == ("promote", 2)
    assert flywheel("gate", "pause").startswith("the gate is already paused (promote of v2 by cli")
    assert flywheel("gate", "resume").startswith("the gate decides again from the next version (ends the pause of")
    assert paused() is None and flywheel("gate", "resume") == "the gate is not paused"
    assert flywheel("gate", "pause", "--reason", "incident 42").startswith("the gate is paused")
    assert paused() is not None and paused()["reason"] == "incident 42"  # type: ignore[index]
    assert anyio.run(_serving_version, embedded_nats.url, topology) == 2
    # --keep-gate leaves a paused gate paused (only `gate resume` ends a pause), and says so
    anyio.run(publish, (3,))
    moved = flywheel("promote", "current", "--keep-gate")
    assert moved.startswith("v3 is now serving (was v2); the gate is still paused (pause by cli:"), moved
    assert moved.endswith("): it promotes nothing over it until `flywheel gate resume`")
    assert paused() is not None and paused()["reason"] == "incident 42"  # type: ignore[index]
    back = flywheel("rollback", "--keep-gate")
    assert back.startswith("rolled back: v2 is serving again (was v3); the gate is still paused (pause by cli:"), back


def test_gate_commands_on_a_run_without_a_gate_say_so(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, TRAINING)
    for command in (["gate", "pause"], ["gate", "resume"]):
        result = CliRunner().invoke(main, [*command, str(run_dir)])
        assert result.exit_code == 1 and f"the run at {run_dir} has no gate" in result.output, result.output


def test_without_a_run_each_command_shows_where_its_run_dir_goes(tmp_path: Path, monkeypatch: Any) -> None:
    """With no ./runs here, every command's hint read "e.g. flywheel status /srv/runs": for `promote` the run dir
    comes after the version, and `flywheel promote /srv/runs` fails on the version."""
    monkeypatch.chdir(tmp_path)
    for args, example in (
        (["promote", "v3"], "flywheel promote v3 /srv/runs"),
        (["rollback"], "flywheel rollback /srv/runs"),
        (["gate", "pause"], "flywheel gate pause /srv/runs"),
        (["gate", "resume"], "flywheel gate resume /srv/runs"),
        (["review"], "flywheel review /srv/runs"),
        (["status"], "flywheel status /srv/runs"),
    ):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1 and "no run found: ./runs/latest does not exist here" in result.output, args
        assert result.output.rstrip().endswith(f"e.g. {example}"), result.output
