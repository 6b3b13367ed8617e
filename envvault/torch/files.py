"""Reading files of a checkpoint folder a stranger may have made: only regular files, never blocking on a
FIFO or device, and only up to a size (checkpoint readers, stamp sidecars, a repository's ``.git`` files)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from envvault.errors import UsageError

__all__ = ["MAX_SIDE_BYTES", "open_regular", "read_small"]

MAX_SIDE_BYTES = 1 << 20  # stamp records, sidecars, config/index JSON and DCP byte entries read into memory


def open_regular(p: Path) -> BinaryIO:
    """``p`` opened for reading, only if it is a regular file. A FIFO, device or socket is refused with
    :class:`UsageError` without blocking: opened with ``O_NONBLOCK`` and checked with ``fstat`` before
    anything is read. Unlike the vault's own reads (``fsutil.read_regular``) a symlink is followed: the
    Hugging Face cache links every checkpoint file to a blob."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{p}: not a regular file (a FIFO, device or socket); envvault reads only files")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_small(p: Path, limit: int = MAX_SIDE_BYTES) -> bytes | None:
    """The bytes of regular file ``p`` when it holds at most ``limit`` bytes, else None. Raises
    :class:`UsageError` for what is not a regular file and ``OSError`` when it cannot be read."""
    with open_regular(p) as f:
        data = f.read(limit + 1)
    return data if len(data) <= limit else None
