"""What an entry of a site folder is to every environment reader (``venv.py``, ``system.py``): a
distribution's metadata folder, pip's stash of one, or anything else. A leaf: the readers and the seam
(``reader.py``) import it, it imports nothing."""

from __future__ import annotations

__all__ = ["entry_kind"]

_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")


def entry_kind(name: str) -> str | None:
    """What a site folder's entry ``name`` is to every reader: "dist" (a ``.dist-info``, ``.egg-info`` or
    ``.egg-link``), "stash" (one of those pip moved aside while it installs or uninstalls, its name begun with
    ``~``, which no project name is: pip leaves it out as an invalid distribution, and so does a scan, with a
    warning), None for anything else."""
    if not name.endswith(_SUFFIXES):
        return None
    return "stash" if name.startswith("~") else "dist"
