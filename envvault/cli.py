"""The command line: parse, call the library, render. Nothing below this module prints or exits.

Each area keeps its click commands in ``envvault/commands/<area>.py``; they are registered here.
"""

from __future__ import annotations

import sys

import click

from envvault import __version__
from envvault.env import chosen_python
from envvault.errors import Terminated
from envvault.failures import guarded

__all__ = ["main", "cli", "python_option", "chosen_python"]


PYTHON_HELP = "An interpreter: act on the installation it sees (its site directories, the user site), not a venv."


def python_option(help_text: str = PYTHON_HELP):
    """``--python PATH``: act on the installation that interpreter sees (docs/cli.md); the choice reaches
    ``env.probe.find_target`` through ``choose_python``. Here, so that guard (run by the shell hook on every
    install) and the other commands share it without importing each other."""

    def choose(ctx, param, value):
        if value is None and chosen_python() is None:
            return value  # nothing chosen before, nothing to forget: a quick command need not import the probe
        from envvault.env.probe import choose_python

        choose_python(value)
        return value

    return click.option("--python", "python", type=PathType(dir_okay=False), expose_value=False,
                        callback=choose, help=help_text)


class PathType(click.Path):
    """``click.Path`` that refuses an empty value: ``--into ""`` (a script's unset variable) restored in place,
    ``--to ""`` was ignored and ``--cache-dir ""`` archived the working folder (helper 31). The one path type
    of every option and argument that names a path."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path; give the path (is a variable unset?)", param, ctx)
        return super().convert(value, param, ctx)


# Which module defines each command: a command imports only its own module, so a quick command (a
# second snap, status, diff) does not pay for the imports of all the others.
_COMMANDS = {
    "snap": "snapshots", "list": "snapshots", "show": "snapshots", "export": "snapshots", "verify": "snapshots",
    "diff": "restore", "status": "restore", "restore": "restore", "tag": "restore", "untag": "restore",
    "gc": "restore", "guard": "guard", "shell-hook": "guard", "cache": "caches", "inspect": "torch",
    "torch": "torch", "sync": "sync",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(_COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in _COMMANDS:
            import importlib

            importlib.import_module(f"envvault.commands.{_COMMANDS[name]}")
        return self.commands.get(name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="envvault")
@click.option(
    "--vault",
    "vault_path",
    envvar="ENVVAULT_HOME",
    type=PathType(file_okay=False),
    help="Vault directory, or s3://BUCKET/PREFIX with the s3 extra (default: $ENVVAULT_HOME, else "
    "$XDG_DATA_HOME/envvault).",
)
@click.pass_context
def cli(ctx: click.Context, vault_path: str | None) -> None:
    """Exact, restorable snapshots of Python environments and their compile caches.

    \b
    Examples:
      envvault snap -m "before installing sglang"
      envvault list
      envvault diff latest current
      envvault restore latest
    """
    ctx.ensure_object(dict)
    ctx.obj["vault_path"] = vault_path


def _register() -> None:
    """Import every command module (tests and docs use this; ``main`` imports on demand)."""
    import importlib

    for module in sorted(set(_COMMANDS.values())):
        importlib.import_module(f"envvault.commands.{module}")


def main(argv: list[str] | None = None) -> None:
    sys.exit(guarded(lambda: cli.main(args=argv, prog_name="envvault", standalone_mode=False), _click_failure))


def _click_failure(err: Exception) -> int | None:
    """The exit code of what click raised (its message shown as click shows it), None for anything else."""
    if isinstance(err, click.exceptions.Abort):
        if Terminated.behind(err):
            click.echo("envvault: terminated", err=True)
            return Terminated.exit_code
        click.echo("envvault: aborted", err=True)
        return 130
    if isinstance(err, click.ClickException):
        err.show()
        return err.exit_code
    if isinstance(err, click.exceptions.Exit):
        return err.exit_code
    return None
