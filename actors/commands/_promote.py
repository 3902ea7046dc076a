"""``flywheel promote VERSION`` and ``flywheel rollback``: move what the serving generators run, by hand;
``flywheel gate pause|resume``: stop the gate from moving it, and let it again.

Both moves first read the run's spec (the copy its run.json keeps, :func:`run_roles`): a run with neither a gate nor
a serving generator (``follow: serving``) promotes nothing, and they say so instead of acting on the bus. A move by
hand pauses the run's gate (``--keep-gate``: not) — otherwise the gate, deciding on every new version, would replace
the operator's choice within seconds — until ``flywheel gate resume``. The pause lives in the decisions log, so it
outlasts a restart of the gate or a ``--resume`` of the run.
"""

from __future__ import annotations

import getpass
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import click


@dataclass(frozen=True)
class RunRoles:
    """The actors of a run's spec that promote, rollback and review act through (names; empty: none)."""

    gates: tuple[str, ...]
    serving: tuple[str, ...]  # generators with follow: serving (they run what is promoted)
    joiners: tuple[str, ...]
    reviewing: tuple[str, ...]  # joiners with review_fraction > 0 (they queue answers for `flywheel review`)


def run_roles(run_dir: Path) -> RunRoles | None:
    """What the run's spec (the copy in its run.json) declares; None when run.json keeps no spec or a block of it no
    longer validates (then nothing is concluded from it)."""
    from pydantic import ValidationError

    from actors.protocol import SERVING
    from topology import actor_kinds
    from topology._spec import ActorCommon
    from topology.runtime._rundir import read_run_info

    spec = read_run_info(run_dir).spec
    actors = spec.get("actors") if isinstance(spec, dict) else None
    if not isinstance(actors, dict):
        return None
    kinds = actor_kinds()
    found: dict[str, list[str]] = {"gate": [], "serving": [], "joiner": [], "reviewing": []}
    for name, block in actors.items():
        block = block if isinstance(block, dict) else {}
        kind = kinds.get(str(block.get("kind", name)))
        if kind is None or kind.name not in ("gate", "generator", "joiner"):
            continue
        try:
            config = kind.config.model_validate({k: v for k, v in block.items() if k not in ActorCommon.model_fields})
        except ValidationError:
            return None
        if kind.name == "gate":
            found["gate"].append(name)
        elif kind.name == "generator" and getattr(config, "follow", None) == SERVING:
            found["serving"].append(name)
        elif kind.name == "joiner":
            found["joiner"].append(name)
            if getattr(config, "review_fraction", 0) > 0:
                found["reviewing"].append(name)
    return RunRoles(*(tuple(found[role]) for role in ("gate", "serving", "joiner", "reviewing")))


def _promotes_nothing(run_dir: Path, roles: RunRoles | None) -> None:
    """ClickException when the run has neither a gate nor a serving generator: no version is ever promoted in it."""
    if roles is not None and not roles.gates and not roles.serving:
        raise click.ClickException(
            f"the run at {run_dir} has no gate and no serving generator (a generator with follow: serving), so no "
            "version is promoted in it: its generators run the learner's current version"
        )


_CONNECT_TIMEOUT_S = 10.0


async def connect_run(run_dir: Path, name: str) -> Any:
    """A Bus connected to the live run in ``run_dir``; ClickException (one line) when it is not live."""
    from topology.runtime import connect_run as connect_to
    from topology.runtime._rundir import read_run_info, supervisor_alive

    info = read_run_info(run_dir)
    if info.stopped_at is not None or not supervisor_alive(run_dir, info.pid):
        raise click.ClickException(  # a new `flywheel up` would start another run, not this one
            f"the run at {run_dir} is not running (continue it with: flywheel up --resume {run_dir})"
        )
    try:
        with anyio.fail_after(_CONNECT_TIMEOUT_S):
            return await connect_to(run_dir, name=name, info=info)
    except Exception as exc:  # the supervisor lives (checked above): the run goes on, its bus does not answer
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__  # a timeout's text is empty
        raise click.ClickException(
            f"cannot reach the run's bus at {info.bus_url}: no answer within {_CONNECT_TIMEOUT_S:g} s ({error}); "
            "the nats-server may be stopped, overloaded or restarting; try again"
        ) from None


