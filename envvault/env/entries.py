"""What an entry of a site folder is to every environment reader (``venv.py``, ``system.py``): a
distribution's metadata folder, pip's stash of one, one whose name no document can hold, or anything else.
The readers and the seam (``reader.py``) import it; it imports only ``model.encoding``'s one rule for such a
name."""

from __future__ import annotations

from envvault.model.encoding import not_utf8

__all__ = ["entry_kind"]

_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")


def entry_kind(name: str) -> str | None:
    """What a site folder's entry ``name`` is to every reader: "dist" (a ``.dist-info``, ``.egg-info`` or
    ``.egg-link``), "stash" (one of those pip moved aside while it installs or uninstalls, its name begun with
    ``~``, which no project name is: pip leaves it out as an invalid distribution, and so does a scan, with a
    warning), "unnamed" (one whose name is not UTF-8 text, which no snapshot can record: left out with a
    warning too), None for anything else."""
    if not name.endswith(_SUFFIXES):
        return None
    if name.startswith("~"):
        return "stash"
    return "unnamed" if not_utf8(name) else "dist"
