"""``flywheel replay``: re-issue recorded prompts against a weight version and report by domain."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import anyio
import click


@dataclass(frozen=True)
class _Options:
    """What to replay and how: the command's options past the paths."""

    weights: str
    against: str | None
    seed: int
    source: Literal["traffic", "scored", "both"]
    limit: int | None
    concurrency: int
    greedy: bool
    engine_throughput: bool


def _run_dir_of(recordings: Path) -> Path | None:
    for candidate in (recordings, *recordings.parents):
        if (candidate / "run.json").is_file():
            return candidate
    return None


@click.command()
@click.argument("recordings", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Topology spec (policy, domains, verifiers). Default: the spec of the run RECORDINGS is in.",
)
@click.option(
    "--weights",
    required=True,
    help="Version to replay (v3, 3, initial; on a live run also current, the learner's newest, or serving) or a "
    "checkpoint path.",
)
@click.option("--against", default=None, help="Another version or checkpoint to compare with.")
@click.option("--seed", default=0, show_default=True, help="Sampling seed (per request: hash(seed, id)).")
@click.option(
    "--from",
    "source",
    type=click.Choice(["traffic", "scored", "both"]),
    default="both",
    show_default=True,
    help="What to replay: users' requests (traffic), the task domains' training samples (scored), or both.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help=(
        "Replay only the newest N samples (of --from). Default: every recorded sample — a service records every "
        "training sample (scored), a week of them unless the recorder's retain_days.scored says otherwise."
    ),
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Requests in flight (the engine's batch).",
)
@click.option("--greedy", is_flag=True, help="Decode greedily instead of at the recorded temperature.")
@click.option(
    "--engine-throughput",
    is_flag=True,
    help="Also time the bare engine on the same prompts (one more pass over them) and report replay's share of it.",
)
@click.option(
    "--run-dir",
    "run_dir_opt",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Run dir holding the weights, or the runs folder whose latest run it is (default: the run RECORDINGS is in).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("replay-report"),
    show_default=True,
    help="Where report.md, report.json and report.png go.",
)
def replay(
    recordings: Path,
    spec_path: Path | None,
    weights: str,
    against: str | None,
    seed: int,
    source: Literal["traffic", "scored", "both"],
    limit: int | None,
    concurrency: int,
    greedy: bool,
    engine_throughput: bool,
    run_dir_opt: Path | None,
    out_dir: Path,
) -> None:
    """Replay recorded prompts against a weight version; compare with the recording (and another version).

    \b
    RECORDINGS is the recorder's folder (or a run dir holding recordings/). `scored` samples, and
    served `traffic` whose prompt is a task of its domain, are re-scored by the domain's verifier;
    other traffic is compared by text only. Same weights + same seed → same completions. A service
    run records every training sample too (scored): `--from traffic` replays only what users asked.

    \b
    Examples:
      flywheel replay runs/latest/recordings --weights v12 --against v10
      flywheel replay runs/latest --from traffic --weights current --against serving   (a live run)
      flywheel replay runs/latest --weights ckpt/model.safetensors --greedy --limit 200 --out report/
      flywheel replay runs/latest --weights v12 --engine-throughput   (replay's share of raw generation)
    """
    from topology.cli._logging import configure_logging

    configure_logging()  # info on stderr, as `flywheel up`: not a debug line per re-scored completion
    logging.getLogger().setLevel(logging.WARNING)
    run_dir: Path | None = run_dir_opt
    if run_dir_opt is None:
        run_dir = _run_dir_of(recordings.resolve())
    elif not run_dir_opt.is_dir():
        raise click.ClickException(f"--run-dir {run_dir_opt}: no such folder (give a run dir, or the runs folder)")
    elif not (run_dir_opt / "run.json").is_file() and (run_dir_opt / "latest" / "run.json").is_file():
        run_dir = (run_dir_opt / "latest").resolve()  # a runs folder, as every command takes: its latest run
    if spec_path is not None:
        spec = _load_spec(spec_path)
    elif run_dir is None:
        raise click.ClickException("no --spec given and RECORDINGS is not inside a run dir with run.json")
    else:
        spec = _spec_of_run(run_dir)
    try:
        options = _Options(weights, against, seed, source, limit, concurrency, greedy, engine_throughput)
        report = anyio.run(partial(_replay, spec, recordings, run_dir, options), backend="asyncio")
    except KeyboardInterrupt:
        # a half-replayed report would read as a verdict on the weights: nothing is written
        click.echo(f"replay interrupted (Ctrl-C): no report written to {out_dir}", err=True)
        raise SystemExit(130) from None
    except Exception as exc:  # WeightsNotFound, bad weights, bad recordings; from the replayer's task group too
        from topology.cli._errors import user_error

        if (found := user_error(exc, (ValueError,))) is None:
            raise
        raise click.ClickException(str(found)) from None
    from actors.replay import write_report
    from actors.replay._report import markdown

    paths = write_report(report, out_dir)
    click.echo(markdown(report))
    click.echo("wrote " + ", ".join(str(p) for p in paths))


