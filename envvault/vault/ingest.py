"""Turning files into stored objects: one read, hashing while reading, chunking large files.

Shared by environment snaps and cache snaps; the stat cache that lets an unchanged file skip the read is
``statcache.py``.
"""

from __future__ import annotations

import errno
import io
import os
import stat as statmod
import threading
from collections import deque
from envvault.model.records import dataclass
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Callable, Iterable, Iterator


from envvault.errors import EnvironmentProblem
from envvault.model.encoding import object_id
from envvault.model.record import record_sha256
from envvault.vault.fsutil import open_regular_fd
from envvault.vault.statcache import stat_key
from envvault.vault import timing
from envvault.vault.threads import busy_threads, default_namers, default_readers, usable_cores
from envvault.vault.packs import FRAME_TARGET, FileSlice, PackWriter

__all__ = ["Ingester", "FileDigest"]

SMALL_FILE = 1 << 20  # files below this are one object; larger ones are cut by FastCDC
_CDC = None


def _chunker():
    global _CDC
    if _CDC is None:
        from pyfastcdc import FastCDC

        _CDC = FastCDC(avg_size=1 << 20, min_size=256 << 10, max_size=4 << 20)
    return _CDC


@dataclass(frozen=True)
class FileDigest:
    """What one read of a file yields: its RECORD-style sha256, size, and the blob ids of its content."""

    sha256: str
    size: int
    chunks: list[str] | None  # None when contents were hashed but not stored (lock-only)


