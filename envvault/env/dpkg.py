"""Which files the system package manager owns: dpkg's file lists (``<admindir>/info/<package>.list``, one
absolute path a line), read as text, never by running ``dpkg -S`` (one process per question is slow, and a
copied prefix in a test needs its own lists). Admin dir: ``$ENVVAULT_DPKG_ADMINDIR``, else ``/var/lib/dpkg``
(docs/format.md, "Environment kinds")."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DpkgOwners", "admindir", "owners_under"]

_DEFAULT = "/var/lib/dpkg"
_LIST_LIMIT = 64 << 20  # one package's list: far beyond any real one


def admindir() -> Path:
    return Path(os.environ.get("ENVVAULT_DPKG_ADMINDIR") or _DEFAULT)


class DpkgOwners:
    """Path -> dpkg package, for the paths under ``folders`` (absolute; the rest is not kept)."""

    def __init__(self, folders: list[str] | tuple[str, ...], base: Path | None = None) -> None:
        self.base = base or admindir()
        self._prefixes = tuple(sorted({f.rstrip("/") + "/" for f in folders}))
        self._owner: dict[str, str] | None = None

    def _load(self) -> dict[str, str]:
        out: dict[str, str] = {}
        info = self.base / "info"
        try:
            names = sorted(e.name for e in os.scandir(info) if e.name.endswith(".list"))
        except OSError:
            return out  # no dpkg here: nothing is system-managed by it
        wanted = self._prefixes
        for name in names:
            package = name[: -len(".list")].split(":", 1)[0]
            try:
                with open(info / name, "rb") as f:
                    data = f.read(_LIST_LIMIT)
            except OSError:
                continue
            for raw in data.decode("utf-8", "surrogateescape").splitlines():
                if raw.startswith(wanted) or f"{raw}/" in wanted:
                    out.setdefault(raw, package)
        return out

    @property
    def owners(self) -> dict[str, str]:
        if self._owner is None:
            self._owner = self._load()
        return self._owner

    def owner(self, path: str | os.PathLike) -> str | None:
        """The package whose list names ``path`` (absolute, as dpkg writes it), or None."""
        return self.owners.get(os.fspath(path))


_MEMO: dict[tuple, DpkgOwners] = {}


def owners_under(folders: list[str] | tuple[str, ...]) -> DpkgOwners:
    """One ``DpkgOwners`` per admin dir and folder set in this process (the lists are read once)."""
    key = (str(admindir()), tuple(sorted(folders)))
    if key not in _MEMO:
        _MEMO[key] = DpkgOwners(list(folders))
    return _MEMO[key]
