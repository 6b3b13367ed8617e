"""How a command's failure reaches the user: one line on stderr and an exit code, never a traceback
(``guarded``), the same for a command run by the CLI (``cli.py``) and one run without click (``lean.py``)."""

from __future__ import annotations

import os

from envvault.errors import EnvvaultError
from envvault.output import echo

__all__ = ["guarded"]


def guarded(call, other=None) -> int:
    """Run ``call()`` as a command; its exit code. Whatever it raises becomes one line on stderr and a code,
    never a traceback: an ``EnvvaultError`` its message and code, Ctrl-C 130, a closed pipe 0, an OSError a
    storage error (6), anything else an internal error (70; ``ENVVAULT_DEBUG=1`` raises it). ``other(err)``
    first gets an exception of another kind and may give its code (the CLI's click errors). ``SystemExit``
    passes through."""
    try:
        call()
    except EnvvaultError as err:
        echo(f"envvault: error: {err}", err=True)
        return err.exit_code
    except KeyboardInterrupt:
        echo("envvault: interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as err:
        from envvault.vault.fsutil import storage_error

        echo(f"envvault: error: {storage_error(err, err.filename or 'a file')}", err=True)
        return 6
    except Exception as err:  # noqa: BLE001 - a bug must still be one line, with a way to see more
        code = other(err) if other is not None else None
        if code is not None:
            return code
        if os.environ.get("ENVVAULT_DEBUG"):
            raise
        echo(f"envvault: internal error: {type(err).__name__}: {err} (rerun with ENVVAULT_DEBUG=1 for a "
             "traceback, and please report it)", err=True)
        return 70
    return 0
