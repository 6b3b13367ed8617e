"""How a command's failure reaches the user: one line on stderr and an exit code, never a traceback
(``guarded``), the same for a command run by the CLI (``cli.py``) and one run without click (``lean.py``)."""

from __future__ import annotations

import os
import sys

from envvault.errors import EnvvaultError, Terminated
from envvault.output import echo

__all__ = ["guarded"]


def guarded(call, other=None) -> int:
    """Run ``call()`` as a command; its exit code. Whatever it raises becomes one line on stderr and a code,
    never a traceback, as click's own main turns it: an ``EnvvaultError`` its message and code; Ctrl-C or an
    EOFError a blank line and "aborted", 130 (SIGTERM, ``Terminated``: "terminated", 143); a closed stdout pipe 1 (stdout is pointed at /dev/null, so
    that nothing fails again at exit); an OSError a storage error (6); anything else an internal error (70;
    ``ENVVAULT_DEBUG=1`` raises it). ``other(err)`` first gets an exception of another kind and may give its
    code (the CLI's click errors). A line that cannot be written (a closed stderr) leaves the code as it is.
    ``SystemExit`` passes through."""
    try:
        call()
    except EnvvaultError as err:
        return _say(f"envvault: error: {err}", err.exit_code)
    except Terminated:
        _say("", 0)
        return _say("envvault: terminated", Terminated.exit_code)
    except (KeyboardInterrupt, EOFError):
        _say("", 0)
        return _say("envvault: aborted", 130)
    except BrokenPipeError:
        _quiet_stdout()
        return 1
    except OSError as err:
        from envvault.vault.fsutil import storage_error

        return _say(f"envvault: error: {storage_error(err, err.filename or 'a file')}", 6)
    except Exception as err:  # noqa: BLE001 - a bug must still be one line, with a way to see more
        code = other(err) if other is not None else None
        if code is not None:
            return code
        if os.environ.get("ENVVAULT_DEBUG"):
            raise
        return _say(f"envvault: internal error: {type(err).__name__}: {err} (rerun with ENVVAULT_DEBUG=1 for a "
                    "traceback, and please report it)", 70)
    return 0


def _say(line: str, code: int) -> int:
    """``line`` on stderr, when stderr takes it; ``code``."""
    try:
        echo(line, err=True)
    except (OSError, ValueError):
        pass
    return code


def _quiet_stdout() -> None:
    """After a closed pipe: stdout goes to /dev/null, as click's main does, so the flush at exit fails no more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, AttributeError, ValueError):
        pass
