"""What the text of a path a vault names may be (docs/format.md, "Threat model"): the one rule, read by the
manifest parsers (model/manifest.py, the cache manifest), restore's final-tree check (envvault/safepaths.py)
and export. Text only: whether a path leads out through symlinks on disk is ``safepaths.FinalTree``'s call.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

__all__ = ["path_problem", "link_target_problem", "outward_links", "record_path_problem", "absolute_path"]


# Longer than any path the kernel resolves in one call (PATH_MAX), or deeper than any real tree: refused, so
# that no check walks a path of 40,000 parts one prefix at a time or one call deeper a part.
MAX_PATH = 4096
MAX_PARTS = 256


def _text_problem(path: object, backslash: bool = False) -> str | None:
    """What every path rule refuses first: not a non-empty string, a NUL, (a backslash,) a leading ``/``,
    longer than ``MAX_PATH`` or of more than ``MAX_PARTS`` parts, not UTF-8 text (a lone surrogate: no
    snapshot records one, and no file name or zip member can be made of it)."""
    if not isinstance(path, str) or not path:
        return "not a path"
    if "\x00" in path:
        return "contains NUL"
    if backslash and "\\" in path:
        return "contains a backslash"
    if path.startswith("/"):
        return "is absolute"
    if len(path) > MAX_PATH or path.count("/") >= MAX_PARTS:
        return f"is longer than {MAX_PATH} characters or {MAX_PARTS} parts"
    if not path.isascii():
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            return "is not UTF-8 text"
    return None


def path_problem(path: object) -> str | None:
    """Why ``path`` (a manifest's, relative to the target) cannot name an entry inside it, or None."""
    why = _text_problem(path)
    if why is not None:
        return why
    if ".." in path.split("/"):
        return "contains '..'"
    # an empty or "." part, found without a loop over the parts (a manifest's and a restore's every path)
    if (path.endswith("/") or "//" in path or path == "." or path.startswith("./") or path.endswith("/.")
            or "/./" in path):
        return "is not a normalised path"
    return None


def link_target_problem(path: str, target: object, where: str = "the environment") -> str | None:
    """What the text alone shows wrong with a symlink at ``path`` pointing at ``target``, or None. Exact only
    when no symlink lies on the way: ``FinalTree.link_problem`` makes the decision."""
    if not isinstance(target, str) or not target or "\x00" in target:
        return "has a bad symlink target"
    if target.startswith("/"):
        return f"is a symlink to an absolute path ({target[:200]})"
    why = _text_problem(target)
    if why is not None:
        return f"has a symlink target that {why}"
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if joined == ".." or joined.startswith("../"):
        return f"is a symlink that leads out of {where} ({target})"
    return None


def outward_links(links) -> list[str]:
    """``path -> target`` for each ``(path, target)`` of ``links`` (target None: not a symlink) that is a symlink a
    restore refuses to make (``link_target_problem``): an installer that links files from its cache, a file a
    user replaced by a link."""
    return [f"{path} -> {target}" for path, target in links
            if target is not None and link_target_problem(path, target)]


def record_path_problem(path: object) -> str | None:
    """Why ``path`` cannot be a RECORD path (relative to site-packages; ``../`` only as leading parts, for
    files installed beside it: scripts, headers, data), or None. Such a path becomes a wheel member on
    export and ``restore --into``, so it may hold no NUL, no backslash, and is neither absolute nor holds a
    ``..`` part after the leading ones. (Empty and ``.`` parts are export's to refuse: a folder row ``x/``
    of a RECORD is harmless in a restore.)"""
    why = _text_problem(path, backslash=True)
    if why is not None:
        return why
    parts = path.split("/")
    n = 0
    while n < len(parts) and parts[n] == "..":
        n += 1
    if ".." in parts[n:]:
        return "contains '..'"
    return None


def absolute_path(path: str | os.PathLike) -> Path:
    """A path the user typed (``--venv``, ``--into``, ``$VIRTUAL_ENV``) as the absolute path an environment is
    known by: ``~`` expanded, ``.`` and ``..`` folded as the shell's ``cd`` folds them (``train/../v1`` is
    ``v1``), symlinks kept. Every environment path is compared and cut as a string (snapshot heads, stat
    cache keys, paths under the root), so one typed with ``..`` must not differ from the same one typed
    without."""
    return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