def _spec_of_run(run_dir: Path) -> Any:
    """The spec of the run in ``run_dir``: its file, or, when that is gone, the copy its run.json keeps."""
    from topology import SpecError, load_spec_text
    from topology.runtime._rundir import read_run_info

    info = read_run_info(run_dir)
    path = Path(info.spec_path)
    if path.is_file():
        return _load_spec(path)
    if info.spec is None:
        raise click.ClickException(
            f"the run's spec {path} is gone and {run_dir / 'run.json'} keeps no copy of it; "
            "pass the spec: flywheel replay … --spec SPEC"
        )
    copy = f"{run_dir / 'run.json'} (its spec)"
    click.echo(
        f"the run's spec {path} is gone; using the copy in {run_dir / 'run.json'} (--spec SPEC to override)", err=True
    )
    try:
        return load_spec_text(json.dumps(info.spec), copy, source=path)
    except SpecError as exc:
        raise click.ClickException(f"{exc}\n(the run's spec {path} is gone; pass one with --spec SPEC)") from None


def _load_spec(path: Path) -> Any:
    from topology import SpecError, load_spec

    try:
        return load_spec(path)
    except SpecError as exc:
        raise click.ClickException(str(exc)) from None


async def _replay(spec: Any, recordings: Path, run_dir: Path | None, options: _Options) -> dict[str, Any]:
    from actors.replay import Replayer, build_report, load_items

    items = load_items(recordings, limit=options.limit, source=options.source)
    if not items:
        what = "traffic or scored" if options.source == "both" else options.source
        hint = ""
        if recordings.name in ("traffic", "scored") and recordings.parent.name == "recordings":  # one channel's folder
            hint = f"; give the recordings folder that holds it ({recordings.parent}) or the run dir"
        raise ValueError(f"nothing recorded under {recordings} (no {what} parquet files){hint}")
    bus = await _live_bus(run_dir)
    try:
        main = await _weights(options.weights, run_dir, bus)
        other = await _weights(options.against, run_dir, bus) if options.against is not None else None
    finally:
        if bus is not None:
            await bus.close()
    # a service run's recordings hold every training sample too: say how many before the long part starts
    traffic = sum(1 for item in items if item.source == "traffic")
    versions = main.label + (f" and {other.label}" if other is not None else "")
    click.echo(
        f"replaying {len(items):,} recorded samples ({traffic:,} traffic, {len(items) - traffic:,} scored) "
        f"with {versions}" + ("" if options.limit is not None else "; --from traffic or --limit N replays fewer"),
        err=True,
    )
    threads = max(1, (os.cpu_count() or 1))
    async with Replayer(spec, num_threads=threads) as replayer:
        kwargs: dict[str, Any] = {"seed": options.seed, "concurrency": options.concurrency, "greedy": options.greedy}
        raw = None
        if options.engine_throughput:  # a pass of its own over every sample: half again a two-version replay's time
            raw = await replayer.raw_throughput(items, main.state_dict, version=main.version, **kwargs)
        run = await replayer.run(items, main.state_dict, label=main.label, version=main.version, **kwargs)
        against_run = None
        if other is not None:
            against_run = await replayer.run(
                items, other.state_dict, label=other.label, version=other.version, **kwargs
            )
    return build_report(items, run, against_run, seed=options.seed, raw=raw)


async def _weights(ref: str, run_dir: Path | None, bus: Any) -> Any:
    from actors.replay import resolve_weights

    return await resolve_weights(ref, run_dir=run_dir, bus=bus)


async def _live_bus(run_dir: Path | None) -> Any:
    """The run's bus when it is up (for versions in the object store); None otherwise."""
    if run_dir is None or not (run_dir / "run.json").is_file():
        return None
    from topology.runtime import connect_run
    from topology.runtime._rundir import read_run_info, supervisor_alive

    info = read_run_info(run_dir)
    if info.stopped_at is not None or not supervisor_alive(run_dir, info.pid):
        return None
    try:
        with anyio.fail_after(5):
            return await connect_run(run_dir, name="flywheel-replay", info=info)
    except Exception:
        return None


__all__ = ["replay"]
