"""The lean commands: a plain ``snap`` or ``cache restore`` command line is run without importing click.

Click and what it pulls in cost every full command about 10-25 ms before it starts (bench/results/
issue11_device.md), as much as the work of a second snap or of restoring a compile cache. A command line
``argv.read_plain`` reads (``envvault [--vault PATH] snap [--venv PATH] [-m MSG] [--lock-only] [--no-caches]
[--cache-dir DIR]... [--json]``, ``envvault [--vault PATH] cache restore [ID] [--venv PATH] [--kind K]...
[--root DIR]... [--to DIR] [--merge | --replace] [--archived-roots] [--dry-run] [--json]``) runs the very
body its click command runs (``commands/plain.py``) under the CLI's error handling (``output.guarded``).
Anything else goes to the CLI: another spelling, ``--python``, ``--help``, a path click would refuse (one that
is there and is not a readable folder), a stdout or stderr that is missing or ASCII (click writes UTF-8 to
those its own way). ``ENVVAULT_LEAN=0`` sends every command to the CLI.
"""

from __future__ import annotations

import os
import stat
import sys

from envvault.argv import FLAG, MANY, VALUE, read_plain

__all__ = ["answer"]

_SNAP = {"--venv": ("venv", VALUE), "-m": ("message", VALUE), "--message": ("message", VALUE),
         "--lock-only": ("lock_only", FLAG), "--no-caches": ("no_caches", FLAG),
         "--cache-dir": ("cache_dirs", MANY), "--json": ("as_json", FLAG)}
_CACHE_RESTORE = {"--venv": ("venv", VALUE), "--kind": ("kinds", MANY), "--root": ("roots", MANY),
                  "--to": ("to", VALUE), "--merge": ("merge", FLAG, True), "--replace": ("merge", FLAG, False),
                  "--archived-roots": ("archived_roots", FLAG), "--dry-run": ("dry_run", FLAG),
                  "--json": ("as_json", FLAG)}


def _snap(vault: str | None, got: dict) -> None:
    from envvault.commands import plain

    plain.snap(vault, got.get("venv"), got.get("message", ""), got.get("lock_only", False),
               got.get("no_caches", False), got.get("cache_dirs", []), got.get("as_json", False))


def _cache_restore(vault: str | None, got: dict) -> None:
    from envvault.commands import plain

    plain.cache_restore(vault, (got["arguments"] or ["latest"])[0], got.get("venv"), got.get("kinds", []),
                        got.get("roots", []), got.get("to"), got.get("merge", True), got.get("archived_roots", False),
                        got.get("dry_run", False), got.get("as_json", False))


# (command words, options, plain arguments at most, what runs it)
_COMMANDS = ((("snap",), _SNAP, 0, _snap), (("cache", "restore"), _CACHE_RESTORE, 1, _cache_restore))


def answer(args: list[str]) -> int | None:
    """The exit code of the command when it was run here, else None (nothing was done: the CLI runs it)."""
    if os.environ.get("ENVVAULT_LEAN", "") == "0" or "_ENVVAULT_COMPLETE" in os.environ:
        return None  # (click answers a shell's completion request before reading the command line)
    for words, options, arguments, run in _COMMANDS:
        got = read_plain(args, words, options, arguments)
        if got is not None:
            break
    else:
        return None
    vault = got["vault"] or os.environ.get("ENVVAULT_HOME") or None  # as click reads --vault's variable
    paths = [vault, got.get("venv"), got.get("to"), *got.get("cache_dirs", ())]
    if not _streams_ok() or not all(_folder_ok(p) for p in paths if p is not None):
        return None
    from envvault.failures import guarded

    return guarded(lambda: run(vault, got))


def _folder_ok(path: str) -> bool:
    """What click's ``Path(file_okay=False)`` lets through: nothing there, or a folder this user can read."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return True
    return stat.S_ISDIR(st.st_mode) and os.access(path, os.R_OK)


def _streams_ok() -> bool:
    """stdout and stderr there and not ASCII. ``output.echo`` writes UTF-8 to an ASCII standard stream as
    click does, but ``--json`` output and progress go to the streams as they are: such a stream (a
    misconfigured locale) is left to the CLI, which every spelling reaches."""
    import codecs

    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is None or codecs.lookup(stream.encoding or "utf-8").name == "ascii":
                return False
        except (AttributeError, LookupError):
            return False
    return True
