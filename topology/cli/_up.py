"""``flywheel up`` (run a topology, supervised) and ``flywheel status`` (what every replica is doing).

Contract: ``up`` validates the spec first (every issue printed as ``file:line:col: path: message``, exit 1),
prints the run dir and bus URL (a replica's ``url`` and ``api_key_file`` once it reports them: a gateway's), serves
every replica's heartbeat as Prometheus metrics when ``runtime.metrics_port`` is set (``topology.runtime._exporter``),
shows replica states while it runs (a live table on a terminal, a plain line every few seconds otherwise), and exits
0 after a clean stop, 1 when an actor exhausted its restarts or a replica in a crash loop was not running again when
the run was stopped (its last crash's exception line is in the final message).
``status`` finds a run (``./runs/latest`` by default), reads its heartbeats from the bus and prints the application's
live view (if it registered one) and a table, or ``--json``; it exits 1 with one sentence when no run is live.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import click

from topology.cli._logging import configure_logging

_STATE_STYLE = {
    "running": "green",
    "starting": "cyan",
    "draining": "yellow",
    "stopping": "yellow",
    "stopped": "dim",
    "restarting": "magenta",
    "crashed": "red",
    "failed": "bold red",
}


def _fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _fmt_counters(counters: dict[str, Any], limit: int = 5) -> str:
    parts = []
    for name in sorted(counters)[:limit]:
        value = counters[name]
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(f"{name}={shown}")
    more = len(counters) - limit
    return " ".join(parts) + (f" (+{more})" if more > 0 else "")


def _rows(
    records: list[Any], expected: list[tuple[str, int]], heartbeat_s: float, kinds: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """One row per expected replica, with the same keys whether it has reported yet or not (``kinds``: the run's
    actor → kind, for a replica that has not)."""
    now = time.time()
    by_key = {(r.actor, r.replica): r for r in records}
    rows: list[dict[str, Any]] = []
    for actor, replica in expected:
        r = by_key.get((actor, replica))
        if r is None:
            rows.append(
                {
                    "actor": actor,
                    "replica": replica,
                    "kind": (kinds or {}).get(actor),
                    "state": "pending",
                    "pid": None,
                    "restarts": 0,
                    "uptime_s": None,
                    "heartbeat_age_s": None,
                    "stale": False,
                    "counters": {},
                    "error": None,
                }
            )
            continue
        alive = r.state in ("starting", "running", "draining", "stopping")
        rows.append(
            {
                "actor": actor,
                "replica": replica,
                "kind": r.kind,
                "state": r.state,
                "pid": r.pid,
                "restarts": r.restarts,
                "uptime_s": round(now - r.started_at, 1) if alive else None,
                "heartbeat_age_s": round(r.age_s(now), 1),
                "stale": r.is_stale(heartbeat_s, now),
                "counters": r.counters,
                "error": r.error,
            }
        )
    return rows


def _bus_row(info: Any) -> list[dict[str, Any]]:
    """The embedded nats-server as a row beside the replicas (it is supervised like them); none for an external bus."""
    from topology.runtime._rundir import pid_alive

    if not info.nats_pid:
        return []
    up = pid_alive(info.nats_pid)
    return [
        {
            "actor": "nats-server",
            "replica": 0,
            "kind": "bus",
            "state": "running" if up else "restarting",
            "pid": info.nats_pid,
            "restarts": info.bus_restarts,
            "uptime_s": None,
            "heartbeat_age_s": None,
            "stale": False,
            "counters": {},
            "error": None,
        }
    ]


def _table(rows: list[dict[str, Any]], title: str | None = None) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in ("actor", "replica", "state", "pid", "restarts", "uptime", "heartbeat", "counters"):
        table.add_column(
            column, no_wrap=column != "counters", justify="right" if column in ("pid", "restarts") else "left"
        )
    for row in rows:
        state = row["state"]
        style = _STATE_STYLE.get(state, "")
        shown_state = f"[{style}]{state}[/]" if style else state
        age = row["heartbeat_age_s"]
        heartbeat = "—" if age is None else f"{age:.1f}s ago" + (" [bold red]STALE[/]" if row["stale"] else "")
        uptime = "—" if row["uptime_s"] is None else _fmt_duration(row["uptime_s"])
        counters = _fmt_counters(row["counters"]) or (row["error"] or "")
        table.add_row(
            row["actor"],
            str(row["replica"]),
            shown_state,
            str(row["pid"] or "—"),
            str(row["restarts"]),
            uptime,
            heartbeat,
            counters,
        )
    return table


_LOOK_TIMEOUT_S = 3.0  # the live view's look at the heartbeats: longer, and the bus is said not to answer


def _plain_line(rows: list[dict[str, Any]], elapsed_s: float) -> str:
    parts = []
    for row in rows:
        extra = f" r{row['restarts']}" if row["restarts"] else ""
        extra += " STALE" if row["stale"] else ""
        dead_lettered = (row["counters"] or {}).get("dead_lettered")
        extra += f" {dead_lettered} dead-lettered" if isinstance(dead_lettered, int) and dead_lettered else ""
        parts.append(f"{row['actor']}[{row['replica']}]={row['state']}{extra}")
    return f"[{_fmt_duration(elapsed_s)}] " + " ".join(parts)


def _new_urls(records: list[Any], announced: set[str]) -> list[str]:
    """``<actor>: <url>`` for each replica reporting a ``url`` (a gateway) that was not printed yet, and
    ``<actor>: API key in <file>`` for one reporting an ``api_key_file`` (a key it generated)."""
    lines = []
    for r in records:
        counters = r.counters if isinstance(r.counters, dict) else {}
        for name, template in (("url", "{}"), ("api_key_file", "API key in {}")):
            value = counters.get(name)
            if isinstance(value, str) and value not in announced:
                announced.add(value)
                lines.append(f"{r.actor + ':':<8} {template.format(value)}")
    return lines


def _live_view() -> Any:
    """The application's live view (`topology.register_live_view`), or None; one that fails to build is skipped."""
    from topology._registry import live_view, resolve

    target = live_view()
    if target is None:
        return None
    try:
        return resolve(target, "live view")()
    except Exception as exc:  # the view is decoration: the run goes on without it
        click.echo(f"flywheel: live view {target!r} unavailable: {exc}", err=True)
        return None


