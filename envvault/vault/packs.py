"""Pack files: many objects, grouped into zstd frames, written once with an index file beside them.

The writer compresses frames on a thread pool (zstandard releases the GIL) and writes them in order, so a
snap uses every core while memory stays bounded by the frames in flight.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from collections import deque
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Callable

import blake3

from envvault.errors import CorruptError, EnvironmentProblem
from envvault.model.encoding import object_id
from envvault.crashpoints import crash_point
from envvault.vault import timing
from envvault.vault.threads import default_compressors, default_writers
from envvault.vault.backend import Backend, Missing, ReadFailed
from envvault.vault.fsutil import open_regular_fd, storage_error, tmp_name

__all__ = ["PackWriter", "FileSlice", "PACK_MAGIC", "read_frame", "check_frame", "FRAME_TARGET", "MAX_FRAME"]

PACK_MAGIC = b"EVPK\x01\x00\x00\x00"
FRAME_TARGET = 1 << 20  # small objects are grouped until a frame holds about this much
PACK_TARGET = 32 << 20  # a pack is closed once its compressed bytes pass this
MAX_FRAME = 64 << 20  # a frame that claims more is refused as damaged or hostile
_IN_FLIGHT = 8  # frames compressing at once: at least this many, else two a thread ...
_IN_FLIGHT_BYTES = 32 << 20  # ... while their uncompressed bytes stay below this
_CLOSING = 4  # packs handed to the closer thread and not yet stored, at most (each a temp pack, an open fd)
_BATCH_FRAMES = 64  # frames compressed already, placed and written as one batch (one pwritev), at most
_IOV_MAX = 1024
_HASH_READ = 4 << 20  # the closer reads a pack back in pieces of this size to hash it

Location = tuple  # (pack_id, frame_offset, frame_length, offset_in_frame, length, kind)


class FileSlice:
    """An object's bytes left in the file they were read from (``length`` bytes at ``offset``), given to
    ``PackWriter.add`` instead of the bytes: the compressor thread reads them again and checks they still
    have the id they were named by, so a reader can name a large file's chunks and hold none of them."""

    __slots__ = ("path", "offset", "length")

    def __init__(self, path, offset: int, length: int) -> None:
        self.path, self.offset, self.length = path, offset, length

    def __len__(self) -> int:
        return self.length

    def load(self, oid: str) -> bytes:
        """The bytes, checked against ``oid``, as a bytes object of their own (a small chunk of a named file,
        taken into a frame of small objects by a reader or the storing thread: they hold no buffer for it)."""
        data = bytearray(self.length)
        self._read_into(memoryview(data), oid)
        return bytes(data)

    def view(self, oid: str) -> memoryview:
        """The bytes, checked against ``oid``, in this thread's buffer: valid until its next ``view`` (a
        compressor thread: one buffer of up to 4 MiB, reused for every large chunk it compresses)."""
        buf = getattr(_slice_buf, "buf", None)
        if buf is None or len(buf) < self.length:
            buf = _slice_buf.buf = bytearray(max(self.length, 4 << 20))
        view = memoryview(buf)[:self.length]
        self._read_into(view, oid)
        return view

    def _read_into(self, view: memoryview, oid: str) -> None:
        """Fill ``view`` (``length`` bytes) from the file at ``offset``; an error unless they still have ``oid``."""
        got = 0
        try:
            fd = open_regular_fd(self.path)  # a file replaced by a FIFO since it was named: never waited on
            if fd is None:
                raise EnvironmentProblem(f"{self.path} changed while it was being read (it is no longer a regular "
                                         "file); nothing was stored, run the command again")
            try:
                while got < self.length:
                    n = os.preadv(fd, [view[got:]], self.offset + got)
                    if not n:
                        break
                    got += n
            finally:
                os.close(fd)
        except OSError as err:
            raise EnvironmentProblem(f"cannot read {self.path}: {err.strerror}") from None
        if got != self.length or object_id(view) != oid:
            raise EnvironmentProblem(f"{self.path} changed while it was being read; nothing was stored, "
                                     "run the command again")


