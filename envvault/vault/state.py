"""Machine-local state of a vault: what belongs to this machine, not to the vault's shared objects.

Stat caches, the stamp index, restore markers (``restored-<key>.json``), guard pointers (``guard-<key>.json``),
the gc epoch, the stamp log; temp files and scratch folders (``tmp_dir``: where packs and index files are
written before the backend stores them, and where restores stage); and the locks that guard this machine's
environments (``restore-<key>``, ``stamp-<fingerprint>``). Each file here is a cache or a marker that may be
deleted at any time (docs/format.md, "Directory tree").

For a local vault these are the vault's own ``state/``, ``tmp/`` and ``locks/`` folders, as they always were;
a vault on another backend keeps them in a local folder of its own.
"""

from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Iterator

from envvault.errors import CorruptError, EnvvaultError
from envvault.vault.backend import check_name
from envvault.vault.fsutil import atomic_write, flocked, read_regular, storage_error, tmp_owner, write_nofollow

__all__ = ["GC_RUNNING", "LocalState"]

GC_RUNNING = b"-running"  # how ``gc-epoch`` ends while a gc deletes (and after one killed part way)


class LocalState:
    """Machine-local files of one vault: ``dir`` (caches and markers), ``tmp_dir``, ``locks_dir``."""

    def __init__(self, state_dir: Path, tmp_dir: Path, locks_dir: Path):
        self.dir = Path(state_dir)
        self.tmp_dir = Path(tmp_dir)
        self.locks_dir = Path(locks_dir)

    @classmethod
    def in_vault(cls, root: Path) -> "LocalState":
        """The state of a local vault: its own ``state/``, ``tmp/`` and ``locks/`` folders."""
        return cls(root / "state", root / "tmp", root / "locks")

    def path(self, name: str) -> Path:
        """The file ``name`` (a flat name such as ``stat-<key>`` or ``restored-<key>.json``)."""
        return self.dir / check_name(name)

    def read(self, name: str, limit: int = 1 << 20, what: str | None = None) -> bytes | None:
        """The bytes of ``name``, or None when it is absent, unreadable, not a regular file or over ``limit``
        (a state file is a cache: a bad one counts as none)."""
        try:
            return read_regular(self.path(name), limit, what or name)
        except (OSError, CorruptError):
            return None

    def write(self, name: str, data: bytes, *, durable: bool = True) -> None:
        """Replace ``name`` atomically (through ``tmp_dir``); a StorageError when it cannot be written."""
        atomic_write(self.path(name), data, tmp_dir=self.tmp_dir, durable=durable, vault=True)

    def write_in_place(self, name: str, data: bytes) -> None:
        """Overwrite the small file ``name`` in place, refusing a symlink there (FileNotFoundError when the
        state folder is gone)."""
        write_nofollow(self.path(name), data)

    def forget_stat_caches(self, *, running: bool = False) -> None:
        """Delete every stat cache (they name objects without asking the index: gc makes them wrong), then move
        ``gc-epoch`` on (``move_gc_epoch``): a process that loaded one before (its epoch is read before its
        file) sees, once it holds the vault lock, that it is stale (``Vault.lock``), and cannot save it back."""
        for name in self.names():
            if name.startswith("stat-"):
                try:
                    self.remove(name)
                except OSError:
                    pass
        self.move_gc_epoch(running=running)

    def move_gc_epoch(self, *, running: bool = False) -> None:
        """A new ``gc-epoch`` (gc, at its start, ``running``, and once it deleted its last object): what another
        process read of the vault before it (a stat cache, the index) may name objects that gc deleted;
        ``Vault.lock`` makes that process forget it before it writes. A ``running`` value (``GC_RUNNING``) still
        there when a lock is granted is a gc killed part way (docs/format.md, "Stat cache")."""
        try:
            self.write_in_place("gc-epoch", f"{time.time_ns()}-{os.urandom(6).hex()}"
                                            f"{GC_RUNNING.decode() if running else ''}\n".encode())
        except FileNotFoundError:
            pass  # no state folder: no stat caches either

    def names(self) -> list[str]:
        try:
            return os.listdir(self.dir)
        except FileNotFoundError:
            return []

    def remove(self, name: str) -> bool:
        try:
            os.unlink(self.path(name))
            return True
        except FileNotFoundError:
            return False

    def lock(self, name: str, *, exclusive: bool = True, wait: bool = True) -> AbstractContextManager[bool]:
        """The machine-local lock ``name`` (``locks/<name>.lock`` of a local vault); yields False at once
        when ``wait=False`` and another process holds it."""
        return flocked(self.locks_dir / f"{name}.lock", exclusive=exclusive, wait=wait)

    def held_elsewhere(self, name: str) -> bool:
        """Whether another process holds the machine-local lock ``name`` now (probed shared, without waiting).
        A lock file never made, or one that cannot be probed (a link, a read-only folder, another user's file):
        False; gc then keeps nothing for it (docs/format.md, "Concurrency": these locks are one user's)."""
        path = self.locks_dir / f"{name}.lock"
        if not os.path.lexists(path):
            return False
        try:
            with flocked(path, exclusive=False, wait=False) as held:
                return not held
        except (EnvvaultError, OSError):
            return False

    def note_in_lock(self, name: str, text: str) -> None:
        """Write ``text`` into the machine-local lock file ``name``, which this process holds: what it holds
        the lock for (a guard: its pid, then the id of its "before" snapshot, ``vault.gc.guard_note``;
        docs/format.md, "Concurrency")."""
        write_nofollow(self.locks_dir / f"{name}.lock", text.encode())

    def note_of_lock(self, name: str) -> str:
        """The text ``note_in_lock`` wrote into the lock file ``name``; "" when there is none or it cannot be
        read (a link, a FIFO, over 4 KiB)."""
        try:
            return read_regular(self.locks_dir / f"{name}.lock", 4096, f"{name}.lock").decode("ascii", "replace")
        except (OSError, CorruptError):
            return ""

    def notes_of_held_locks(self, prefix: str) -> list[str]:
        """The texts (``note_of_lock``) of the lock files ``<prefix>*.lock`` that another process holds now."""
        try:
            names = os.listdir(self.locks_dir)
        except OSError:
            return []
        return [self.note_of_lock(file[:-5]) for file in sorted(names)
                if file.startswith(prefix) and file.endswith(".lock") and self.held_elsewhere(file[:-5])]

    def ensure_locks_dir(self) -> None:
        try:
            self.locks_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise storage_error(err, self.locks_dir, vault=True) from None

    @contextmanager
    def scratch_dir(self, prefix: str = "restore-") -> Iterator[Path]:
        """A temporary folder under ``tmp_dir`` (same filesystem as a local vault's packs), removed afterwards."""
        import shutil  # (and tempfile: only commands that restore need a scratch folder)
        import tempfile

        self.tmp_dir.mkdir(exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=self.tmp_dir))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def clean_dead_tmp(self, pids) -> None:
        """Remove the temp files (``fsutil.tmp_name``) of the processes ``pids``, which have ended: a snap's
        forked group builders killed mid-pack (``snap/groups.py``)."""
        pids = set(pids)
        self._remove_tmp(lambda entry: tmp_owner(entry.name) in pids)

    def clean_tmp(self, older_than: float = 3600) -> None:
        """Remove temp files left by killed writers (only old ones: a live writer may own new ones)."""
        now = time.time()
        self._remove_tmp(lambda entry: now - entry.stat(follow_symlinks=False).st_mtime > older_than)

    def _remove_tmp(self, doomed) -> None:
        """Remove each file of the temp folder (never a folder; a symlink itself, never what it points to) for
        which ``doomed(entry)`` holds; whatever cannot be read or removed is left."""
        try:
            for entry in os.scandir(self.tmp_dir):
                try:
                    if not entry.is_dir(follow_symlinks=False) and doomed(entry):
                        os.unlink(entry.path)
                except OSError:
                    pass
        except OSError:
            pass