def _load_spec_or_exit(path: Path, *, starting: bool = False) -> Any:
    """The spec at ``path``, or its issues printed and exit 1; ``starting``: to run it here now (ports must be free)."""
    from topology import load_spec
    from topology._errors import SpecError
    from topology._registry import PluginError, load_plugins

    try:
        load_plugins()
        spec = load_spec(path, starting=starting)
    except PluginError as exc:
        raise click.ClickException(str(exc)) from None
    except SpecError as exc:
        for issue in exc.issues:
            click.echo(str(issue), err=True)
        count = len(exc.errors)
        click.echo(f"{path}: {count} error{'s' if count != 1 else ''}; nothing was started.", err=True)
        sys.exit(1)
    for warning in spec.warnings:
        click.echo(str(warning), err=True)
    return spec


async def _serve_metrics(runtime: Any) -> None:
    """The spec's Prometheus endpoint (``runtime.metrics_port``), fed every heartbeat until cancelled."""
    from topology.runtime._exporter import StatusExporter, export_statuses

    settings = runtime.spec.runtime
    exporter = StatusExporter(runtime.spec.name, heartbeat_s=settings.heartbeat_s)
    try:
        url = exporter.start(settings.metrics_host, settings.metrics_port)
    except OSError as exc:  # the port is taken: the run goes on without the endpoint
        click.echo(f"metrics: cannot listen on {settings.metrics_host}:{settings.metrics_port}: {exc}", err=True)
        return
    click.echo(f"metrics: {url}")
    try:
        await export_statuses(runtime, exporter)
    finally:
        exporter.close()