_slice_buf = threading.local()  # each compressor thread reads FileSlices into one buffer, reused


class PackWriter:
    """Accepts objects, writes packs + index files. Not thread-safe: one producer thread.

    ``on_commit(pack_id, objects)`` is called after a pack and its index are durable, with
    ``objects = {oid: location}`` so the caller can add them to its in-memory index.
    """

    _in_flight_a_worker = 2  # frames in flight a compressor thread (see ``_in_flight``)

    def __init__(self, backend: Backend, tmp_dir: Path, level: int, on_commit: Callable[[str, dict], None],
                 threads: int | None = None, level_large: int | None = None):
        self.backend = backend
        self.tmp_dir = tmp_dir  # packs and index files are written here, then stored with backend.save_file
        self.level = level
        # Large chunks are mostly shared libraries: a faster level keeps a snap as quick as `tar | zstd`.
        self.level_large = level if level_large is None else level_large
        self.on_commit = on_commit
        workers = threads or default_compressors()
        self._workers = workers
        self._pool = None  # started by the first frame: a snap that stores nothing imports no thread pool
        # Frames compressing at once: enough to keep every core busy, few enough to bound memory (a frame
        # holds at most a 4 MiB chunk or ~1 MiB of small objects).
        self._in_flight = max(_IN_FLIGHT, self._in_flight_a_worker * workers)
        self._pending_bytes = 0
        self._local = threading.local()
        self._pending: deque[tuple] = deque()  # (future, meta, raw bytes) in pack order, not yet placed
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None  # the pack thread: places frames in order, closes packs
        self._done = threading.Event()  # set by the pack thread as it ends
        self._stopping = False  # flush: the pack thread ends once ``_pending`` is empty
        self._error: BaseException | None = None  # what stopped the pack thread, raised on the producer's side
        self._closer = None  # the closer thread, started by the first full pack
        self._closing: deque = deque()  # its futures, one a pack, in order
        self._frame: list[tuple[str, bytes, str]] = []
        self._frame_size = 0
        self._pack: _OpenPack | None = None  # the pack frames are being placed in (pack thread)
        self._writers = None  # the writer threads, started by the first frame placed
        self._held = 0  # frames submitted and not yet written: compressing, waiting, or being written
        self._written = [0, 0]  # compressed bytes and objects this writer placed (the pack thread's)
        self._elsewhere = [0, 0]  # the same of packs other writers stored for this one's caller (``count``)
        self._queued: set[str] = set()

    @property
    def written_bytes(self) -> int:
        """Compressed bytes stored: this writer's and those ``count`` added."""
        return self._written[0] + self._elsewhere[0]

    @property
    def written_objects(self) -> int:
        return self._written[1] + self._elsewhere[1]

    def count(self, nbytes: int, objects: int) -> None:
        """Count packs another writer stored for this one's caller (a first snap's groups) in ``written_*``
        (kept apart from the pack thread's own count, which it updates meanwhile)."""
        self._elsewhere[0] += nbytes
        self._elsewhere[1] += objects

    # -- producer side -------------------------------------------------------------------------
    def add(self, oid: str, data: "bytes | FileSlice", kind: str = "b") -> None:
        """Queue one object (its bytes, or a FileSlice of at least half a frame); the caller has checked it
        is not stored yet."""
        if oid in self._queued:
            return
        self._queued.add(oid)
        if len(data) >= FRAME_TARGET // 2:
            self._submit([(oid, data, kind)])
            return
        if isinstance(data, FileSlice):
            data = data.load(oid)
        self._frame.append((oid, data, kind))
        self._frame_size += len(data)
        if self._frame_size >= FRAME_TARGET:
            self._flush_frame()

    def queued(self, oid: str) -> bool:
        return oid in self._queued

    def _flush_frame(self) -> None:
        if self._frame:
            self._submit(self._frame)
            self._frame = []
            self._frame_size = 0

    def _compress(self, items: list) -> bytes:
        t0 = timing.clock()
        try:
            return self._compress_now(items)
        finally:
            if timing.ON:
                timing.add("compressors: busy", t0)

    def _compress_now(self, items: list) -> bytes:
        large = len(items) == 1 and len(items[0][1]) >= FRAME_TARGET // 2
        key = "cctx_large" if large else "cctx"
        cctx = getattr(self._local, key, None)
        if cctx is None:
            import zstandard  # here, not at the top: a snap that stores nothing new never loads it (3 ms)

            cctx = zstandard.ZstdCompressor(level=self.level_large if large else self.level, write_content_size=True)
            setattr(self._local, key, cctx)
        if len(items) == 1:
            raw = items[0][1]
            if isinstance(raw, FileSlice):
                t0 = timing.clock()
                raw = raw.view(items[0][0])
                if timing.ON:
                    timing.add("compressors: read FileSlices again", t0)
        else:
            raw = b"".join(it[1] for it in items)
        return cctx.compress(raw)

    def _submit(self, items: list) -> None:
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="envvault-zstd")
        self._raise_failed()
        fut = self._pool.submit(self._compress, items)
        meta = [(oid, len(data), kind) for oid, data, kind in items]
        size = sum(m[1] for m in meta)
        t0 = timing.clock()
        with self._cv:
            self._pending.append((fut, meta, size))
            self._pending_bytes += size
            self._held += 1
            if self._thread is None:
                self._stopping = False
                self._done = threading.Event()
                self._thread = threading.Thread(target=self._run, name="envvault-pack", daemon=True)
                self._thread.start()
            self._cv.notify_all()
            while self._error is None and (self._held > self._in_flight or self._pending_bytes > _IN_FLIGHT_BYTES):
                if timing.ON:
                    timing.add("store: room waits, frames cap" if self._held > self._in_flight
                               else "store: room waits, bytes cap", timing.clock())
                self._cv.wait()
        if timing.ON:
            timing.add("store: wait for room in the pack writer", t0)
        self._raise_failed()

    def _raise_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        """The pack thread: frames taken in order once compressed, given their place in a pack (the packs'
        bytes depend only on that order) and handed to the writer threads, which write them with ``pwrite``
        at that place, several at once; full packs go to the closer (fsync, the pack's id, stored,
        indexed), while the producer and the compressors go on."""
        try:
            while True:
                with self._cv:
                    while not self._pending and not self._stopping and self._error is None:
                        self._cv.wait()
                    if self._error is not None:
                        return  # aborted
                    if not self._pending:
                        break
                    head = self._pending.popleft()
                    # the frames compressed already behind the head: placed and written as one batch
                    ready = [head]
                    while self._pending and len(ready) < _BATCH_FRAMES and self._pending[0][0].done():
                        ready.append(self._pending.popleft())
                self._place(ready)
            self._close_pack()
        except BaseException as err:  # noqa: BLE001 - raised on the producer's side (flush, the next add)
            self._failed(err)
        finally:
            self._done.set()

    def _failed(self, err: BaseException) -> None:
        """Keep the first error (the pack thread stops, the producer raises it) and wake every waiter."""
        with self._cv:
            if self._error is None:
                self._error = err
            self._cv.notify_all()

    # -- writer side ---------------------------------------------------------------------------
    def _open_pack(self) -> "_OpenPack":
        tmp = tmp_name(self.tmp_dir, "pack")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as err:
            raise storage_error(err, tmp, vault=True) from None
        pack = self._pack = _OpenPack(fd, tmp)
        _pwrite_all(fd, PACK_MAGIC, 0, self.backend)
        pack.length = len(PACK_MAGIC)
        return pack

    def _place(self, ready: list) -> None:
        """Give each frame of ``ready`` (in order) its place in the open pack and hand the frames of one pack
        to a writer thread as one ``pwritev``; a pack that passes ``PACK_TARGET`` goes to the closer."""
        t0 = timing.clock()
        comps = [fut.result() for fut, _, _ in ready]
        if timing.ON:
            timing.add("pack thread: wait for compressors", t0)
            t0 = timing.clock()
        i = 0
        while i < len(ready):
            pack = self._pack or self._open_pack()
            at, bufs, raw = pack.length, [], 0
            while i < len(ready):  # a frame goes into the open pack, which is closed once it passes the target
                comp, (_, meta, size) = comps[i], ready[i]
                frame_index = len(pack.frames)
                pack.frames.append([pack.length, len(comp)])
                off = 0
                for oid, length, kind in meta:
                    pack.objects[oid] = [frame_index, off, length, kind]
                    off += length
                pack.length += len(comp)
                bufs.append(comp)
                raw += size
                self._written[0] += len(comp)
                self._written[1] += len(meta)
                i += 1
                if pack.length >= PACK_TARGET:
                    break
            if self._writers is None:
                from concurrent.futures import ThreadPoolExecutor

                self._writers = ThreadPoolExecutor(max_workers=default_writers(), thread_name_prefix="envvault-write")
            pack.writes.append(self._writers.submit(self._write_frames, pack.fd, bufs, at, raw))
            if pack.length >= PACK_TARGET:
                self._close_pack()
        if timing.ON:
            timing.add("pack thread: place frames", t0)

    def _write_frames(self, fd: int, bufs: list, at: int, raw: int) -> None:
        """A writer thread: frames written at their place; their room given back to the producer."""
        t0 = timing.clock()
        try:
            _pwrite_all(fd, bufs, at, self.backend)
            for _ in bufs:
                crash_point("pack_frame")
        except BaseException as err:  # noqa: BLE001 - the first error stops the writer
            self._failed(err)
            raise
        finally:
            with self._cv:
                self._held -= len(bufs)
                self._pending_bytes -= raw
                self._cv.notify_all()
            if timing.ON:
                timing.add("writer threads: write frames", t0)

    def _close_pack(self) -> None:
        """Hand the open pack to the closer thread (fsync, id, store, index: ``_store_pack``), in order; the
        pack thread goes on placing frames in the next one."""
        pack, self._pack = self._pack, None
        if pack is None:
            return
        if self._closer is None:
            from concurrent.futures import ThreadPoolExecutor

            self._closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="envvault-close")
        if len(self._closing) >= _CLOSING:
            # A closer slower than this thread (fsync on a slow disk): wait for it, so that temp packs and
            # their open descriptors stay bounded. Its error, if any, is already in ``_error``.
            self._closing[-_CLOSING].exception()
        self._closing.append(self._closer.submit(self._store_pack, pack))

    def _store_pack(self, pack: "_OpenPack") -> None:
        """``_store_pack_now`` on the closer thread; its error stops the pack thread and reaches the producer
        at its next objects, not only at ``flush``."""
        try:
            self._store_pack_now(pack)
        except BaseException as err:  # noqa: BLE001 - kept, and raised by the future too
            self._failed(err)
            raise
        finally:
            self._forget(pack)

    def _forget(self, pack: "_OpenPack") -> None:
        """Close a pack's descriptor once every write to it is done (or cancelled), and remove its temp file
        if it was not stored."""
        _settle(pack.writes)
        if pack.closed:
            return
        pack.closed = True
        os.close(pack.fd)
        if not pack.stored:
            _unlink_quietly(pack.tmp)

    def _store_pack_now(self, pack: "_OpenPack") -> None:
        """Make one written pack durable: its writes done, fsync, its id (the BLAKE3 of its bytes, read back),
        stored under that id, then its index; then ``on_commit``."""
        _settle(pack.writes)  # a failed write has set ``_error`` before its future finished
        if self._error is not None:  # aborted, or an earlier pack or a write failed: this one is not stored
            return
        t0 = timing.clock()
        idx_tmp = tmp_name(self.tmp_dir, "idx")
        try:
            os.fsync(pack.fd)
            pack_id = _hash_fd(pack.fd, pack.length)
            self.backend.save_file("packs", pack_id, pack.tmp)
            pack.stored = True
            crash_point("pack_renamed")
            idx_doc = {"format": 1, "pack": pack_id, "frames": pack.frames, "objects": pack.objects}
            idx_bytes = json.dumps(idx_doc, separators=(",", ":")).encode()
            with open(idx_tmp, "wb") as f:
                f.write(idx_bytes)
                f.flush()
                os.fsync(f.fileno())
            self.backend.save_file("index", pack_id, idx_tmp)
        except OSError as err:
            _unlink_quietly(idx_tmp)
            raise storage_error(err, self.backend.location, vault=True) from None
        except BaseException:
            _unlink_quietly(idx_tmp)
            raise
        crash_point("pack_indexed")
        frames = pack.frames
        locs = {oid: (pack_id, frames[fi][0], frames[fi][1], off, length, kind)
                for oid, (fi, off, length, kind) in pack.objects.items()}
        self.on_commit(pack_id, locs)
        if timing.ON:
            timing.add("closer thread: store packs (fsync, id, index)", t0)

    def _wait_closed(self) -> None:
        """Wait for every pack handed to the closer; the first failure is raised (and kept in ``_error``)."""
        while self._closing:
            fut = self._closing.popleft()
            try:
                fut.result()
            except BaseException as err:  # noqa: BLE001 - kept, raised below
                self._failed(err)

    def flush(self) -> None:
        """Make every queued object durable (packs and index files written)."""
        self._flush_frame()
        self._stop_thread()
        self._close_pack()  # the pack thread closed its last pack; none is open unless it failed
        self._wait_closed()
        self._raise_failed()

    def _stop_thread(self) -> None:
        thread = self._thread
        if thread is None:
            return
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        # The pack thread's own word that it ended: a join interrupted by Ctrl-C (in flush) marks a running
        # thread as stopped on CPython up to 3.11, so abort's join after it would return at once.
        self._done.wait()
        thread.join()
        self._thread = None

    def abort(self) -> None:
        with self._cv:
            for fut, _, _ in self._pending:
                fut.cancel()
            if self._error is None:
                self._error = _Aborted()
            self._cv.notify_all()
        self._stop_thread()
        if self._writers is not None:
            self._writers.shutdown(wait=True, cancel_futures=True)  # nothing writes to a temp pack after this
        if self._pack is not None:
            self._forget(self._pack)
            self._pack = None
        self._wait_closed()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._closer is not None:
            self._closer.shutdown(wait=True)  # idle now (``_wait_closed``): its thread ends with the writer

    def close(self) -> None:
        for pool in (self._pool, self._writers, self._closer):
            if pool is not None:
                pool.shutdown(wait=True)


