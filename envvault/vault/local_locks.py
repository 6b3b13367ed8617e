"""Lock objects in a local vault's ``locks/`` folder (settings ``lock = "objects"``; docs/format.md,
"settings.json"): the ``LockKeys`` of ``lockobjects.py`` over files, for a vault on a shared filesystem where
flock cannot be trusted. Modification times are the file server's clock, as a bucket's are its server's."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from envvault.errors import CorruptError, StorageError
from envvault.vault.fsutil import atomic_write, read_regular

__all__ = ["DirLockKeys"]


class DirLockKeys:
    """Keys ``locks/<name>.json`` (and ``gc-epoch``, kept as ``locks/gc-epoch``) under a vault's root."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.lost: list[str] = []
        self.on_gc_epoch: Callable[[str], None] | None = None

    def _path(self, key: str) -> Path:
        rel = "locks/gc-epoch" if key == "gc-epoch" else key
        parts = rel.split("/")
        if len(parts) != 2 or parts[0] != "locks" or parts[1] in ("", ".", "..") or "\x00" in rel:
            raise ValueError(f"bad lock key {key!r}")
        return self.root / rel

    def list_meta(self, prefix: str) -> list[dict]:
        folder = self._path(prefix + "x").parent
        out = []
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return out
        for name in names:
            try:
                st = os.stat(folder / name, follow_symlinks=False)
            except FileNotFoundError:
                continue
            out.append({"path": prefix + name, "size": st.st_size,
                        "last_modified": datetime.fromtimestamp(st.st_mtime, tz=timezone.utc)})
        return out

    def get_key(self, key: str, limit: int) -> bytes | None:
        """A regular file of at most ``limit`` bytes (no FIFO, device or link is opened), else None; a
        StorageError when it is there but cannot be read (permissions, I/O), as a bucket's failed GET is."""
        path = self._path(key)
        try:
            return read_regular(path, limit, key)
        except (FileNotFoundError, CorruptError):
            return None
        except OSError as err:
            raise StorageError(f"cannot read {path}: {err.strerror or err}") from None

    def put_key(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(exist_ok=True)
        atomic_write(path, data, tmp_dir=self.root / "tmp", mode=0o644, vault=True)

    def delete_key(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def exists_key(self, key: str) -> bool:
        return os.path.lexists(self._path(key))