def find_run_dir(where: Path | None, example: str) -> Path:
    """The run dir ``where`` names (default ``./runs/latest``); a one-line error with ``example`` (the command with a
    runs folder where its RUN_DIR goes) when there is none."""
    from topology.runtime._rundir import RunNotFound, find_run

    try:
        return find_run(where, example)
    except RunNotFound as exc:
        raise click.ClickException(str(exc)) from None


def _who() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli"


async def _current(bus: Any) -> Any:
    """The learner's newest version's manifest; ClickException when it published none yet."""
    from actors.protocol import CURRENT, weights_bucket
    from actors.weights import WeightManifest

    raw = await bus.kv_get(weights_bucket(bus.topology), CURRENT)
    if not raw:
        raise click.ClickException("the learner has published no version yet")
    return WeightManifest.from_json(raw)


async def _manifest_for(bus: Any, run_dir: Path, version: int, roles: RunRoles | None) -> Any:
    import orjson

    from actors.protocol import CURRENT, SERVING, weights_bucket
    from actors.replay import decisions_path, read_decisions
    from actors.weights import WeightManifest

    bucket = weights_bucket(bus.topology)
    held: dict[str, int] = {}
    for key in (CURRENT, SERVING):
        raw = await bus.kv_get(bucket, key)
        if raw:
            manifest = WeightManifest.from_json(raw)
            if manifest.version == version:
                return manifest
            held[key] = manifest.version
    for entry in reversed(read_decisions(run_dir)):
        if entry.get("version") == version and "manifest" in entry:
            return WeightManifest.from_json(orjson.dumps(entry["manifest"]))
    now = ", ".join(f"{key} is v{number}" for key, number in held.items()) or "the learner has published none yet"
    if roles is not None and not roles.gates:
        why = "this run has no gate, so no other version is kept to promote"
    else:
        decisions = decisions_path(run_dir)
        why = (
            f"no version that served has that number (see {decisions}: only those that served are kept)"
            if decisions.is_file()
            else "the gate decided nothing yet"
        )
    raise click.ClickException(f"version {version} is not available ({now}): {why}")


@click.command()
@click.argument("version")
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--reason", default="manual promotion", show_default=True, help="Why (goes to the decisions log).")
@click.option(
    "--keep-gate",
    is_flag=True,
    help="Leave the gate as it is: not paused, it goes on promoting over this version (default: pause it).",
)
def promote(version: str, run_dir: Path | None, reason: str, keep_gate: bool) -> None:
    """Make VERSION (v3, 3, or current) the version the serving generators run, bypassing the gate.

    \b
    The version must be the learner's current one, the serving one, or one that served before and is
    still kept (the newest promoted ones and the gate's best); a version the gate held or rejected is
    not kept once the learner moves on. `current` takes the learner's newest version at the moment
    the command reads it (a small model's learner publishes several a second: a number read from
    `flywheel status` is gone by then).
    The gate promotes nothing over it until `flywheel gate resume` (unless --keep-gate).
    The move is logged in RUN_DIR/gate/decisions.jsonl; `flywheel rollback` undoes it.
    """
    digits = version.removeprefix("v")
    if not (digits.isascii() and digits.isdecimal()) and version != "current":  # isdigit() passes '²', int() not
        raise click.ClickException(f"expected a version like v3 or 3, or current, got {version!r}")
    where = find_run_dir(run_dir, f"flywheel promote {version} /srv/runs")
    roles = run_roles(where)
    _promotes_nothing(where, roles)

    async def main() -> dict[str, Any]:
        from actors.replay import promote as do_promote
        from actors.weights import WeightPayloadError

        bus = await connect_run(where, "flywheel-promote")
        try:
            manifest = (
                await _current(bus) if version == "current" else await _manifest_for(bus, where, int(digits), roles)
            )
            return await do_promote(bus, where, manifest, by=_who(), reason=reason, pause=_pauses(roles, keep_gate))
        except WeightPayloadError as exc:  # its weights were pruned, unpinned or their slot rewritten since
            raise click.ClickException(
                f"cannot promote {version}: {exc}. Promote a version the gate promoted lately, or the learner's "
                "newest one (flywheel promote current)"
            ) from None
        finally:
            await bus.close()

    entry = anyio.run(main, backend="asyncio")
    previous = entry.get("previous")
    was = "" if previous is None else " (it was already)" if previous == entry["version"] else f" (was v{previous})"
    click.echo(f"v{entry['version']} is now serving{was}{_paused_note(where, entry)}")