class _Aborted(Exception):
    """The writer was aborted: the pack thread stops before its next frame."""


class _OpenPack:
    """A temp pack being written: its descriptor, where its next frame goes, its frames and objects (its
    index), and the writes handed to the writer threads (the closer waits for them)."""

    __slots__ = ("fd", "tmp", "length", "frames", "objects", "writes", "stored", "closed")

    def __init__(self, fd: int, tmp: Path) -> None:
        self.fd, self.tmp = fd, tmp
        self.length = 0
        self.frames: list[list[int]] = []
        self.objects: dict[str, list] = {}
        self.writes: list = []
        self.stored = False
        self.closed = False


def _pwrite_all(fd: int, bufs: "bytes | list", at: int, backend: Backend) -> None:
    """Write ``bufs`` (one buffer or several, in order) at offset ``at``, however many calls it takes."""
    views = [memoryview(bufs)] if isinstance(bufs, bytes) else [memoryview(b) for b in bufs]
    try:
        while views:
            n = os.pwritev(fd, views[:_IOV_MAX], at)
            if not n:
                raise OSError(errno.EIO, "a write to a temp pack wrote nothing")
            at += n
            while views and n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            if n:
                views[0] = views[0][n:]
    except OSError as err:
        raise storage_error(err, backend.location, vault=True) from None