class Ingester:
    """Reads files once: sha256 for RECORD checks, blake3 ids, compression via the pack writer.

    ``store=False`` hashes only (lock-only snaps, status). ``known(oid)`` says whether the vault holds an
    object. ``ingest`` reads one file on the calling thread; ``map_ordered`` reads many on ``threads`` reader
    threads (open, read, sha256, FastCDC and BLAKE3 all release the GIL) while the calling thread stores
    their objects in the order the files were given: the packs are the same bytes whatever the thread count.
    """

    def __init__(self, writer: PackWriter | None, known, *, store: bool = True, threads: int | None = None):
        self._named: dict = {}  # during map_ordered: path -> the future of its names (``_NameAhead``)
        self.writer = writer
        self.known = known
        self.store = store
        self.threads = threads if threads is not None else default_readers()

    def _put(self, data: bytes) -> str:
        oid = object_id(data)
        if self.store and not self.known(oid) and not self.writer.queued(oid):
            self.writer.add(oid, data)
        return oid

    def ingest(self, path: Path | str, size_hint: int, algo: str = "sha256", pin: tuple | None = None) -> FileDigest:
        """Read one file on this thread, storing its new objects at once (``pin``: as ``_read_file``)."""
        return _read_file(path, size_hint, algo, self.store, self._emit_now, pin=pin)

    def _emit_now(self, oid: str, data: bytes | None) -> None:
        if data is not None and not self.known(oid) and not self.writer.queued(oid):
            self.writer.add(oid, data)

    def map_ordered(self, fn: Callable, items: Iterable, weight: Callable | None = None,
                    path: Callable | None = None) -> Iterator:
        """``fn(item, read)`` for each item on the reader threads, results yielded in the items' order.

        With ``weight(item)`` (the bytes an item will read, about), consecutive light items run as one job
        (up to ``BATCH_BYTES`` or ``BATCH_ITEMS``): one hand-over between threads per batch, not per file.
        An item whose weight is None ends its batch: what the caller does with its result (store a manifest)
        then comes before the objects of the items after it, as with one thread.

        ``read(path, size_hint, pin=None)`` reads a file as ``ingest`` does; the objects it finds are stored by this
        (the calling) thread when that item's turn comes, in the order they were read. Bytes read ahead and
        not yet stored are bounded (``READ_AHEAD`` plus one item's ``HEAD_AHEAD``), so memory stays flat on
        any environment. An exception raised by ``fn`` is raised here, at that item's turn.

        With ``path(item)`` (the file an item will read, or None) and namer threads (``default_namers``), a
        file of ``NAME_MIN`` bytes or more is cut and named ahead of its turn (``_NameAhead``), up to
        ``NAME_AHEAD`` bytes ahead: its ``read`` then only hands over the names. A large file no longer holds
        up the small files after it while one reader cuts it.
        """
        if self.threads <= 1:
            for item in items:
                yield fn(item, self.ingest)
            return
        from concurrent.futures import ThreadPoolExecutor

        if self.store:
            self.known("0" * 64)  # load the vault's index here, not on a reader thread
        stored = 0  # bytes stored so far: past _STEADY_AFTER, pin malloc's threshold (ctypes costs an import)
        budget = _Budget(min(READ_AHEAD, max(16 << 20, self.threads * (2 << 20))), HEAD_AHEAD)
        window: deque[_Job] = deque()
        pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="envvault-read")
        namers = default_namers() if self.store and path is not None and weight is not None else 0
        if namers:
            _steady_malloc()  # namers, compressors and the pack thread pass large buffers from the start
        it = _NameAhead(items, weight, path, namers) if namers else iter(items)
        self._named = it.named if namers else {}
        depth = 4 * self.threads + 16
        pending = None  # the next item, read from ``items`` but not yet in a batch
        # This (storing) thread does Python work per file between calls that release the GIL, with many
        # readers wanting it back (``busy_threads``: a short switch interval, the collector off).
        busy = busy_threads()
        busy.__enter__()
        try:
            exhausted = False
            while True:
                while not exhausted and len(window) < depth:
                    batch, load = [], 0
                    while True:
                        if pending is None:
                            try:
                                pending = (next(it),)
                            except StopIteration:
                                exhausted = True
                                break
                        w = weight(pending[0]) if weight is not None else BATCH_BYTES
                        if batch and (load + (w or 0) > BATCH_BYTES or len(batch) >= BATCH_ITEMS):
                            break
                        batch.append(pending[0])
                        pending = None
                        if w is None:
                            break  # a barrier: nothing after it in this batch
                        load += w
                    if not batch:
                        break
                    job = _Job()
                    job.future = pool.submit(self._run_job, fn, batch, job, budget)
                    window.append(job)
                if not window:
                    return
                job = window.popleft()
                budget.set_head(job)
                while True:
                    if timing.ON:
                        t0 = timing.clock()
                        got = job.queue.get()
                        timing.add("store: wait for readers", t0)
                    else:
                        got = job.queue.get()
                    if got is _DONE:
                        break
                    objects, held = got  # held: their bytes, counted by the reader (FileSlices hold none)
                    try:
                        for oid, data in objects:
                            if timing.ON:
                                t0 = timing.clock()
                                self._emit_now(oid, data)
                                timing.add("store: add objects", t0)
                            else:
                                self._emit_now(oid, data)
                    finally:
                        if held:
                            budget.release(job, held)
                            stored += held
                            if stored > _STEADY_AFTER:
                                _steady_malloc()
                results, error = job.future.result()
                yield from results
                if error is not None:
                    raise error
        finally:
            busy.__exit__(None, None, None)
            _relax_malloc()
            budget.abort()
            for job in window:
                job.future.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            if namers:
                it.close()
            self._named = {}

    def _run_job(self, fn: Callable, batch: list, job: "_Job", budget: "_Budget") -> tuple[list, BaseException | None]:
        """Run ``fn`` on each item of ``batch``; its results, and the exception that stopped it (raised by the
        storing thread after the results before it)."""
        store, known = self.store, self.known

        # Objects go to the storing thread a list at a time (``HAND_OVER_ITEMS`` or ``HAND_OVER_BYTES``, a
        # large file's last, the batch's last): one queue operation and one budget release for many small
        # files, not one each. A reader hands over what it holds before it waits for room (the storing
        # thread may need those very objects to make room).
        pending: list = []
        held = 0

        def hand_over() -> None:
            nonlocal pending, held
            if pending:
                job.queue.put((pending, held))
                pending, held = [], 0

        def emit(oid: str, data: "bytes | FileSlice | None") -> None:
            nonlocal held
            if data is not None and known(oid):
                data = None  # stored already: hold no bytes for it
            if data is not None and not isinstance(data, FileSlice):
                n = len(data)
                if not budget.try_acquire(job, n):
                    hand_over()
                    budget.acquire(job, n)
                held += n
            pending.append((oid, data))
            if len(pending) >= HAND_OVER_ITEMS or held >= HAND_OVER_BYTES:
                hand_over()

        named = self._named

        def read(path, size_hint: int, algo: str = "sha256", pin: tuple | None = None) -> FileDigest:
            ahead = named.pop(os.fspath(path), None) if algo == "sha256" and pin is None else None
            if ahead is None:
                digest = _read_file(path, size_hint, algo, store, emit, lazy=True, pin=pin)
                if size_hint >= SMALL_FILE:
                    hand_over()
                return digest
            if timing.ON:
                t0 = timing.clock()
                ahead.exception()
                timing.add("readers: wait for namers", t0)
            digest, pieces = ahead.result()  # the namer's error, if any, is this read's
            for oid, piece in pieces:
                if len(piece) < FRAME_TARGET // 2 and not known(oid):
                    piece = piece.load(oid)  # a small chunk goes into a frame of small objects: as bytes
                emit(oid, piece)
            hand_over()
            return digest

        results = []
        t0 = timing.clock()
        try:
            for item in batch:
                results.append(fn(item, read))
        except _Aborted:
            raise
        except Exception as err:  # noqa: BLE001 - handed to the storing thread, raised at its item's turn
            return results, err
        finally:
            hand_over()
            job.queue.put(_DONE)
            if timing.ON:
                timing.add("readers: busy (incl. waits for room)", t0)
        return results, None


