"""Writing files once and durably: temp name, fsync, rename, fsync the directory."""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from envvault.errors import StorageError

__all__ = ["atomic_write", "flocked", "fsync_dir", "storage_error", "tmp_name"]


def tmp_name(directory: Path, stem: str) -> Path:
    return directory / f".{stem}.{os.getpid()}.{os.urandom(4).hex()}.tmp"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def storage_error(err: OSError, where: Path | str) -> StorageError:
    """One clear line for the OSErrors a vault write can meet."""
    if err.errno == errno.ENOSPC:
        return StorageError(f"no space left on device while writing {where}; free space and run again (nothing was committed)")
    if err.errno == errno.EROFS:
        return StorageError(f"the vault at {where} is on a read-only filesystem; pass --vault PATH on a writable disk")
    if err.errno in (errno.EACCES, errno.EPERM):
        return StorageError(f"permission denied writing {where}; check ownership of the vault or pass --vault PATH")
    if err.errno == errno.EDQUOT:
        return StorageError(f"disk quota exceeded while writing {where}; free space and run again")
    return StorageError(f"cannot write {where}: {err.strerror or err}")


def atomic_write(path: Path, data: bytes, *, tmp_dir: Path | None = None, mode: int = 0o600, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that ``path`` either does not change or holds all of ``data``.

    ``durable=False`` skips the fsyncs, for caches that may be lost in a crash but never seen half-written.
    """
    tmp_dir = tmp_dir or path.parent
    tmp = tmp_name(tmp_dir, path.name)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except OSError as err:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise storage_error(err, path) from None


@contextmanager
def flocked(path: Path, *, exclusive: bool, wait: bool = True, where: Path | None = None) -> Iterator[bool]:
    """Hold an flock on ``path`` (created with mode 0600) for the block. Yields True once held; with
    ``wait=False`` yields False at once when another process holds it. Closing the descriptor releases it.
    A lock file that cannot be opened is a StorageError naming ``where`` (default: the lock file)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as err:
        raise storage_error(err, where or path) from None
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