def _settle(futures: list) -> None:
    """Wait until each future finished or was cancelled (``concurrent.futures.wait`` never returns for a
    future cancelled by an executor's shutdown); their errors are the caller's ``_error`` already."""
    if not futures:
        return
    from concurrent.futures import CancelledError  # imported already: futures come from a pool

    for fut in futures:
        try:
            fut.exception()
        except CancelledError:
            pass


_hash_buf = threading.local()
def _hash_fd(fd: int, length: int) -> str:
    """A written pack's id: the BLAKE3 of its ``length`` bytes, read back from its descriptor (the closer
    hashes what is on disk instead of the pack thread hashing frame by frame). On the closer's thread alone,
    not on BLAKE3's pool: that pool's threads outlive the hash, and a process that has them does not fork
    (``forked.can_fork``), so a restore after its backup, or guard's rollback after its snapshots, wrote on
    threads (helper 33). One thread keeps up: it hashes 5.9 GB/s in 4 MiB updates (this 2-core machine,
    2026-12-07; BLAKE3's pool 4.6 GB/s), a pack is 32 MiB (``PACK_TARGET``: 6 ms), and a 16-core first snap
    writes packs at about 0.4 GB/s (3.3 GB in 8 s on the device)."""
    buf = getattr(_hash_buf, "buf", None)
    if buf is None:
        buf = _hash_buf.buf = bytearray(_HASH_READ)
    view = memoryview(buf)
    h = blake3.blake3(max_threads=1)
    at = 0
    while at < length:
        n = os.preadv(fd, [view[:min(_HASH_READ, length - at)]], at)
        if not n:
            raise OSError(errno.EIO, "a temp pack is shorter than what was written to it")
        h.update(view[:n])
        at += n
    return h.hexdigest()


