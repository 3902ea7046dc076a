"""``flywheel validate`` and ``flywheel plan``: check spec files and show the graph they resolve to.

Contract: user mistakes (bad YAML, unknown keys, missing files, …) are printed one per line as
``FILE:LINE:COL: key.path: message`` on stderr — never a traceback — and make the exit status 1.
Warnings are printed the same way, prefixed ``warning:``, and do not change the exit status.
"""

from __future__ import annotations

import sys

import click

from topology._check import check_spec
from topology._errors import SpecIssue
from topology._graph import build_graph

_EPILOG_VALIDATE = """\b
Examples:
  flywheel validate specs/embedded.yaml
  flywheel validate specs/*.yaml

\b
Each problem is one line, like a compiler's:
  specs/my.yaml:12:15: actors.generator.replicas: expected an integer >= 1, got 0
Every error in every file is reported in one run. Warnings (e.g. more GPUs asked for than this machine
has) are shown but do not fail validation.
"""

_EPILOG_PLAN = """\b
Examples:
  flywheel plan specs/embedded.yaml
  flywheel plan specs/multi-domain.yaml --mermaid > topology.mmd

\b
The table lists each actor (kind, replicas, CPUs/GPUs per replica, channels it consumes and
publishes), then each channel (NATS subject, durability, producers, consumers), then warnings.
"""


def _report(issues: list[SpecIssue]) -> int:
    for issue in issues:
        click.echo(str(issue), err=True)
    return sum(1 for i in issues if i.is_error)


@click.command(epilog=_EPILOG_VALIDATE)
@click.argument("specs", nargs=-1, required=True, metavar="SPEC...")
@click.option("-q", "--quiet", is_flag=True, help="Print only problems, not 'ok SPEC' lines.")
def validate(specs: tuple[str, ...], quiet: bool) -> None:
    """Check topology spec files without running anything.

    Reads each SPEC (YAML, with include: and ${ENV} interpolation), validates every section and every
    actor block against its kind, and checks cross-references (actor kinds, domains, channels). Each
    problem is printed to stderr as FILE:LINE:COL: key.path: message. Exit status: 0 when every spec is
    valid (warnings allowed), 1 when any has an error.
    """
    failed = 0
    total_errors = 0
    for path in specs:
        _, issues = check_spec(path)
        errors = _report(issues)
        total_errors += errors
        if errors:
            failed += 1
        elif not quiet:
            warnings = len(issues)
            suffix = f" ({warnings} warning{'s' if warnings != 1 else ''})" if warnings else ""
            click.echo(f"ok {path}{suffix}")
    if total_errors:
        click.echo(
            f"{total_errors} error{'s' if total_errors != 1 else ''} in {failed} file{'s' if failed != 1 else ''}",
            err=True,
        )
        sys.exit(1)


@click.command(epilog=_EPILOG_PLAN)
@click.argument("spec", metavar="SPEC")
@click.option("--mermaid", is_flag=True, help="Print a mermaid 'flowchart LR' diagram instead of the table.")
@click.option("--width", type=click.IntRange(min=60), default=120, show_default=True, help="Table width in columns.")
def plan(spec: str, mermaid: bool, width: int) -> None:
    """Show the graph a topology spec resolves to: actors, replicas, resources and channels.

    Validates SPEC first (same checks and messages as 'flywheel validate'; exit status 1 on errors), then
    prints who publishes and consumes which channel, and warns about resources this machine cannot give.
    """
    loaded, issues = check_spec(spec)
    if loaded is None:
        errors = _report(issues)
        click.echo(f"{errors} error{'s' if errors != 1 else ''} in 1 file", err=True)
        sys.exit(1)
    graph = build_graph(loaded)
    if mermaid:
        click.echo(graph.mermaid(), nl=False)
        for warning in loaded.warnings:
            click.echo(str(warning), err=True)
    else:
        click.echo(graph.table(width=width), nl=False)


__all__ = ["plan", "validate"]


@click.command()
def reference() -> None:
    """Print the spec reference: every key of every section and actor kind, with type, default and meaning.

    \b
    Generated from the models that validate specs (the framework's and every registered application's);
    specs/REFERENCE.md is its output.
    """
    from topology._reference import reference_markdown

    click.echo(reference_markdown(), nl=False)