# Bytes read ahead of the storing thread (all reader threads together: 2 MiB a thread, at least 16 MiB, at
# most READ_AHEAD), and what the file being stored may hold beyond that (FastCDC's largest chunk is 4 MiB).
READ_AHEAD = 64 << 20
HEAD_AHEAD = 8 << 20
BATCH_BYTES = 1 << 20  # light items (small files) go to the readers this many bytes ...
BATCH_ITEMS = 64  # ... or items at a time
HAND_OVER_ITEMS = 32  # a reader hands the objects it read to the storing thread this many at a time ...
HAND_OVER_BYTES = 256 << 10  # ... or once they hold this many bytes
_DONE = object()


_MALLOC = None  # this ingest pinned glibc's mmap threshold (True), could not (False), or has not tried (None)
_STEADY_AFTER = 64 << 20


def _steady_malloc() -> None:
    """Keep glibc's mmap threshold at 256 KiB while a snap stores: chunks of 256 KiB to 4 MiB allocated on
    one thread and freed on another otherwise raise it (glibc's dynamic threshold) and stay in per-thread
    arenas, which grows a multi-threaded snap's RSS by tens of MB. A no-op elsewhere. ``_relax_malloc``
    undoes it when the ingest ends."""
    global _MALLOC
    if _MALLOC is None:  # once an ingest: without glibc (False) it is not tried again for every object
        _MALLOC = _mallopt((_M_MMAP_THRESHOLD, 256 << 10))