def _unlink_quietly(*paths: Path) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


_dctx = threading.local()


def check_frame(pack_id: str, offset: int, length: int) -> None:
    """The one rule for what an index may claim of a frame (an index may be hostile): a CorruptError for a
    frame no pack writer makes, before a byte of it is read."""
    if not (0 <= offset and 0 < length <= MAX_FRAME + (1 << 20)):  # a frame never compresses to more
        raise CorruptError(f"pack {pack_id}.pack: the index gives a frame of {length} bytes at {offset}; refused")


def read_frame(backend: Backend, pack_id: str, offset: int, length: int) -> bytes:
    """Read and decompress one frame of pack ``pack_id``; damage becomes a CorruptError naming the pack."""
    name = f"{pack_id}.pack"
    check_frame(pack_id, offset, length)
    try:
        comp = backend.load("packs", pack_id, offset, length)
    except Missing:
        raise CorruptError(f"pack {name} is missing; run `envvault verify` (or, when a gc ran meanwhile, this "
                           "command again: readers take no lock)") from None
    except ReadFailed as err:
        raise CorruptError(f"pack {name} cannot be read ({err.why}); run `envvault verify --read-data`") from None
    if len(comp) != length:
        raise CorruptError(f"pack {name} is truncated; run `envvault verify --read-data`")
    import zstandard

    d = getattr(_dctx, "d", None)
    if d is None:
        d = _dctx.d = zstandard.ZstdDecompressor()
    try:
        params = zstandard.get_frame_parameters(comp)
        if params.content_size > MAX_FRAME:
            raise CorruptError(f"pack {name} holds a frame of {params.content_size} bytes; refused")
        return d.decompress(comp, max_output_size=MAX_FRAME)
    except zstandard.ZstdError as err:
        raise CorruptError(f"pack {name} has a damaged frame at {offset} ({err}); run `envvault verify --read-data`") from None
