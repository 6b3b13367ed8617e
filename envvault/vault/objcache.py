"""The node-local cache in front of a remote vault (docs/format.md, "Object storage").

Immutable objects only (packs, index files, snapshot documents: their names never change meaning), each
fetched whole once, checked against its name where the name is its hash (packs, snapshots), then read
locally. Bounded: ``ENVVAULT_CACHE_SIZE`` (bytes, or with a K/M/G/T suffix; default 20G); past it the least
recently used files go (reads touch a file's mtime). Several processes on one node share it: files appear
by rename, and a file evicted under a reader is fetched again.

Layout under ``cache_root()`` (``$ENVVAULT_CACHE_DIR``, else ``$XDG_CACHE_HOME/envvault``, else
``~/.cache/envvault``)::

    vaults/<key>/objects/{packs,index,snapshots}/<aa>/<name>     <key>: from the vault_id of its config.json
    vaults/<key>/{state,tmp,locks}/          the vault's machine-local state (envvault/vault/state.py)
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

from envvault.errors import CorruptError, StorageError, UsageError

__all__ = ["ObjectCache", "cache_root", "cache_limit", "vault_cache_dir"]

_HASHED = ("packs", "snapshots")  # kinds whose name is the BLAKE3 of their bytes
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.I)


def cache_root() -> Path:
    given = os.environ.get("ENVVAULT_CACHE_DIR")
    if given:
        return Path(given).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser().absolute() / "envvault"


def cache_limit() -> int:
    text = os.environ.get("ENVVAULT_CACHE_SIZE", "20G")
    m = _SIZE.match(text)
    if not m:
        raise UsageError(f"ENVVAULT_CACHE_SIZE={text!r} is not a size (bytes, or a number with K, M, G or T)")
    return int(float(m.group(1)) * (1024 ** " KMGT".index((m.group(2) or " ").upper())))


def vault_cache_dir(identity: str) -> Path:
    """The cache folder of one remote vault (``identity``: its endpoint and URL)."""
    from envvault.model.encoding import object_id

    return cache_root() / "vaults" / object_id(identity.encode())[:20]


class ObjectCache:
    def __init__(self, root: Path, limit: int | None = None):
        self.root = Path(root)
        self.limit = cache_limit() if limit is None else limit
        self.tmp = self.root / "tmp"
        self._total: int | None = None
        self._mutex = threading.Lock()

    def path(self, kind: str, name: str) -> Path:
        return self.root / kind / name[:2] / name

    def _tmpfile(self) -> tuple[int, str]:
        self.tmp.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=".fetch.", suffix=".tmp", dir=self.tmp)

    def _install(self, kind: str, name: str, tmp: str) -> None:
        dest = self.path(kind, name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        size = os.stat(tmp).st_size
        os.replace(tmp, dest)
        self._grow(size)

    def put_stream(self, kind: str, name: str, result: Any, where: str) -> None:
        """Store an obstore GetResult (streamed to a temp file, hashed on the way)."""
        import blake3

        fd, tmp = self._tmpfile()
        try:
            h = blake3.blake3()
            with os.fdopen(fd, "wb") as out:
                for chunk in result.stream(min_chunk_size=4 << 20):
                    h.update(chunk)
                    out.write(chunk)
            if kind in _HASHED and h.hexdigest() != name:
                raise CorruptError(f"{where} does not match its name (damaged in the bucket or on the way); run "
                                   "`envvault verify --read-data`")
            self._install(kind, name, tmp)
        except OSError as err:
            raise StorageError(f"cannot write the local cache {self.root}: {err.strerror or err}") from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def put_bytes(self, kind: str, name: str, data: bytes) -> None:
        try:
            fd, tmp = self._tmpfile()
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            self._install(kind, name, tmp)
        except OSError:
            pass  # a cache: the next read fetches it

    def adopt(self, kind: str, name: str, local_path: Path) -> None:
        """Take a finished local file (a pack this node uploaded) into the cache (consumed)."""
        try:
            dest = self.path(kind, name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            size = os.stat(local_path).st_size
            os.replace(local_path, dest)
            self._grow(size)
        except OSError:
            Path(local_path).unlink(missing_ok=True)

    def read(self, kind: str, name: str, offset: int, length: int | None, limit: int, where: str) -> bytes | None:
        """Bytes of a cached object, or None when it is not (or no longer) here."""
        path = self.path(kind, name)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if length is None and size > limit:
                    raise CorruptError(f"{where} is {size} bytes, over the limit of {limit}")
                f.seek(offset)
                data = f.read() if length is None else f.read(max(length, 0))
            try:
                os.utime(path)  # least recently used goes first
            except OSError:
                pass
            return data
        except FileNotFoundError:
            return None

    def discard(self, kind: str, name: str) -> None:
        try:
            os.unlink(self.path(kind, name))
        except OSError:
            pass

    def usage(self) -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(self.root):
            if os.path.basename(dirpath) == "tmp":
                continue
            for f in files:
                try:
                    total += os.stat(os.path.join(dirpath, f)).st_size
                except OSError:
                    pass
        return total

    def _grow(self, size: int) -> None:
        with self._mutex:
            if self._total is None:
                self._total = self.usage()
            else:
                self._total += size
            if self._total > self.limit:
                self._evict()

    def _evict(self) -> None:
        """Delete least recently used files until the cache holds at most 90 % of its limit."""
        entries = []
        for kind in ("packs", "index", "snapshots"):
            for dirpath, _dirs, files in os.walk(self.root / kind):
                for f in files:
                    p = os.path.join(dirpath, f)
                    try:
                        st = os.stat(p)
                    except OSError:
                        continue
                    entries.append((st.st_mtime, st.st_size, p))
        total = sum(e[1] for e in entries)
        entries.sort()
        target = int(self.limit * 0.9)
        for _mtime, size, p in entries:
            if total <= target:
                break
            try:
                os.unlink(p)
                total -= size
            except OSError:
                pass
        self._total = total