async def _up_main(runtime: Any, duration_s: float | None, interval_s: float) -> Any:
    from rich.console import Console
    from rich.live import Live

    console = Console()
    result: Any = None

    async def display() -> None:
        await runtime.started.wait()
        click.echo(f"run dir: {runtime.run_dir}")
        click.echo(f"bus:     {runtime.bus_url}")
        click.echo(f"status:  flywheel status {runtime.run_dir}")
        if runtime.spec.runtime.metrics_port is not None:
            tg.start_soon(_serve_metrics, runtime)
        began = time.monotonic()
        expected = runtime.replica_keys()
        heartbeat_s = runtime.spec.runtime.heartbeat_s

        view = _live_view()
        records: list[Any] = []
        announced: set[str] = set()
        bus_error = ""  # why the last look at the heartbeats failed ("" when it did not)

        async def current_rows() -> list[dict[str, Any]] | None:
            nonlocal records, bus_error
            if runtime.stopping:
                return None  # the bus is going away with the run: stop drawing
            try:
                with anyio.fail_after(_LOOK_TIMEOUT_S):  # a frozen bus: say so at the next look, not minutes later
                    records = await runtime.statuses()
                bus_error = ""
                for line in _new_urls(records, announced):  # a gateway's URL, once it listens
                    click.echo(line)
                info = runtime.session.info
                return _rows(records, expected, heartbeat_s, info.kinds) + _bus_row(info)
            except Exception as exc:  # a bus hiccup must not take the run down with it; old figures are not shown
                records = []
                bus_error = f"{type(exc).__name__}: {exc}" if str(exc) else f"no answer within {_LOOK_TIMEOUT_S:g} s"
                return []

        if console.is_terminal:
            from rich.console import Group

            with Live(console=console, auto_refresh=False, transient=False) as live:
                while (rows := await current_rows()) is not None:
                    title = f"{runtime.spec.name} — {_fmt_duration(time.monotonic() - began)}"
                    if bus_error:
                        title += f" — the bus does not answer ({bus_error}); the run goes on"
                    learning = view.renderable(records) if view is not None else None
                    table = _table(rows, title=title)
                    live.update(Group(learning, table) if learning is not None else table, refresh=True)
                    await anyio.sleep(1.0)
            return
        while True:
            await anyio.sleep(interval_s)
            if (rows := await current_rows()) is None:
                return
            if bus_error:
                elapsed = _fmt_duration(time.monotonic() - began)
                click.echo(f"[{elapsed}] the bus does not answer ({bus_error}); the run goes on")
                continue
            click.echo(_plain_line(rows, time.monotonic() - began))
            if view is not None and (learning_line := view.line(records)) is not None:
                click.echo(learning_line)

    async with anyio.create_task_group() as tg:
        tg.start_soon(display)
        result = await runtime.run(duration_s=duration_s)
        tg.cancel_scope.cancel()
    return result


def _resume_target(resume: str, spec_path: Path | None, run_root: Path | None) -> tuple[Path, Path]:
    """``(run dir, spec path)`` of ``--resume RUN``: RUN is a run dir, a runs folder (its ``latest``), or ``latest``
    (the ``latest`` of --run-dir, of SPEC's runtime.run_dir, else of ./runs); the spec is SPEC or the run's own."""
    from topology.runtime._rundir import LOCK, RunNotFound, find_run, read_run_info, supervisor_alive

    if resume == "latest":
        if run_root is not None:
            where = run_root
        elif spec_path is not None:
            where = _load_spec_or_exit(spec_path).runtime.run_dir
        else:
            where = Path("runs")
    else:
        where = Path(resume)
    try:
        run_dir = find_run(where).resolve()
    except RunNotFound as exc:
        raise click.ClickException(f"--resume {resume}: {exc}") from None
    info = read_run_info(run_dir)
    if supervisor_alive(run_dir, info.pid):  # before the spec's checks: its ports are taken by this very run
        raise click.ClickException(
            f"--resume {resume}: the run at {run_dir} is live (its `flywheel up`, pid {info.pid}, holds "
            f"{run_dir / LOCK}); see it with: flywheel status {run_dir}"
        )
    if spec_path is None:
        spec_path = Path(info.spec_path)
        if not spec_path.is_file():
            raise click.ClickException(
                f"--resume {resume}: the run's spec {spec_path} is gone; pass the spec: flywheel up SPEC --resume …"
            )
    return run_dir, spec_path


