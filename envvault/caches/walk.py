"""List what a cache tree holds, leaving out what torch and Triton have not finished writing.

What is left out, and why (sources: torch 2.13, Triton 3.6):

- ``*.tmp`` files: Inductor's ``write_atomic`` (``torch/_inductor/codecache.py``) writes
  ``.<pid>.<thread>.tmp`` then renames it; ``cutedsl_cache`` writes ``*.o.tmp`` via ``mkstemp``.
- ``tmp.pid_<pid>_<uuid>/`` folders: Triton's ``FileCacheManager.put`` (``triton/runtime/cache.py``) writes
  each file there, ``os.replace``-s it into the kernel folder and removes the folder.
- ``tmp.<uuid>/`` folders: Inductor's ``TritonBundler.read_and_emit`` (``torch/_inductor/triton_bundler.py``)
  fills one, then renames it to the kernel folder.
- the content of ``locks/``: lock files for ``filelock`` (``codecache.get_lock_dir``); only the folder is
  noted, so that a restore recreates it empty.
- ``.<name>.envvault-<pid>-<run>.tmp/`` folders: envvault's own cache restore builds a root that did not
  exist there, beside it, and renames it into place (``restore_tree.py``); a killed restore leaves it, and
  the next restore of that root removes it (``restore_temp_owner`` names the root and the process).

Symbolic links are recorded with their target and never followed; ``escapes_root`` says when the target
lies outside the root, so an archiver can refuse to recreate it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from envvault.model.records import dataclass
from pathlib import Path

from envvault.runtime_types import Protocol

from ..errors import EnvironmentProblem, NotFoundError
from ..model.encoding import not_utf8

__all__ = ["CacheFile", "walk_cache", "stable_read", "is_transient", "restore_temp_name", "restore_temp_owner"]

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_TRANSIENT_DIR = re.compile(rf"tmp\.(pid_\d+_)?{_UUID}")  # Triton's and Inductor's
_RESTORE_TEMP = re.compile(r"\.(.+)\.envvault-(\d+)-[0-9a-f]{6}\.tmp", re.DOTALL)  # ours: restore_temp_name
_RUN = os.urandom(3).hex()  # with the pid, keeps two restores (or a killed one's leftovers) apart
_LOCKS = "locks"


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheFile:
    """One entry of a cache tree.

    ``path`` is relative to the root, with ``/`` separators. ``is_dir`` entries are folders kept only so
    a restore recreates them (empty folders, ``locks/``). ``target`` is the link text of a symlink.
    """

    path: str
    size: int
    mode: int
    mtime_ns: int
    is_dir: bool = False
    is_symlink: bool = False
    target: str | None = None
    escapes_root: bool = False


def restore_temp_name(final: str, pid: int) -> str:
    """The temp name a cache restore stages ``final`` under, beside it: ``.<name>.envvault-<pid>-<run>.tmp``, for
    a file and for a whole root that did not exist (``restore_tree.py``); ``is_transient`` knows both."""
    head, name = os.path.split(final)
    return os.path.join(head, f".{name}.envvault-{pid}-{_RUN}.tmp")


def restore_temp_owner(name: str) -> tuple[str, int] | None:
    """``(name of the entry it stands in for, pid of the restore that made it)`` for a temp name that
    ``restore_temp_name`` gives, else None."""
    m = _RESTORE_TEMP.fullmatch(name)
    return (m.group(1), int(m.group(2))) if m else None


def is_transient(relpath: str, *, is_dir: bool) -> bool:
    """True for a name torch or Triton uses only while writing (see the module docstring)."""
    name = relpath.rsplit("/", 1)[-1]
    if is_dir:
        return bool(_TRANSIENT_DIR.fullmatch(name) or _RESTORE_TEMP.fullmatch(name))
    return name.endswith(".tmp")


def walk_cache(root: Path, skipped: list[str] | None = None) -> list[CacheFile]:
    """Every regular file, symlink and empty folder under ``root``, sorted by path.

    An entry whose name (or a symlink whose target) is not UTF-8 is left out, and its path (as Python
    decodes it) added to ``skipped``: manifests record names as UTF-8 text (``safepaths.not_utf8``).

    Leaves out transient files and folders and the content of a top-level ``locks/`` (which is noted as
    an ``is_dir`` entry). Sockets, FIFOs and devices are skipped. Entries that vanish during the walk
    (a compile replacing them) are skipped too. Raises ``NotFoundError`` when ``root`` is not a folder and
    ``EnvironmentProblem`` when a folder cannot be read.
    """
    root = Path(root)
    try:
        if not stat.S_ISDIR(os.stat(root).st_mode):
            raise NotFoundError(f"cache root {root} is not a folder")
    except FileNotFoundError:
        raise NotFoundError(f"cache root {root} does not exist") from None
    real_root = os.path.realpath(root)
    found: list[CacheFile] = []
    _walk(str(root), "", real_root, found, skipped if skipped is not None else [])
    found.sort(key=lambda f: f.path)
    return found


def _walk(folder: str, prefix: str, real_root: str, found: list[CacheFile], skipped: list[str]) -> None:
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise EnvironmentProblem(f"cannot read cache folder {folder}: {exc.strerror}") from exc
    if not entries and prefix:
        _note_dir(folder, prefix.rstrip("/"), found)
    for entry in entries:
        rel = prefix + entry.name
        if not_utf8(entry.name):
            skipped.append(rel)
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            link = _link(entry.path, rel, st, real_root)
            if not_utf8(link.target):
                skipped.append(rel)
                continue
            found.append(link)
        elif stat.S_ISDIR(st.st_mode):
            if is_transient(rel, is_dir=True):
                continue
            if rel == _LOCKS:
                _note_dir(entry.path, rel, found)
                continue
            _walk(entry.path, rel + "/", real_root, found, skipped)
        elif stat.S_ISREG(st.st_mode) and not is_transient(rel, is_dir=False):
            found.append(
                CacheFile(path=rel, size=st.st_size, mode=stat.S_IMODE(st.st_mode), mtime_ns=st.st_mtime_ns)
            )


def _note_dir(path: str, rel: str, found: list[CacheFile]) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    found.append(CacheFile(path=rel, size=0, mode=stat.S_IMODE(st.st_mode), mtime_ns=st.st_mtime_ns, is_dir=True))


def _link(path: str, rel: str, st: os.stat_result, real_root: str) -> CacheFile:
    target = os.readlink(path)
    # Lexical check first (an absolute or ../ target), then where the link really leads today.
    lexical = os.path.normpath(os.path.join(real_root, os.path.dirname(rel), target))
    resolved = os.path.realpath(path)
    escapes = not (_inside(lexical, real_root) and _inside(resolved, real_root))
    return CacheFile(
        path=rel,
        size=st.st_size,
        mode=stat.S_IMODE(st.st_mode),
        mtime_ns=st.st_mtime_ns,
        is_symlink=True,
        target=target,
        escapes_root=escapes,
    )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class _StatLike(Protocol):
    @property
    def st_size(self) -> int: ...
    @property
    def st_mtime_ns(self) -> int: ...


def stable_read(path: Path, expected_stat: os.stat_result | CacheFile | _StatLike) -> bytes | None:
    """The bytes of ``path``, or None when the file is not the one ``expected_stat`` describes.

    None means: it vanished, it is no longer a regular file, its size or mtime (and, given an
    ``os.stat_result``, its inode) differ from ``expected_stat`` (a ``CacheFile`` or an ``os.stat_result``),
    or it changed or was replaced while being read (a compile is writing it). The caller skips such an entry with a warning. Symlinks are not
    followed. Other read errors raise ``EnvironmentProblem``.
    """
    want_size, want_mtime = _size_mtime(expected_stat)
    want_inode = getattr(expected_stat, "st_ino", None), getattr(expected_stat, "st_dev", None)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink now stands where the file was
            return None
        raise EnvironmentProblem(f"cannot read cache file {path}: {exc.strerror}") from exc
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode) or (before.st_size, before.st_mtime_ns) != (want_size, want_mtime):
            return None
        if want_inode[0] is not None and want_inode != (before.st_ino, before.st_dev):
            return None  # replaced since expected_stat was taken
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        after = os.fstat(fd)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot read cache file {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) != want_size or _sig(after) != _sig(before):
        return None
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return None
    if (now.st_ino, now.st_dev) != (before.st_ino, before.st_dev) or _sig(now) != _sig(before):
        return None  # replaced (os.replace) or rewritten while we read
    return data


def _size_mtime(expected: object) -> tuple[int, int]:
    if isinstance(expected, CacheFile):
        return expected.size, expected.mtime_ns
    return expected.st_size, expected.st_mtime_ns  # type: ignore[attr-defined]


def _sig(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns
