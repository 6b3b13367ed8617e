"""Writing files once and durably: temp name, fsync, rename, fsync the directory."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from contextlib import contextmanager
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Iterable, Iterator

from envvault.errors import CorruptError, RefusedError, StorageError

__all__ = ["atomic_write", "current_umask", "flocked", "fsync_dir", "storage_error", "tmp_name", "open_regular", "read_regular", "read_regular_at",
           "link_refused", "write_nofollow", "open_regular_fd"]

# Files of the vault's own tree are opened without following a symlink at their last component; a FIFO or
# device is never read (O_NONBLOCK: opening a FIFO does not wait for a writer).
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def link_refused(path: Path | str) -> RefusedError:
    """The one line for a symlink found inside a vault (docs/format.md, "Threat model")."""
    return RefusedError(f"{path} is a symlink; envvault does not follow links inside a vault (writes could land "
                        "outside it): replace it with the real file or folder")


def open_regular(path: Path | str, what: str, follow: bool = False) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file ``path`` inside a vault and its stat: a symlink there (unless
    ``follow``), a FIFO or a device is refused (CorruptError), never waited on. The caller closes it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow else _NOFOLLOW))
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise CorruptError(f"{what} is a symlink ({path}); envvault does not follow links inside a vault") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CorruptError(f"{what} is not a regular file ({path})")
    return fd, st


def open_regular_fd(path: Path | str, follow: bool = True) -> int | None:
    """A descriptor of ``path`` (symlinks followed: an environment's files may be links; not at its last
    part without ``follow``: ELOOP) when it is a regular file, else None (a FIFO or a device is never waited
    on: O_NONBLOCK). OSError as ``os.open`` raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW))
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    return None


def read_regular_at(path: Path | str, offset: int, length: int, what: str) -> bytes:
    """At most ``length`` bytes at ``offset`` of the regular file ``path`` (opened as :func:`read_regular`
    does); fewer when the file is shorter."""
    fd, _st = open_regular(path, what)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def read_regular(path: Path | str, limit: int, what: str, *, follow: bool = False) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes, opened without following a symlink
    (``follow``: a symlink to a regular file is read too, as an environment's files may be).

    A symlink, a FIFO, a device or a folder, or a file over ``limit``, is a CorruptError naming ``what``;
    a missing file raises FileNotFoundError and other failures their OSError."""
    return read_regular_stat(path, limit, what, follow=follow)[0]


def read_regular_stat(path: Path | str, limit: int, what: str, *, follow: bool = False) -> tuple[bytes, os.stat_result]:
    """``read_regular``, with the stat of the file read (taken from its open descriptor)."""
    fd, st = open_regular(path, what, follow)
    try:
        if st.st_size > limit:
            raise CorruptError(f"{what} is {st.st_size} bytes, over the limit of {limit}")
        chunks, total = [], 0
        while True:
            # the whole file in one read (no copy to join them: 3 ms of the quick status's 6 MB stat cache),
            # then blocks for one that grows while read
            block = os.read(fd, min(st.st_size + 1 if not chunks else 1 << 20, limit + 1 - total))
            if not block:
                break
            chunks.append(block)
            total += len(block)
            if total > limit:  # grew while read
                raise CorruptError(f"{what} is over the limit of {limit} bytes")
        return b"".join(chunks), st
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to ``fd`` (``os.write`` may write fewer), or an OSError."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_nofollow(path: Path, data: bytes) -> None:
    """Replace the content of the small file ``path`` in place, refusing a symlink there (RefusedError); every
    byte is written or an OSError says why (a disk full: a guard then stops before its command runs)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o600)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise link_refused(path) from None
        raise
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def tmp_name(directory: Path, stem: str) -> Path:
    return directory / f".{stem}.{os.getpid()}.{os.urandom(4).hex()}.tmp"


def tmp_owner(name: str) -> int | None:
    """The process id in a name ``tmp_name`` made (``.<stem>.<pid>.<8 hex>.tmp``), else None."""
    parts = name.split(".")
    if len(parts) < 5 or parts[0] or parts[-1] != "tmp" or len(parts[-2]) != 8 or not parts[-3].isdigit():
        return None
    return int(parts[-3])


