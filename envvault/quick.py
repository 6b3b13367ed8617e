"""The quick ``status``: an unchanged environment answered before the CLI is imported, from the verdict of
its last full ``status`` (``snap/verdict.py``).

``envvault [--vault PATH] status [--venv PATH] [--exit-code]``, in the spellings click takes for them
(``--vault=PATH``, ``--venv=PATH``) and nothing else, is answered here when the verdict holds. Any other
command line (``--json``, ``--against``, ``--python``, ``--help``, a repeated or unknown option), a vault in a
bucket, and any status the verdict cannot answer go to the CLI (``cli.py``), which answers in full, errors
included: this module never fails a command, it only answers it sooner. ``ENVVAULT_QUICK_STATUS=0`` sends
every command to the CLI.
"""

from __future__ import annotations

import codecs
import os
import sys

from envvault.argv import FLAG, VALUE, read_plain

__all__ = ["parse_status", "answer"]

_STATUS = {"--venv": ("venv", VALUE), "--exit-code": ("exit_code", FLAG)}


def parse_status(args: list[str]) -> tuple[str | None, str | None, bool] | None:
    """``(vault, venv, exit_code)`` of a plain ``status`` command line, None for any other."""
    got = read_plain(args, ("status",), _STATUS)
    if got is None:
        return None
    return got["vault"], got.get("venv"), got.get("exit_code", False)


def answer(args: list[str]) -> int | None:
    """The exit code of ``status`` when it was answered here (its line printed), else None."""
    if os.environ.get("ENVVAULT_QUICK_STATUS", "") == "0" or "_ENVVAULT_COMPLETE" in os.environ:
        return None  # (click answers a shell's completion request before reading the command line)
    parsed = parse_status(args)
    if parsed is None:
        return None
    vault, venv, _exit_code = parsed  # unchanged: 0 with or without --exit-code
    try:
        from envvault.vault.location import default_vault_path, vault_url

        if vault_url(vault or os.environ.get("ENVVAULT_HOME") or None):
            return None  # a bucket: its snapshots are not a folder to stat
        root = default_vault_path(vault)
        if not root.is_dir():
            return None
        from envvault.snap.verdict import unchanged_since, unchanged_text

        hit = unchanged_since(root, venv)
    except Exception:  # noqa: BLE001 - whatever went wrong, the full command finds it and says it
        return None
    if hit is None:
        return None
    target, verdict = hit
    from envvault.output import use_colour

    out = sys.stdout
    try:
        tty = out is not None and out.isatty()
    except (AttributeError, ValueError, OSError):
        tty = False
    # As the full command prints it (click.echo): styles only on a terminal, whatever FORCE_COLOR says.
    return _emit(unchanged_text(target, verdict.snapshot, verdict.note, colour=use_colour() and tty) + "\n")


def _emit(line: str) -> int | None:
    """Write ``line`` to stdout; 0 once written, None to leave the command to the CLI (which prints, or says
    why it cannot, its own way): no stdout, an ASCII stdout (click writes UTF-8 to it), a line stdout's
    encoding cannot hold, or a write that failed before any byte went out. A closed pipe ends the command as
    click ends the CLI (exit 1, nothing more); a write that fails half way is one line on stderr and exit 6,
    as the CLI's."""
    out = sys.stdout
    if out is None:
        return None
    try:
        if codecs.lookup(out.encoding or "utf-8").name == "ascii":
            return None  # click writes UTF-8 to a stdout that says ASCII: the CLI prints it
        data = line.encode(out.encoding or "utf-8", out.errors or "strict")
        fd = out.fileno()
        out.flush()
    except (AttributeError, ValueError, OSError, UnicodeError):
        return None
    written = 0
    try:
        while written < len(data):
            written += os.write(fd, data[written:])
    except BrokenPipeError:
        return 1  # as click ends the CLI on a closed pipe
    except OSError as err:
        if not written:
            return None
        from envvault.vault.fsutil import storage_error

        sys.stderr.write(f"envvault: error: {storage_error(err, 'standard output')}\n")
        return 6
    return 0