@click.command()
@click.argument("spec_path", metavar="[SPEC]", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--resume",
    metavar="RUN",
    help="Continue an existing run instead of starting a new one: RUN is its run dir, a runs folder (its latest "
    "run), or 'latest'. SPEC defaults to the run's own spec.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    metavar="S",
    help="Stop by itself (with a graceful drain) after S seconds. Default: run until Ctrl-C / SIGTERM.",
)
@click.option(
    "--single-process",
    is_flag=True,
    help="Run every replica as a task in this one process (for debuggers and profilers; no isolation).",
)
@click.option(
    "--runtime",
    "runtime_kind",
    type=click.Choice(["local", "ray"]),
    default=None,
    help="Where replicas run (default: the spec's runtime.kind): local processes, or Ray actors.",
)
@click.option(
    "--address",
    metavar="ADDR",
    help="With --runtime ray: the Ray cluster to join (auto, ray://head:10001). Default: runtime.address, "
    "else a new local Ray instance.",
)
@click.option(
    "--run-dir",
    "run_root",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Create the run directory under DIR instead of the spec's runtime.run_dir.",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    metavar="S",
    help="On stop, give replicas S seconds to drain before they are killed.",
)
@click.option(
    "--every",
    "interval_s",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    metavar="S",
    help="When stdout is not a terminal, print a status line every S seconds.",
)
def up(
    spec_path: Path | None,
    resume: str | None,
    duration: float | None,
    single_process: bool,
    runtime_kind: str | None,
    address: str | None,
    run_root: Path | None,
    drain_timeout: float,
    interval_s: float,
) -> None:
    """Run the topology in SPEC as a supervised service, until Ctrl-C, SIGTERM or --duration.

    \b
    What happens:
      1. the spec is validated (every error printed with file:line; nothing starts if one is found)
      2. a run directory <run_dir>/<name>-<YYYYmmdd-HHMMSS>/ is created (runs/latest points at it):
         run.json (how to reach the run), logs/<actor>-<replica>.log, state/ (checkpoints), nats/
         (the bus's JetStream store and its token, readable by you only) — or, with --resume, an
         existing one is taken back
      3. the bus starts (embedded nats-server, on the run's store; clients must present the run's
         token) or is connected to, and every channel is created; a nats-server that dies is
         restarted on the same port and store, and the replicas reconnect
      4. each actor replica starts as its own process; a crashed one is restarted with backoff, and
         one that keeps crashing (runtime.restart.max_restarts within window_s) stops the topology
      5. Ctrl-C / SIGTERM / --duration: replicas drain (finish and ack in-flight work), then stop;
         a second Ctrl-C skips the drain

    \b
    Exit status: 0 after a clean stop (crashes its replicas recovered from are named); 1 when an
    actor exhausted its restarts, or when a replica in a crash loop (crashed twice or more within
    runtime.restart.window_s) was not running again at the stop (e.g. until --duration ran out).
    Each crash is logged with the exception line its log (logs/<actor>-<replica>.log) ends with.

    \b
    Resuming (after a stop, a crash, or a kill -9 of everything): --resume continues the run where
    the bus and the actors' state left it — the same channels and consumer positions, the learner's
    checkpoint and ledger (nothing applied twice), recordings, joiner state, gate decisions and the
    serving version; weight versions continue from the last one. The spec may have changed: what
    changed is logged once; a change the run cannot follow (its name; a key an application fixes
    for a run's life, such as the policy's model) is refused before anything starts.

    \b
    Examples:
      flywheel up specs/embedded.yaml
      flywheel up specs/embedded.yaml --duration 60
      flywheel up specs/embedded.yaml --single-process     # one process, easy to debug
      flywheel up specs/embedded.yaml --runtime ray        # each replica a Ray actor (local Ray)
      flywheel up specs/ray-cluster.yaml --address auto    # join the Ray cluster of this machine
      flywheel up --resume latest                          # continue ./runs/latest
      flywheel up --resume runs/embedded-default-20250101-120000
    In another terminal: flywheel status
    """
    configure_logging()
    resume_dir: Path | None = None
    if resume is not None:
        resume_dir, spec_path = _resume_target(resume, spec_path, run_root.resolve() if run_root else None)
    elif spec_path is None:
        raise click.UsageError("give a SPEC to run, or --resume RUN to continue a run")
    spec = _load_spec_or_exit(spec_path, starting=runtime_kind != "ray")
    from topology.runtime import LocalRuntime, SingleProcessRuntime

    kind = runtime_kind or spec.runtime.kind
    if address is not None and kind != "ray":
        raise click.UsageError("--address is for --runtime ray (or a spec with runtime.kind: ray)")
    if single_process and runtime_kind == "ray":
        raise click.UsageError("--single-process and --runtime ray exclude each other")
    run_root = run_root.resolve() if run_root else None
    runtime: Any
    if kind == "ray" and not single_process:
        from topology.runtime import RayRuntime

        runtime = RayRuntime(spec, run_root=run_root, drain_timeout_s=drain_timeout, address=address, resume=resume_dir)
    else:
        runtime_cls = SingleProcessRuntime if single_process else LocalRuntime
        runtime = runtime_cls(spec, run_root=run_root, drain_timeout_s=drain_timeout, resume=resume_dir)
    if resume_dir is not None:
        click.echo(f"resuming {resume_dir}")
    try:
        result = anyio.run(_up_main, runtime, duration, interval_s, backend="asyncio")
    except Exception as exc:  # bus could not start, run dir not writable, no Ray, …: one line, not a traceback
        from topology.bus import BusError
        from topology.cli._errors import user_error
        from topology.runtime import RayUnavailable, RunLocked, RunNotFound

        # raised inside _up_main's task group, so it arrives wrapped in an exception group
        found = user_error(exc, (BusError, OSError, RayUnavailable, RunLocked, RunNotFound))
        if found is None:
            raise
        raise click.ClickException(str(found)) from None
    if result.ok:
        click.echo(f"{spec.name}: {result.message}; run dir {result.run_dir}")
        return
    click.echo(f"{spec.name}: {result.message}", err=True)
    sys.exit(result.exit_code)