def current_umask() -> int | None:
    """This process's umask, read without setting it (``os.umask`` sets it for every thread while it looks):
    Linux's ``/proc/self/status`` (from 4.7); None where that does not say it."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def storage_error(err: OSError, where: Path | str, *, vault: bool = False) -> StorageError:
    """One clear line for the OSErrors a write can meet. ``vault``: ``where`` lies in the vault (or its
    machine-local state), whose way out is another ``--vault``; otherwise it is a file of an environment, a
    cache or an output the user named, whose way out is that disk or that folder's owner."""
    if err.errno == errno.ENOSPC:
        return StorageError(f"no space left on device while writing {where}; free space and run again"
                            + (" (nothing was committed)" if vault else ""))
    if err.errno == errno.EROFS:
        if vault:
            return StorageError(f"the vault at {where} is on a read-only filesystem; pass --vault PATH on a writable disk")
        return StorageError(f"{where} is on a read-only filesystem; make it writable (or choose another destination) "
                            "and run again")
    if err.errno in (errno.EACCES, errno.EPERM):
        if vault:
            return StorageError(f"permission denied writing {where}; check ownership of the vault or pass --vault PATH")
        if err.errno == errno.EPERM and os.geteuid() == 0:  # root is refused: the file's flags or the mount
            return StorageError(f"operation not permitted on {where}, even as root: an immutable or append-only "
                                "flag on it or its folder (see `lsattr -d`), or a filesystem that refuses it; fix that "
                                "and run again")
        return StorageError(f"permission denied writing {where}; run as the owner of that folder (or choose another "
                            "destination)")
    if err.errno == errno.EDQUOT:
        return StorageError(f"disk quota exceeded while writing {where}; free space and run again")
    return StorageError(f"cannot write {where}: {err.strerror or err}")


def atomic_write(path: Path, data: bytes, *, tmp_dir: Path | None = None, mode: int = 0o600,
                 durable: bool = True, vault: bool = False) -> os.stat_result:
    """Write ``data`` to ``path`` so that ``path`` either does not change or holds all of ``data``; the stat
    of the file written, taken before it was renamed to ``path`` (its inode, size and mtime stay; its ctime
    moves with the rename), so that it is this write's even when another writer replaces ``path`` at once.

    ``durable=False`` skips the fsyncs, for caches that may be lost in a crash but never seen half-written.
    ``vault``: ``path`` lies in the vault (``storage_error``).
    """
    tmp_dir = tmp_dir or path.parent
    tmp = tmp_name(tmp_dir, path.name)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
            written = os.fstat(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
        return written
    except OSError as err:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise storage_error(err, path, vault=vault) from None


@contextmanager
def flocked(path: Path, *, exclusive: bool, wait: bool = True, where: Path | None = None) -> Iterator[bool]:
    """Hold an flock on ``path`` (created with mode 0600) for the block. Yields True once held; with
    ``wait=False`` yields False at once when another process holds it. Closing the descriptor releases it.
    A lock file (every one is a vault's) that cannot be opened is a StorageError naming ``where`` (default:
    the lock file)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise link_refused(path) from None
        raise storage_error(err, where or path, vault=True) from None
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def makedirs_recording(path: str, created: list[str], in_the_way) -> None:
    """``mkdir -p path`` that appends each folder it made to ``created``, outermost first (so a failed
    restore can remove them again). A non-folder on the way raises ``in_the_way(blocking_path)``; another
    failure is a storage error naming the folder."""
    missing = []
    p = path
    while not os.path.isdir(p):
        if os.path.lexists(p):
            if os.path.isdir(p):
                break  # made meanwhile (by another process, or a thread): a folder is not in the way
            raise in_the_way(p)
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            continue
        except OSError as err:
            raise storage_error(err, d) from None
        created.append(d)


def process_alive(pid: int) -> bool:
    """Whether a process of this host (and PID namespace) has the id ``pid``: one of another user's counts;
    an id no process can have (0, negative, too large: ``os.kill`` would signal a group or fail) does not."""
    if not 0 < pid < 1 << 31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_folders(created: Iterable[str]) -> None:
    """Remove the folders a failed run made (``makedirs_recording``'s ``created``), deepest first, each only
    while it is empty; what cannot be removed stays."""
    for d in sorted(created, key=lambda p: (-p.count(os.sep), p)):
        try:
            os.rmdir(d)
        except OSError:
            pass
