"""The command line: parse, call the library, render. Nothing below this module prints or exits.

Each area keeps its click commands in ``envvault/commands/<area>.py``; they are registered here.
"""

from __future__ import annotations

import os
import sys

import click

from envvault import __version__
from envvault.errors import EnvvaultError

__all__ = ["main", "cli"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="envvault")
@click.option(
    "--vault",
    "vault_path",
    envvar="ENVVAULT_HOME",
    type=click.Path(file_okay=False),
    help="Vault directory (default: $ENVVAULT_HOME, else $XDG_DATA_HOME/envvault).",
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
    # One import per area; each module adds its commands to ``cli``.
    from envvault.commands import snapshots  # noqa: F401
    from envvault.commands import restore  # noqa: F401
    from envvault.commands import guard  # noqa: F401
    from envvault.commands import caches  # noqa: F401
    from envvault.commands import torch  # noqa: F401


def main(argv: list[str] | None = None) -> None:
    _register()
    try:
        cli.main(args=argv, prog_name="envvault", standalone_mode=False)
    except EnvvaultError as err:
        click.echo(f"envvault: error: {err}", err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("envvault: aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        click.echo("envvault: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except OSError as err:
        from envvault.vault.fsutil import storage_error

        where = err.filename or "a file"
        click.echo(f"envvault: error: {storage_error(err, where)}", err=True)
        sys.exit(6)
    except Exception as err:  # noqa: BLE001 - a bug must still be one line, with a way to see more
        if os.environ.get("ENVVAULT_DEBUG"):
            raise
        click.echo(f"envvault: internal error: {type(err).__name__}: {err} (rerun with ENVVAULT_DEBUG=1 for a "
                   "traceback, and please report it)", err=True)
        sys.exit(70)
    sys.exit(0)