def _relax_malloc() -> None:
    """After the ingest: buffers of up to 4 MiB from the heap again (the mmap threshold at 8 MiB, the trim
    threshold at 16 MiB: where glibc's dynamic rule would have taken them). With the 256 KiB threshold left
    in place, whatever the process does next with large buffers (a restore's stage after its backup snap:
    every decompressed frame) maps and faults fresh pages for each; measured on the device, a restore's
    stage took 3.2-3.9 s after a backup against 1.5-2.2 s without one (a 1 MiB decompression 14x slower
    here: bench/malloc_threshold.py)."""
    global _MALLOC
    pinned, _MALLOC = _MALLOC, None
    if pinned:
        _mallopt((_M_MMAP_THRESHOLD, 8 << 20), (_M_TRIM_THRESHOLD, 16 << 20))


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _mallopt(*settings: tuple) -> bool:
    """glibc's ``mallopt`` for each (parameter, value); False where there is no glibc."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):
            return False
        for param, value in settings:
            libc.mallopt(param, value)
        return True
    except (OSError, AttributeError, ImportError):
        return False


NAME_MIN = 8 << 20  # files this large are named ahead of their turn ...
NAME_AHEAD = 2 << 30  # ... up to this many bytes of them ahead of the storing thread
LOOK_AHEAD = 100_000  # items taken from the caller's iterator ahead of their turn, at most


class _NameAhead:
    """The items of ``map_ordered``, taken ahead of their turn so that the large files among them are cut
    and named on namer threads (``_read_file`` without holding any chunk) before a reader asks for them.
    ``named`` maps each such file's path to the future of its (FileDigest, [(oid, FileSlice)]); a reader
    pops it. Only names are held ahead, never file bytes: memory stays flat."""

    def __init__(self, items: Iterable, weight: Callable, path: Callable, threads: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._it = iter(items)
        self._weight = weight
        self._path = path
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="envvault-name")
        self._ahead: deque = deque()  # (item, bytes named for it)
        self._bytes = 0
        self._done = False
        self.named: dict = {}

    def __iter__(self) -> "_NameAhead":
        return self

    def __next__(self):
        self._fill()
        if not self._ahead:
            raise StopIteration
        item, size = self._ahead.popleft()
        self._bytes -= size
        return item

    def _fill(self) -> None:
        while not self._done and len(self._ahead) < LOOK_AHEAD and (self._bytes < NAME_AHEAD or not self._ahead):
            try:
                item = next(self._it)
            except StopIteration:
                self._done = True
                return
            size = 0
            w = self._weight(item)
            if w is not None and w >= NAME_MIN:
                target = self._path(item)
                if target is not None:
                    size = w
                    self.named[os.fspath(target)] = self._pool.submit(_name_file, target, w)
            self._ahead.append((item, size))
            self._bytes += size

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _name_file(path, size_hint: int) -> tuple[FileDigest, list]:
    pieces: list = []
    digest = _read_file(path, size_hint, "sha256", True, lambda oid, piece: pieces.append((oid, piece)),
                        lazy=True, hold_small=False)
    return digest, pieces


# Hashing a large file on a helper thread beside the chunking pays on a host with cores to spare; on a few
# cores that thread only competes with the readers and the pack writer's compressors (2 cores, torch venv:
# a first snap 10-15% slower with it).
_HASH_ASIDE_OK = usable_cores() >= 8


def _read_file(path, size_hint: int, algo: str, store: bool, emit, lazy: bool = False,
               hold_small: bool = True, pin: tuple | None = None) -> FileDigest:
    """Read ``path`` once: its RECORD-style digest, size and (``store``) blob ids, each blob passed to
    ``emit(oid, data)`` in file order. A large file's digest is computed on a helper thread while this one
    cuts and names its chunks (the two passes over its bytes run side by side); without ``store`` a large
    file is only hashed (no chunking). ``lazy`` (the reader threads of ``map_ordered``): a large file's
    chunks of half a frame or more are passed as a FileSlice, not as bytes (``_cut_named``). ``pin``: ``(stat
    key, sha256)``, a file whose bytes must be those before any is stored (a link out of the environment,
    ``snap/manifests.py``): ``_read_pinned``."""
    import hashlib  # here: a quick command (status, a second snap) hashes nothing and loads no OpenSSL

    h = hashlib.new(algo)
    chunks: list[str] = []
    aside = None
    try:
        # A FIFO or device put where a file was: never waited on. A symlink put where a regular file was is
        # not followed (it could lead anywhere: helper 40); only a pinned file is read through a link.
        try:
            fd = open_regular_fd(path, follow=pin is not None)
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
            fd = None
        if fd is None:
            raise EnvironmentProblem(f"cannot read {path}: not a regular file (did it change while envvault read "
                                     "the environment?)")
        if pin is not None:
            return _read_pinned(fd, path, size_hint, pin, store, emit)
        if size_hint < SMALL_FILE:  # most files: read whole with plain reads (no file object: the GIL is shared)
            try:
                data = _read_fd(fd, size_hint)
            finally:
                os.close(fd)
            h.update(data)
            size = len(data)
            if store and data:
                oid = object_id(data)
                chunks.append(oid)
                emit(oid, data)
        else:
            before = _version(os.fstat(fd))
            with os.fdopen(fd, "rb") as f:
                if not store:
                    size = 0
                    while True:
                        data = f.read(BLOCK)
                        if not data:
                            break
                        h.update(data)
                        size += len(data)
                elif lazy:
                    size = _cut_named(f, path, h.update, chunks, emit, hold_small)
                else:
                    size = 0
                    update = h.update
                    if size_hint >= HASH_ASIDE and _HASH_ASIDE_OK:
                        aside = _HashAside(h)
                        update = aside.update
                    for ch in _chunker().cut_stream(f):
                        data = bytes(ch.data)
                        update(data)
                        size += len(data)
                        oid = object_id(data)
                        chunks.append(oid)
                        emit(oid, data)
                    if aside is not None:
                        aside.finish()
                        aside = None
                if _version(os.fstat(f.fileno())) != before:
                    raise EnvironmentProblem(f"{path} changed while it was being read; nothing was stored, run the "
                                             "command again")
    except PermissionError:
        raise EnvironmentProblem(f"cannot read {path}: permission denied; fix its mode or run as its owner") from None
    except OSError as err:
        raise EnvironmentProblem(f"cannot read {path}: {err.strerror}") from None
    finally:
        if aside is not None:
            aside.finish()
    digest = record_sha256(h.digest())
    return FileDigest(digest, size, chunks if store else None)


def _version(st: os.stat_result) -> tuple:
    """What a write or a truncation changes: a large file with the same version before and after its read
    was read as one state, not as a torn mix of two. (One replaced under its name meanwhile was read whole,
    as it was: the descriptor keeps the old file. Its ctime is left out: it moves without a write too, on a
    rename or a chmod, and some file systems report it as they please.) Its chunks of half a frame or more
    are checked again at their turn (``FileSlice``); the smaller ones, stored as they were read, rest on
    this."""
    return st.st_size, st.st_mtime_ns


BLOCK = 4 << 20  # a large file hashed without chunking is read this much at a time
WINDOW = 6 << 20  # ``_cut_named`` cuts this much of a file at a time (FastCDC's largest chunk and 2 MiB)
_windows = threading.local()


def _read_pinned(fd: int, path, size: int, pin: tuple, store: bool, emit) -> FileDigest:
    """Read a pinned file (``pin``: the stat key it must have and the sha256 its bytes must have, a link out
    of the environment: ``snap/manifests.py``) from its open descriptor ``fd``, which this closes. Another file
    than the key's is an EnvironmentProblem, nothing read. Exactly ``size`` bytes are read (a ``/proc`` file
    says size 0 and holds more) and hashed, a small file held as one object, a large one cut into named
    chunks, every one a FileSlice (the chunks any read of it makes): none reaches ``emit`` before the whole is
    known to be ``size`` bytes of that sha256, and a slice is then read again from ``path`` and stored only
    while its bytes have its id. Otherwise the digest says what was read (a byte past ``size`` counted) and
    no chunk is stored."""
    import hashlib

    h = hashlib.sha256()
    held: list = []  # (oid, the small file's bytes or a large one's FileSlice), in file order
    try:
        if stat_key(os.fstat(fd)) != pin[0]:
            raise EnvironmentProblem(f"{path} changed while it was being read; nothing was stored, run the command "
                                     "again")
        if size < SMALL_FILE:  # one object, as any small file: held (under 1 MiB) until its bytes are known
            data = _read_exactly(fd, size)
            h.update(data)
            got = len(data)
            if store and data:
                held.append((object_id(data), data))
        else:
            with io.BufferedReader(_Bounded(os.dup(fd), size), BLOCK) as f:
                if store:
                    got = _cut_named(f, path, h.update, [], lambda oid, piece: held.append((oid, piece)), False)
                else:
                    got = 0
                    while data := f.read(BLOCK):
                        h.update(data)
                        got += len(data)
        got += len(os.pread(fd, 1, got)) if got == size else 0
    finally:
        os.close(fd)
    sha = record_sha256(h.digest())
    if got != size or sha != pin[1] or not store:
        return FileDigest(sha, got, None)
    for oid, piece in held:
        emit(oid, piece if isinstance(piece, bytes) or len(piece) >= FRAME_TARGET // 2 else piece.load(oid))
    return FileDigest(sha, size, [oid for oid, _ in held])


def _read_exactly(fd: int, size: int) -> bytes:
    """At most ``size`` bytes of the open file ``fd`` from where it stands: fewer only at its end (a short
    read is not the end), never more, however much more the file holds (a ``/proc`` file says size 0)."""
    parts, left = [], size
    while left > 0:
        more = os.read(fd, min(left, 1 << 20))
        if not more:
            break
        parts.append(more)
        left -= len(more)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class _Bounded(io.RawIOBase):
    """The first ``size`` bytes of an open descriptor from where it stands, as a raw stream; closing it closes
    the descriptor."""

    def __init__(self, fd: int, size: int):
        super().__init__()
        self._fd, self._left = fd, size

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buf) -> int:
        if self._left <= 0:
            return 0
        data = os.read(self._fd, min(len(buf), self._left))
        buf[:len(data)] = data
        self._left -= len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def _read_fd(fd: int, size_hint: int) -> bytes:
    """The whole of the open file ``fd`` (about ``size_hint`` bytes; it may have grown or shrunk), read until
    end of file: a read shorter than asked is not the end (FUSE, NFS, 9p and CIFS may return less)."""
    data = os.read(fd, size_hint + 1)
    if not data:
        return data
    parts = [data]
    while True:
        more = os.read(fd, max(size_hint + 1 - len(data), 1 << 16))
        if not more:
            return data if len(parts) == 1 else b"".join(parts)
        parts.append(more)


def _cut_named(f, path, update, chunks: list, emit, hold_small: bool = True) -> int:
    """Cut the open file ``f`` (``path``) into FastCDC chunks, name each and hash the whole with ``update``,
    holding at most ``WINDOW`` bytes: a chunk of half a frame or more goes to ``emit`` as a FileSlice (the
    pack writer's compressor reads it again), a smaller one as bytes. The chunks are exactly
    ``cut_stream``'s: a boundary depends only on the bytes from the chunk's start, so every chunk of a window
    but the last (cut short by the window's end, unless the file ends there) is final, and the last starts
    the next window. Without ``hold_small`` (a namer: ``_NameAhead``) every chunk is a FileSlice. Returns
    the file's size."""
    cdc = _chunker()
    buf = getattr(_windows, "buf", None)
    if buf is None:
        buf = _windows.buf = bytearray(WINDOW)  # one a thread, reused for every file it cuts
    view = memoryview(buf)
    have = base = 0  # bytes in ``buf``; the file offset of ``buf[0]``
    eof = False
    try:
        while True:
            while have < WINDOW and not eof:
                n = f.readinto(view[have:])
                if n:
                    have += n
                else:
                    eof = True
            if not have:
                return base
            cut = [(c.offset, c.length) for c in cdc.cut_buf(view[:have])]
            if not eof:
                cut.pop()  # cut short by the window's end: it starts the next window
            for off, length in cut:
                piece = view[off:off + length]
                update(piece)
                oid = object_id(piece)
                chunks.append(oid)
                big = length >= FRAME_TARGET // 2 or not hold_small
                emit(oid, FileSlice(path, base + off, length) if big else bytes(piece))
                piece.release()
            used = cut[-1][0] + cut[-1][1] if cut else 0
            if eof:
                return base + used
            view[:have - used] = view[used:have]  # memmove
            base += used
            have -= used
    finally:
        view.release()
HASH_ASIDE = 16 << 20  # files this large get their digest from a helper thread


class _HashAside:
    """Feeds chunks to a hash on its own thread (hashlib releases the GIL), a few chunks behind at most."""

    def __init__(self, h) -> None:
        import queue

        self._h = h
        self._q: queue.Queue = queue.Queue(maxsize=8)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="envvault-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            data = self._q.get()
            if data is None:
                return
            try:
                self._h.update(data)
            except BaseException as err:  # noqa: BLE001 - reported by finish()
                self._error = err

    def update(self, data: bytes) -> None:
        self._q.put(data)

    def finish(self) -> None:
        """Wait until every chunk given is hashed."""
        self._q.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


class _Aborted(Exception):
    """The storing thread stopped: a reader waiting for room gives up."""


class _Job:
    __slots__ = ("queue", "outstanding", "future")

    def __init__(self) -> None:
        import queue  # here: a quick command (status, a second snap) reads no file through the readers

        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.outstanding = 0
        self.future = None


class _Budget:
    """Bytes read and not yet stored. A reader waits for room, except the item being stored (the head),
    which may always hold ``head`` bytes: it cannot wait for items behind it, so nothing deadlocks."""

    def __init__(self, limit: int, head: int) -> None:
        self.limit = limit
        self.head_limit = head
        self.used = 0
        self.head: _Job | None = None
        self.aborted = False
        self.cv = threading.Condition()

    def _fits(self, job: _Job, n: int) -> bool:
        if self.aborted:
            raise _Aborted()
        if self.used + n <= self.limit:
            return True
        return job is self.head and (job.outstanding == 0 or job.outstanding + n <= self.head_limit)

    def try_acquire(self, job: _Job, n: int) -> bool:
        """Take ``n`` bytes if they fit now; False (nothing taken) if the reader would have to wait."""
        with self.cv:
            if not self._fits(job, n):
                return False
            self.used += n
            job.outstanding += n
        return True

    def acquire(self, job: _Job, n: int) -> None:
        t0 = timing.clock()
        with self.cv:
            while not self._fits(job, n):
                self.cv.wait()
            self.used += n
            job.outstanding += n
        if timing.ON:
            timing.add("readers: wait for room", t0)

    def release(self, job: _Job, n: int) -> None:
        with self.cv:
            self.used -= n
            job.outstanding -= n
            self.cv.notify_all()

    def set_head(self, job: _Job) -> None:
        with self.cv:
            self.head = job
            self.cv.notify_all()

    def abort(self) -> None:
        with self.cv:
            self.aborted = True
            self.cv.notify_all()


def is_regular(st: os.stat_result) -> bool:
    return statmod.S_ISREG(st.st_mode)