@click.command()
@click.argument("run_dir_arg", metavar="[RUN_DIR]", required=False, type=click.Path(path_type=Path))
@click.option(
    "--run-dir",
    "run_dir_opt",
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="A run directory, or a runs folder whose 'latest' link to follow. Default: ./runs.",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of a table.")
def status(run_dir_arg: Path | None, run_dir_opt: Path | None, as_json: bool) -> None:
    """Show what every actor replica of a running topology is doing.

    \b
    Finds the run (RUN_DIR, --run-dir, or ./runs/latest), reads each replica's latest heartbeat
    from the bus and prints: actor, replica, state, pid, restarts, uptime, age of the last
    heartbeat (STALE when older than 3 heartbeat intervals: the replica is wedged or gone) and
    its counters — and a row for the embedded nats-server (its pid and restarts). Exits 1 when
    no run is live there, or when its supervisor runs but its bus does not answer (frozen,
    overloaded or restarting: the message says which run and bus; --json sets bus_unreachable).

    \b
    Examples:
      flywheel status
      flywheel status runs/embedded-default-20250101-120000
      flywheel status --json | jq '.replicas[] | {actor, state, restarts}'
    """
    from rich.console import Console

    from topology.runtime._rundir import RunNotFound, find_run
    from topology.runtime._status import read_run_status

    configure_logging(logging.WARNING)
    where = run_dir_arg or run_dir_opt
    try:
        run_dir = find_run(where)
    except RunNotFound as exc:
        if not as_json:
            raise click.ClickException(str(exc)) from None
        nothing = {"run_dir": None, "topology": None, "bus_url": None, "live": False, "reason": str(exc)}
        click.echo(json.dumps({**nothing, "bus_unreachable": False, "replicas": [], "bus": None}, indent=2))
        sys.exit(1)  # the same keys as for a run: a script's jq reads .live and .reason either way
    report = anyio.run(read_run_status, run_dir, backend="asyncio")
    from topology.runtime._rundir import read_run_info

    info = read_run_info(run_dir)
    rows = _rows(report.replicas, report.expected, report.heartbeat_s, info.kinds) if report.live else []
    bus = _bus_row(info) if report.live else []
    if as_json:
        doc = {
            "run_dir": report.run_dir,
            "topology": report.topology,
            "bus_url": report.bus_url,
            "live": report.live,
            "reason": report.reason,
            "bus_unreachable": report.bus_unreachable,
            "replicas": rows,
            "bus": bus[0] if bus else None,  # the embedded nats-server (pid, restarts), null for an external bus
        }
        click.echo(json.dumps(doc, indent=2))
        sys.exit(0 if report.live else 1)
    if not report.live:
        said = "its status cannot be read now" if report.bus_unreachable else "no live run"
        click.echo(f"{said} at {run_dir}: {report.reason}", err=True)
        sys.exit(1)
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # piped: do not cut counters at 80 columns
    view = _live_view()
    summary = view.renderable(report.replicas) if view is not None else None
    if summary is not None:
        console.print(summary)
    console.print(_table(rows + bus, title=f"{report.topology} — {report.run_dir}"))


__all__ = ["status", "up"]
