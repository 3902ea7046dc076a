"""``flywheel promote VERSION`` and ``flywheel rollback``: move what the serving generators run, by hand."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any

import anyio
import click


async def connect_run(run_dir: Path, name: str) -> Any:
    """A Bus connected to the live run in ``run_dir``; ClickException (one line) when it is not live."""
    from topology.runtime import connect_run as connect_to
    from topology.runtime._rundir import pid_alive, read_run_info

    info = read_run_info(run_dir)
    if info.stopped_at is not None or not pid_alive(info.pid):
        raise click.ClickException(f"the run at {run_dir} is not running (start it with flywheel up)")
    try:
        with anyio.fail_after(10):
            return await connect_to(run_dir, name=name, info=info)
    except Exception as exc:
        raise click.ClickException(f"cannot reach the run's bus at {info.bus_url}: {exc}") from None


def find_run_dir(where: Path | None) -> Path:
    from topology.runtime._rundir import RunNotFound, find_run

    try:
        return find_run(where)
    except RunNotFound as exc:
        raise click.ClickException(str(exc)) from None


def _who() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli"


async def _manifest_for(bus: Any, run_dir: Path, version: int) -> Any:
    import orjson

    from actors.protocol import CURRENT, SERVING, weights_bucket
    from actors.replay import read_decisions
    from actors.weights import WeightManifest

    bucket = weights_bucket(bus.topology)
    for key in (CURRENT, SERVING):
        raw = await bus.kv_get(bucket, key)
        if raw:
            manifest = WeightManifest.from_json(raw)
            if manifest.version == version:
                return manifest
    for entry in reversed(read_decisions(run_dir)):
        if entry.get("version") == version and "manifest" in entry:
            return WeightManifest.from_json(orjson.dumps(entry["manifest"]))
    raise click.ClickException(
        f"version {version} is not available: it is neither current nor serving, and "
        f"the gate never saw it (see {run_dir / 'gate' / 'decisions.jsonl'})"
    )


@click.command()
@click.argument("version")
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--reason", default="manual promotion", show_default=True, help="Why (goes to the decisions log).")
def promote(version: str, run_dir: Path | None, reason: str) -> None:
    """Make VERSION (v3 or 3) the version the serving generators run, bypassing the gate.

    \b
    The version must be the learner's current one, the serving one, or one the gate decided on.
    The move is logged in RUN_DIR/gate/decisions.jsonl; `flywheel rollback` undoes it.
    """
    digits = version.removeprefix("v")
    if not digits.isdigit():
        raise click.ClickException(f"expected a version like v3 or 3, got {version!r}")
    where = find_run_dir(run_dir)

    async def main() -> dict[str, Any]:
        from actors.replay import promote as do_promote

        bus = await connect_run(where, "flywheel-promote")
        try:
            manifest = await _manifest_for(bus, where, int(digits))
            return await do_promote(bus, where, manifest, by=_who(), reason=reason)
        finally:
            await bus.close()

    entry = anyio.run(main, backend="asyncio")
    was = f" (was v{entry['previous']})" if entry.get("previous") is not None else ""
    click.echo(f"v{entry['version']} is now serving{was}")


@click.command()
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
def rollback(run_dir: Path | None) -> None:
    """Point the serving generators back at the version that served before the current one."""
    where = find_run_dir(run_dir)

    async def main() -> dict[str, Any]:
        from actors.replay import rollback as do_rollback

        bus = await connect_run(where, "flywheel-rollback")
        try:
            return await do_rollback(bus, where, by=_who())
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            await bus.close()

    entry = anyio.run(main, backend="asyncio")
    click.echo(f"rolled back: v{entry['version']} is serving again (was v{entry['previous']})")


__all__ = ["connect_run", "find_run_dir", "promote", "rollback"]
