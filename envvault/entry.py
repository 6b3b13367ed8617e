"""The ``envvault`` command's entry point (the console script and ``python -m envvault``).

Before the command imports anything else, ``keep_bytecode`` makes sure what it imports is compiled once,
not on every run. Where envvault was installed without its bytecode and Python will not write it beside the
sources (``PYTHONDONTWRITEBYTECODE``, which many container images set, or a folder this user cannot
write), it keeps it under envvault's cache folder instead (``sys.pycache_prefix``, Python's own mirror tree). On the
GPU host, whose image sets PYTHONDONTWRITEBYTECODE=1, envvault installed by uv into a venv of its own (uv
compiles nothing unless asked) compiled 60 modules on every ``status``: 0.19 s of 0.5 s
(bench/results/profiles/profile_status_own.txt). ``ENVVAULT_BYTECODE_CACHE=0`` leaves Python as it is.

Only the command does this: importing envvault as a library (``envvault.torch`` in a training script)
changes nothing in the importing process.
"""

from __future__ import annotations

import os
import stat
import sys

__all__ = ["main", "keep_bytecode"]


def main() -> None:
    keep_bytecode()
    from envvault.cli import main as cli_main

    cli_main()


def keep_bytecode() -> str | None:
    """Point ``sys.pycache_prefix`` at ``$XDG_CACHE_HOME/envvault/pycache`` (``~/.cache/...``) when this
    process would otherwise compile what it imports on every run; the folder used, or None (nothing
    changed). The folder must be this user's own and writable by no one else (bytecode there is run)."""
    if os.environ.get("ENVVAULT_BYTECODE_CACHE", "") == "0" or sys.pycache_prefix is not None:
        return None
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.exists(os.path.join(here, "__pycache__", f"cli.{tag}.pyc")):
        return None  # compiled at install (what it imports from elsewhere is the user's business)
    if not sys.dont_write_bytecode and os.access(here, os.W_OK):
        return None  # Python writes it beside the sources on the first run
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):
        return None  # no home folder
    folder = os.path.join(base, "envvault", "pycache")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    sys.pycache_prefix = folder
    sys.dont_write_bytecode = False
    return folder
