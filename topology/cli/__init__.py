"""The ``flywheel`` command line.

Subcommands live in their own modules and are imported only when invoked, so ``flywheel --help`` and
``flywheel validate`` stay fast (no torch import) and one broken subsystem cannot take the whole CLI down.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

# command name -> "module:attribute" of a click.Command; each module owns its command's help text.
_COMMANDS: dict[str, str] = {
    "validate": "topology.cli._validate:validate",
    "plan": "topology.cli._validate:plan",
    "up": "topology.cli._up:up",
    "status": "topology.cli._up:status",
    "sandbox": "actors.commands._sandbox:sandbox",
    "replay": "actors.commands._replay:replay",
    "review": "actors.commands._review:review",
    "promote": "actors.commands._promote:promote",
    "rollback": "actors.commands._promote:rollback",
}


class _LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # a subsystem not built yet, or an extra not installed
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
