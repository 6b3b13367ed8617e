"""Python code that envvault runs with ``python -c`` in a folder it does not trust (the user's working
directory: an unpacked archive, a checkout). ``-c`` puts ``''`` (the current folder) first on ``sys.path``, so
an ``envvault/``, ``json.py``, ``importlib/`` or ``typing.py`` there would run instead of the real module.
The one rule: drop every relative entry before anything else is imported."""

from __future__ import annotations

__all__ = ["without_cwd", "boot_code"]

# Only `sys` (built in, always loaded) before the filter; absolute paths start with "/" on the systems we run on.
_PRELUDE = "import sys\nsys.path[:] = [p for p in sys.path if p.startswith('/')]\n"


def without_cwd(code: str, prepend: list[str] | tuple[str, ...] = ()) -> str:
    """``code`` preceded by the filter; ``prepend`` (absolute folders) goes first on ``sys.path``."""
    first = f"sys.path[:0] = {list(prepend)!r}\n" if prepend else ""
    return _PRELUDE + first + code


def boot_code(prepend: list[str] | tuple[str, ...] = ()) -> str:
    """Python source for ``python -c`` that runs envvault's command line (arguments after the code) with
    the current folder off ``sys.path``: ``-c`` puts ``''`` first, so a module of the folder the command
    runs in (``envvault/``, ``typing.py``, ``json.py``) would shadow envvault or the standard library.
    Only absolute entries stay; ``prepend`` goes first. The one way envvault starts itself in a folder it
    does not trust (the shell hook; the background snap of checkpoint stamping). It runs ``entry.main``, as the
    console script does (SIGTERM handled as Ctrl-C, the quick and lean paths)."""
    return without_cwd("sys.argv[0] = 'envvault'\nfrom envvault.entry import main\nmain()\n", prepend)