def _pauses(roles: RunRoles | None, keep_gate: bool) -> bool:
    return not keep_gate and (roles is None or bool(roles.gates))


def _paused_note(run_dir: Path, entry: dict[str, Any]) -> str:
    """What the gate does after ``entry``: paused by it, or — a move that left the gate alone (--keep-gate) — still
    paused by an earlier move, which --keep-gate does not undo (only `flywheel gate resume` does)."""
    if entry.get("gate") == "paused":
        return "; the gate promotes nothing over it until `flywheel gate resume`"
    from actors.replay import DecisionLog

    log = DecisionLog(run_dir)
    log.update()
    if log.paused is None:
        return ""
    return (
        f"; the gate is still paused ({_describe(log.paused)}): it promotes nothing over it until "
        "`flywheel gate resume`"
    )


@click.command()
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--keep-gate", is_flag=True, help="Leave the gate as it is: not paused, it goes on promoting (default: pause it)."
)
def rollback(run_dir: Path | None, keep_gate: bool) -> None:
    """Point the serving generators back at the version that served before the current one.

    A version whose kept copy was pruned since is gone past, to the one before it (the decision log says which). The
    gate promotes nothing over it until `flywheel gate resume` (unless --keep-gate).
    """
    where = find_run_dir(run_dir, "flywheel rollback /srv/runs")
    roles = run_roles(where)
    _promotes_nothing(where, roles)
    no_gate = roles is not None and not roles.gates

    async def main() -> dict[str, Any]:
        from actors.replay import rollback as do_rollback

        bus = await connect_run(where, "flywheel-rollback")
        try:
            return await do_rollback(bus, where, by=_who(), pause=_pauses(roles, keep_gate))
        except ValueError as exc:
            hint = " (this run has no gate: only `flywheel promote` moves what serves)" if no_gate else ""
            raise click.ClickException(f"{exc}{hint}") from None
        finally:
            await bus.close()

    entry = anyio.run(main, backend="asyncio")
    note = _paused_note(where, entry)
    click.echo(f"rolled back: v{entry['version']} is serving again (was v{entry['previous']}){note}")


@click.group()
def gate() -> None:
    """Pause the run's promotion gate, or let it decide again."""


def _gated_run(run_dir: Path | None, command: str) -> Path:
    where = find_run_dir(run_dir, f"flywheel gate {command} /srv/runs")
    roles = run_roles(where)
    if roles is not None and not roles.gates:
        raise click.ClickException(f"the run at {where} has no gate")
    return where


@gate.command()
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--reason", default="paused by hand", show_default=True, help="Why (goes to the decisions log).")
def pause(run_dir: Path | None, reason: str) -> None:
    """Stop the gate from promoting or rolling back: what serves now keeps serving (works on a stopped run too)."""
    from actors.replay import DecisionLog, pause_gate

    where = _gated_run(run_dir, "pause")
    log = DecisionLog(where)
    log.update()
    if log.paused is not None:
        click.echo(f"the gate is already paused ({_describe(log.paused)})")
        return
    pause_gate(where, by=_who(), reason=reason)
    click.echo("the gate is paused: it promotes and rolls back nothing until `flywheel gate resume`")


@gate.command()
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
def resume(run_dir: Path | None) -> None:
    """Let the gate decide again, from the next version the learner publishes."""
    from actors.replay import resume_gate

    where = _gated_run(run_dir, "resume")
    entry = resume_gate(where, by=_who())
    if entry is None:
        click.echo("the gate is not paused")
        return
    click.echo(f"the gate decides again from the next version ({entry['reason']})")


def _describe(entry: dict[str, Any]) -> str:
    what = f"{entry['action']} of v{entry['version']}" if "version" in entry else str(entry["action"])
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(entry.get("ts", 0))))
    return f"{what} by {entry.get('by', '?')} at {since}"


__all__ = ["RunRoles", "connect_run", "find_run_dir", "gate", "promote", "rollback", "run_roles"]
