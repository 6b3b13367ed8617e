"""The storage seam: where a vault's shared files live (restic's backend shape).

A :class:`Backend` stores opaque objects, each under a *kind* and a *name*, and knows nothing of what they
hold. The vault (``envvault/vault/store.py``) decides every name and checks every byte it reads (ids are
hashes), so a backend needs no trust and no format knowledge. Kinds and names:

============  ==============================  ============================================  =====================
kind          name                            LocalBackend path (docs/format.md)            written
============  ==============================  ============================================  =====================
``config``    ``config``, ``settings``        ``config.json``, ``settings.json``            once (exclusive) / replaced
``packs``     pack id (64 hex)                ``packs/<aa>/<id>.pack``                      once, by ``save_file``
``index``     pack id                         ``index/<id>.idx``                            once, by ``save``/``save_file``
``snapshots`` snapshot id                     ``snapshots/<id>.json``                       once (the commit point)
``tags``      tag name (checked by the vault) ``tags/<name>``                               replaced
``locks``     lock name (``vault``, ...)      ``locks/<name>.lock``                         through :meth:`lock` only
============  ==============================  ============================================  =====================

Contract every backend keeps:

- ``save`` is atomic: a reader sees the old object, no object, or all of ``data``; never part of it. Once it
  returns, the object is durable. With ``exclusive=True`` it creates the object only when absent and returns
  False (writing nothing) when it exists: two creators race, one wins. Otherwise it returns True.
- ``save_file`` stores a finished local file (a pack or an index written to ``vault.state.tmp_dir``) and
  consumes it: on return the local file is gone (moved or uploaded then deleted). ``LocalBackend`` renames
  it, so the file must lie on the vault's filesystem (``state.tmp_dir`` does).
- ``load`` returns ``length`` bytes at ``offset`` (fewer when the object is shorter), or with ``length=None``
  the whole object from ``offset``, refusing an object of more than ``limit`` bytes.
- Errors are ``envvault.errors``: an absent object is a :class:`Missing` (a ``NotFoundError``); an object
  that is not a plain object (a symlink, a FIFO, a folder) or is over ``limit`` is a ``CorruptError``; an I/O
  failure reading is a :class:`ReadFailed` (a ``StorageError`` carrying the system's word in ``why``); a
  failed write is a ``StorageError`` (full disk, read-only, permission) that says what to do.
- ``list(kind)`` returns the names present (in no particular order), ``[]`` for an empty or absent kind;
  entries that cannot be such objects (temp files, another suffix) are not listed.
- ``remove`` deletes one object; it returns False when there was none.
- ``lock(name, exclusive=..., wait=...)`` is a context manager that yields True once the lock is held, or
  False at once when ``wait=False`` and another holder has it. Snaps and restores hold ``vault`` shared, gc
  exclusive (docs/format.md, "Concurrency").
- ``location`` names the vault in messages ("no snapshot ... in {location}"); it never holds credentials.
  ``where(kind, name)`` names one object the same way (a path, or a URL without credentials).

Machine-local files (stat caches, markers, temp files) are not a backend's business: see ``state.py``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import NamedTuple, Protocol
else:
    from envvault.runtime_types import NamedTuple, Protocol

from envvault.errors import NotFoundError, StorageError

__all__ = ["Backend", "KINDS", "ObjectInfo", "Missing", "ReadFailed", "DEFAULT_LIMIT", "check_kind", "check_name"]

KINDS = ("config", "packs", "index", "snapshots", "tags", "locks")
DEFAULT_LIMIT = 512 << 20  # the largest document a vault reads whole (MAX_DOC_BYTES)


class Missing(NotFoundError):
    """The object asked for does not exist."""


class ReadFailed(StorageError):
    """An object exists but could not be read (an I/O error); ``why`` is the system's word for it."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


class ObjectInfo(NamedTuple):
    """A stored object's name and size (a ``NamedTuple``: the quick ``status`` imports this module, and not
    ``dataclasses``)."""

    name: str
    size: int


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown backend kind {kind!r}")
    return kind


def check_name(name: str) -> str:
    """``name`` when it can name an object (one path component, never ``.``/``..``), else a ValueError: the
    vault chooses every name (ids, checked tag names), so a bad one is a bug, never a path."""
    if not isinstance(name, str) or not name or "/" in name or "\0" in name or name in (".", ".."):
        raise ValueError(f"bad object name {name!r}")
    return name


class Backend(Protocol):
    """Objects under (kind, name). See the module docstring for the contract."""

    location: str

    def where(self, kind: str, name: str) -> str:
        """One object's place, for messages (no credentials)."""
        ...

    def save(self, kind: str, name: str, data: bytes, *, exclusive: bool = False) -> bool:
        """Store ``data`` atomically and durably; with ``exclusive``, only when absent (False: it existed)."""
        ...

    def save_file(self, kind: str, name: str, local_path: Path) -> None:
        """Store the finished file ``local_path`` (consumed: gone on return)."""
        ...

    def load(self, kind: str, name: str, offset: int = 0, length: int | None = None, *,
             limit: int = DEFAULT_LIMIT) -> bytes:
        """Bytes of one object: ``length`` at ``offset`` (fewer at its end), or all from ``offset`` when
        ``length`` is None (an object over ``limit`` bytes is a CorruptError)."""
        ...

    def stat(self, kind: str, name: str) -> ObjectInfo:
        """Size of one object (Missing when absent)."""
        ...

    def list(self, kind: str) -> list[str]:
        """Names of the objects of ``kind``."""
        ...

    def remove(self, kind: str, name: str) -> bool:
        """Delete one object; False when it was absent."""
        ...

    def lock(self, name: str, *, exclusive: bool, wait: bool = True) -> AbstractContextManager[bool]:
        """Hold the named lock for the block; yields False at once when ``wait=False`` and it is busy."""
        ...
