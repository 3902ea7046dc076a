"""The ``flywheel`` command line: the framework's commands (validate, plan, up, status) and the applications'.

Subcommands live in their own modules and are imported only when invoked, so ``flywheel --help`` and
``flywheel validate`` stay fast (no torch import) and one broken subsystem cannot take the whole CLI down.
Applications add commands with `topology.register_command`.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

# the framework's own commands; an application adds its own through `topology.register_command`
_FRAMEWORK: dict[str, str] = {
    "validate": "topology.cli._validate:validate",
    "plan": "topology.cli._validate:plan",
    "up": "topology.cli._up:up",
    "status": "topology.cli._up:status",
    "reference": "topology.cli._validate:reference",
}


def _targets() -> dict[str, str]:
    """Every command name → its ``"module:attribute"``: the framework's, then the applications'."""
    from topology._registry import commands

    try:
        registered = commands()
    except Exception as exc:  # a plugin that cannot load: the framework's commands still work and say why
        click.echo(f"flywheel: warning: {exc}", err=True)
        registered = {}
    return {**{name: c.target for name, c in registered.items()}, **_FRAMEWORK}


class _LazyGroup(click.Group):
    """A group whose subcommands are imported on first use. A run dir that is not there, or whose run.json is not
    one (:class:`~topology.runtime.RunNotFound`), is a one-line error of any command, wherever it is found."""

    def invoke(self, ctx: click.Context) -> Any:
        from topology.runtime._rundir import RunNotFound

        try:
            return super().invoke(ctx)
        except RunNotFound as exc:
            raise click.ClickException(str(exc)) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_targets())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _targets().get(cmd_name)
        if target is None:
            return None
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # an extra not installed
            raise click.ClickException(f"'flywheel {cmd_name}' is unavailable: {exc}") from exc
        command: Any = getattr(module, attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flywheel")
def main() -> None:
    """flywheel — online continual RL of language models, from one topology spec.

    \b
    Typical session:
      flywheel validate specs/embedded.yaml    check a spec (every error, with file:line)
      flywheel plan specs/embedded.yaml        show actors, replicas, channels and resources
      flywheel up specs/embedded.yaml          run it as a supervised service (Ctrl-C drains)
      flywheel status                          what every actor is doing right now
    """


__all__ = ["main"]
