"""LocalBackend: a vault in a local directory, in the layout of docs/format.md ("Directory tree").

Every file is read with ``O_NOFOLLOW`` and refused when it is not a regular file (``fsutil.read_regular``);
every write goes to ``tmp/`` first and is renamed into place, with the file and its folder fsynced.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from pathlib import Path

from envvault.errors import UsageError
from envvault.vault.backend import DEFAULT_LIMIT, Missing, ObjectInfo, ReadFailed, check_kind, check_name
from envvault.vault.fsutil import (atomic_write, flocked, fsync_dir, link_refused, read_regular, read_regular_at,
                                   storage_error, tmp_name)

__all__ = ["LocalBackend", "VAULT_DIRS", "VAULT_ENTRIES"]

VAULT_DIRS = ("packs", "index", "snapshots", "tags", "locks", "state", "tmp")
# The vault's own top-level entries: the only names a folder may hold for envvault to make a vault in it.
VAULT_ENTRIES = frozenset(VAULT_DIRS) | {"config.json", "settings.json"}
_SUFFIX = {"packs": ".pack", "index": ".idx", "snapshots": ".json", "locks": ".lock", "config": ".json", "tags": ""}


class LocalBackend:
    """The objects of a vault directory ``root`` (see ``backend.py`` for the contract)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.location = str(self.root)
        self.tmp_dir = self.root / "tmp"

    # -- names ---------------------------------------------------------------------------------
    def path(self, kind: str, name: str) -> Path:
        check_kind(kind)
        check_name(name)
        if kind == "config":
            return self.root / f"{name}.json"
        if kind == "packs":
            return self.root / "packs" / name[:2] / f"{name}.pack"
        return self.root / kind / (name + _SUFFIX[kind])

    def where(self, kind: str, name: str) -> str:
        return str(self.path(kind, name))

    def _what(self, kind: str, name: str) -> str:
        """How messages about a damaged file name it (the words envvault has always used)."""
        if kind == "snapshots":
            return f"snapshot {name[:12]}"
        if kind == "tags":
            return f"tag {name!r}"
        if kind == "index":
            return f"index {name}.idx"
        if kind == "packs":
            return f"pack {name}.pack"
        if kind == "config" and name == "config":
            return str(self.path(kind, name))
        return self.path(kind, name).name

    # -- writing -------------------------------------------------------------------------------
    def save(self, kind: str, name: str, data: bytes, *, exclusive: bool = False) -> bool:
        path = self.path(kind, name)
        if kind == "packs":
            self._pack_folder(path)
        if not exclusive:
            atomic_write(path, data, tmp_dir=self.tmp_dir, mode=0o600, vault=True)
            return True
        # Create-if-absent through link(): two creators race, one file wins, neither is ever seen half-written.
        tmp = tmp_name(self.tmp_dir, path.name)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            fsync_dir(path.parent)
            return True
        except OSError as err:
            raise storage_error(err, path, vault=True) from None
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def save_file(self, kind: str, name: str, local_path: Path) -> None:
        """Rename the finished (and fsynced) ``local_path``, which lies on the vault's filesystem, into place."""
        path = self.path(kind, name)
        if kind == "packs":
            self._pack_folder(path)
        try:
            os.replace(local_path, path)
            fsync_dir(path.parent)
        except OSError as err:
            raise storage_error(err, path, vault=True) from None

    @staticmethod
    def _pack_folder(path: Path) -> None:
        try:
            path.parent.mkdir(mode=0o700, exist_ok=True)
        except OSError as err:
            raise storage_error(err, path, vault=True) from None

    # -- reading -------------------------------------------------------------------------------
    def load(self, kind: str, name: str, offset: int = 0, length: int | None = None, *,
             limit: int = DEFAULT_LIMIT) -> bytes:
        path, what = self.path(kind, name), self._what(kind, name)
        try:
            if length is None:
                data = read_regular(path, limit, what)
                return data[offset:] if offset else data
            return read_regular_at(path, offset, length, what)
        except FileNotFoundError:
            raise Missing(f"{what} not found in {self.location}") from None
        except OSError as err:
            why = err.strerror or str(err)
            raise ReadFailed(f"cannot read {path}: {why}", why) from None

    def stat(self, kind: str, name: str) -> ObjectInfo:
        path = self.path(kind, name)
        try:
            return ObjectInfo(name, os.lstat(path).st_size)
        except FileNotFoundError:
            raise Missing(f"{self._what(kind, name)} not found in {self.location}") from None
        except OSError as err:
            why = err.strerror or str(err)
            raise ReadFailed(f"cannot read {path}: {why}", why) from None

    def list(self, kind: str) -> list[str]:
        check_kind(kind)
        if kind == "config":
            return [n for n in ("config", "settings") if os.path.lexists(self.path(kind, n))]
        if kind == "packs":
            out = []
            for sub in self._names(self.root / "packs"):
                folder = self.root / "packs" / sub
                if len(sub) != 2 or os.path.islink(folder) or not folder.is_dir():  # never list through a link
                    continue
                out += [n[:-5] for n in self._names(folder) if n.endswith(".pack") and n[:2] == sub]
            return out
        suffix = _SUFFIX[kind]
        names = self._names(self.root / kind)
        if not suffix:
            return names
        return [n[: -len(suffix)] for n in names if n.endswith(suffix) and len(n) > len(suffix)]

    def newest_first(self, kind: str, names: list[str]) -> list[str]:
        """``names`` of ``kind`` (from ``list``), the most recently written first (by mtime; one ``lstat``
        a name, a name that cannot be read last): ``Vault.locate`` reads index files in this order, so a
        restore of a new snapshot parses the few index files that hold its objects."""
        def written(name: str) -> int:
            try:
                return os.lstat(self.path(kind, name)).st_mtime_ns
            except (OSError, ValueError):
                return -1

        return sorted(names, key=written, reverse=True)

    def _names(self, folder: Path) -> list[str]:
        try:
            return os.listdir(folder)
        except FileNotFoundError:
            return []
        except OSError as err:
            why = err.strerror or str(err)
            raise ReadFailed(f"cannot read {folder}: {why}", why) from None

    def remove(self, kind: str, name: str) -> bool:
        path = self.path(kind, name)
        try:
            os.unlink(path)  # a symlink is removed itself, never what it points to
            return True
        except FileNotFoundError:
            return False
        except OSError as err:
            raise storage_error(err, path, vault=True) from None

    def lock(self, name: str, *, exclusive: bool, wait: bool = True) -> AbstractContextManager[bool]:
        return flocked(self.path("locks", name), exclusive=exclusive, wait=wait, where=self.root)

    # -- the directory itself (local vaults only) -----------------------------------------------
    def exists(self) -> bool:
        return os.path.lexists(self.root / "config.json")

    def looks_like_vault(self) -> bool:
        """True when the folder has a ``snapshots/`` folder (a damaged vault, not another program's folder)."""
        return (self.root / "snapshots").is_dir()

    def check_links(self) -> None:
        """Refuse a vault whose own entries (top-level files and folders, ``packs/<aa>/``) are symlinks: the
        root itself may be one, nothing inside it may (writes through it would land outside the vault)."""
        root = self.root
        for name in sorted(VAULT_ENTRIES):
            if os.path.islink(root / name):
                raise link_refused(root / name)
        try:
            with os.scandir(root / "packs") as entries:
                for entry in entries:
                    if entry.is_symlink():
                        raise link_refused(entry.path)
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as err:
            raise storage_error(err, root / "packs", vault=True) from None

    def create(self) -> None:
        """Make the vault's folders in a new or empty folder (or finish one a killed or concurrent creator
        began). Modes are set only on what this creates: an existing folder (a shared 1777 one) keeps its mode.
        The config is written by the caller (``save("config", "config", ..., exclusive=True)``)."""
        root = self.root
        try:
            try:
                root.mkdir(mode=0o700, parents=True)
                os.chmod(root, 0o700)
            except FileExistsError:
                if not root.is_dir():
                    raise UsageError(f"{root} is not a folder; pass --vault with a new or empty folder") from None
                alien = sorted(set(os.listdir(root)) - VAULT_ENTRIES)
                if alien:
                    shown = ", ".join(alien[:3]) + (f" and {len(alien) - 3} more" if len(alien) > 3 else "")
                    raise UsageError(f"{root} is not empty and not an envvault vault (it holds {shown}); pass "
                                     "--vault with a new or empty folder") from None
            self.check_links()
            for sub in VAULT_DIRS:
                try:
                    (root / sub).mkdir(mode=0o700)
                except FileExistsError:
                    pass
        except OSError as err:
            raise storage_error(err, root, vault=True) from None
