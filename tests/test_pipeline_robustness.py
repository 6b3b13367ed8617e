"""The threaded ingest pipeline under failure: a FileSlice whose file turned into something else, a pack that
cannot be stored, a closer thread that falls behind. Each must end in one clear error (or bounded waiting),
never a hang, wrong bytes, a stray temp file or unbounded resources."""

from __future__ import annotations

import errno
import os
import random
import threading
from pathlib import Path

import pytest

HANG = 20  # seconds: a call still running after this is hung (an error is expected within milliseconds)


def _tmp_files(vault_dir: Path) -> list[str]:
    return sorted(p.name for p in (vault_dir / "tmp").rglob("*") if p.is_file())


def _add_then_flush(writer, n: int, added: list) -> None:
    """Add ``n`` objects of 600 kB (a frame each; a pack each where PACK_TARGET is small), then flush, counting
    the objects added in ``added[0]``; on any error abort the writer (as a snap's transaction does) and raise."""
    from envvault.model.encoding import object_id

    try:
        for i in range(n):
            data = i.to_bytes(4, "big") + bytes(600_000)
            writer.add(object_id(data), data)
            added[0] += 1
        writer.flush()
    except BaseException:
        writer.abort()
        raise


def _run_or_unhang(fn, fifo: Path | None = None):
    """``fn()`` on a thread; its exception (or None). A call that does not return within HANG seconds is a
    hang: a writer is opened on ``fifo`` to release it, and the test fails."""
    got: dict = {}

    def go():
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - inspected by the test
            got["err"] = err

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(HANG)
    if t.is_alive():
        if fifo is not None:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                pass
        t.join(HANG)
        pytest.fail("hung: opening a FIFO blocks until a writer comes")
    return got.get("err")


def _snap_changing(monkeypatch, vault_dir: Path, paths: list, big: Path, before_emit, fifo: Path | None = None):
    """Ingest ``paths`` into a new vault at ``vault_dir`` on reader threads, ``big`` weighing 9 MiB (named
    ahead where namers run), ``before_emit(path, oid, piece)`` called as each chunk of a large file is cut,
    before it goes on; (the error or None, the digests yielded)."""
    from envvault.vault import ingest
    from envvault.vault.store import Vault
    from envvault.vault.transaction import snapshot_transaction

    real = ingest._cut_named

    def cut(f, path, update, chunks, emit, *a, **k):
        def emit_after(oid, piece):
            before_emit(Path(path), oid, piece)
            emit(oid, piece)

        return real(f, path, update, chunks, emit_after, *a, **k)

    monkeypatch.setattr(ingest, "_cut_named", cut)
    vault = Vault.open(vault_dir, create=True)
    digests = []

    def size(p: Path) -> int:
        return 9 << 20 if p == big else p.stat().st_size

    def snap():
        with snapshot_transaction(vault) as txn:
            ing = ingest.Ingester(txn.writer, vault.has, threads=3)
            for d in ing.map_ordered(lambda p, read: read(p, size(p)), paths, weight=size, path=lambda p: p):
                digests.append(d)
            txn.flush()

    return _run_or_unhang(snap, fifo), digests


@pytest.mark.parametrize("how", ["fifo", "symlink-to-fifo", "directory"])
def test_slice_whose_file_became_a_fifo_is_an_error_not_a_hang(tmp_path, how):
    """A named chunk's file replaced by a FIFO (or a symlink to one, or a folder) before the compressor reads
    it again: one clear EnvironmentProblem, at once; nothing stored, no temp file left."""
    from envvault.errors import EnvironmentProblem
    from envvault.model.encoding import object_id
    from envvault.vault.packs import FileSlice
    from envvault.vault.store import Vault
    from envvault.vault.transaction import snapshot_transaction

    path = tmp_path / "lib.so"
    data = random.Random(4).randbytes(2 << 20)
    path.write_bytes(data)
    oid = object_id(data)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
        fifo = path
    elif how == "symlink-to-fifo":
        path.symlink_to(fifo)
    else:
        path.mkdir()

    err = _run_or_unhang(lambda: FileSlice(path, 0, len(data)).load(oid), fifo)
    assert isinstance(err, EnvironmentProblem) and str(path) in str(err), err

    vault = Vault.open(tmp_path / "v", create=True)

    def snap():
        with snapshot_transaction(vault, threads=2) as txn:
            txn.writer.add(object_id(b"a" * 700_000), b"a" * 700_000)  # a pack is open when the slice fails
            txn.writer.add(oid, FileSlice(path, 0, len(data)))
            txn.flush()

    err = _run_or_unhang(snap, fifo)
    assert isinstance(err, EnvironmentProblem) and str(path) in str(err), err
    assert not vault.has(oid)
    assert _tmp_files(tmp_path / "v") == []
    assert not any((tmp_path / "v" / "packs").rglob("*.pack"))


def test_pack_that_cannot_be_stored_stops_the_writer(tmp_path, monkeypatch):
    """The closer thread fails to store a pack (the disk is full): the producer hears of it at its next
    objects, not only at flush after compressing everything else; one StorageError, no temp file left,
    and no later pack stored."""
    from envvault.errors import EnvvaultError
    from envvault.vault import packs
    from envvault.vault.store import Vault

    monkeypatch.setattr(packs, "PACK_TARGET", 1)  # every frame closes its pack
    vault = Vault.open(tmp_path / "v", create=True)
    saved = []

    def full(kind, name, src):
        if kind == "packs":
            raise OSError(errno.ENOSPC, "No space left on device")
        saved.append((kind, name))

    monkeypatch.setattr(vault.backend, "save_file", full)
    writer = vault.writer(threads=2)
    n, added = 300, [0]
    with pytest.raises(EnvvaultError, match="[Ss]pace"):
        _add_then_flush(writer, n, added)
    writer.close()
    added = added[0]
    assert added < n // 2, f"the producer went on for {added} objects after the first pack failed"
    assert saved == []
    assert _tmp_files(tmp_path / "v") == []
    assert not any((tmp_path / "v" / "packs").rglob("*.pack"))


def test_packs_waiting_for_the_closer_are_bounded(tmp_path, monkeypatch):
    """A closer thread slower than the pack thread (fsync on a slow disk): the pack thread waits for it
    after a few packs, so temp packs (open file descriptors, disk) stay bounded."""
    from envvault.model.encoding import object_id
    from envvault.vault import packs
    from envvault.vault.store import Vault

    monkeypatch.setattr(packs, "PACK_TARGET", 1)
    vault = Vault.open(tmp_path / "v", create=True)
    release = threading.Event()
    real = vault.backend.save_file

    def slow(kind, name, src):
        release.wait(60)
        return real(kind, name, src)

    monkeypatch.setattr(vault.backend, "save_file", slow)
    writer = vault.writer(threads=2)
    objects = []
    for i in range(60):
        data = i.to_bytes(4, "big") + bytes(600_000)
        objects.append((object_id(data), data))
    all_added = threading.Event()

    def produce():
        for oid, data in objects:
            writer.add(oid, data)
        all_added.set()

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    all_added.wait(3)  # unbounded: every pack is written (all added at once); bounded: the producer waits
    waiting = [n for n in _tmp_files(tmp_path / "v") if n.startswith(".pack")]
    release.set()
    t.join(60)
    assert not t.is_alive()
    writer.flush()
    writer.close()
    assert len(waiting) <= 6, f"{len(waiting)} temp packs held open while the closer was busy"
    assert all(vault.has(oid) for oid, _ in objects)
    assert _tmp_files(tmp_path / "v") == []


@pytest.mark.parametrize("namers", ["0", "2"])
@pytest.mark.parametrize("how", ["rewrite", "truncate", "fifo", "symlink"])
def test_large_file_changed_after_naming_fails_the_snap_cleanly(tmp_path, monkeypatch, namers, how):
    """A large file cut and named by a reader or a namer, then changed before its chunks are compressed
    (rewritten, truncated, replaced by a FIFO or by a symlink to other bytes): one EnvironmentProblem
    naming it, every thread stopped, no temp file and none of its chunks in the vault."""
    from envvault.errors import EnvironmentProblem
    from envvault.vault.store import Vault

    monkeypatch.setenv("ENVVAULT_NAMERS", namers)
    rng = random.Random(7)
    root = tmp_path / "t"
    root.mkdir()
    paths = []
    for i, size in enumerate([300, 9 << 20, 70_000, 5]):
        p = root / f"{i}.bin"
        p.write_bytes(rng.randbytes(size))
        paths.append(p)
    big = paths[1]
    other = tmp_path / "other.bin"
    other.write_bytes(rng.randbytes(9 << 20))

    def change():
        if how == "rewrite":
            big.write_bytes(rng.randbytes(9 << 20))
        elif how == "truncate":
            os.truncate(big, 1 << 20)
        else:
            big.unlink()
            if how == "fifo":
                os.mkfifo(big)
            else:
                big.symlink_to(other)

    changed = []

    def change_once(path, oid, piece):
        """The file changes once its first chunk is named, before that chunk goes on: its compressor reads
        the new state (a namer hands its chunks on only once the whole file is named)."""
        if path == big and not changed:
            changed.append(1)
            change()

    before = threading.active_count()
    err, digests = _snap_changing(monkeypatch, tmp_path / "v", paths, big, change_once, big if how == "fifo" else None)
    assert isinstance(err, EnvironmentProblem) and str(big) in str(err), repr(err)
    assert threading.active_count() <= before, threading.enumerate()
    assert _tmp_files(tmp_path / "v") == []
    if len(digests) >= 2:  # the chunks were compressed later: the error came at flush
        assert not any(Vault.open(tmp_path / "v").has(oid) for oid in digests[1].chunks)


@pytest.mark.parametrize("how", ["rewrite", "truncate", "append", "replace"])
def test_a_large_file_changed_while_read_is_never_stored_torn(tmp_path, monkeypatch, how):
    """A large file whose chunks are all stored as they were read (each below half a frame: none is read again
    at its turn), written to between two of its windows (rewritten in place, truncated, grown): one
    EnvironmentProblem naming it (``_version`` before and after the read), every thread stopped, no temp
    file, none of its chunks in the vault; without that check its digest and chunks would be a mix of two
    states. Replaced under its name instead (a new file moved over it): the open file is the old one, read
    whole, and the vault holds exactly its bytes."""
    from envvault.errors import EnvironmentProblem
    from envvault.vault import ingest, packs
    from envvault.vault.store import Vault

    monkeypatch.setenv("ENVVAULT_NAMERS", "0")
    for module in (ingest, packs):  # every chunk is small: stored as read, never a FileSlice
        monkeypatch.setattr(module, "FRAME_TARGET", 64 << 20)
    rng = random.Random(11)
    root = tmp_path / "t"
    root.mkdir()
    small, big = root / "a.txt", root / "big.bin"
    small.write_bytes(b"x" * 300)
    old = rng.randbytes(9 << 20)
    big.write_bytes(old)
    kinds, big_oids = [], []

    def change_once(path, oid, piece):
        """The file changes once its first window is cut, before the rest of it is read."""
        if path != big:
            return
        if not kinds:
            if how == "rewrite":
                with big.open("r+b") as g:  # in place: the same size, other bytes
                    g.write(rng.randbytes(9 << 20))
            elif how == "truncate":
                os.truncate(big, 7 << 20)
            elif how == "append":
                with big.open("ab") as g:
                    g.write(b"more")
            else:
                (root / "new.bin").write_bytes(rng.randbytes(9 << 20))
                os.replace(root / "new.bin", big)
        kinds.append(type(piece).__name__)
        big_oids.append(oid)

    before = threading.active_count()
    err, digests = _snap_changing(monkeypatch, tmp_path / "v", [small, big], big, change_once)
    assert len(kinds) >= 2 and set(kinds) == {"bytes"}, kinds  # read in two windows at least, every chunk as bytes
    assert threading.active_count() <= before, threading.enumerate()
    assert _tmp_files(tmp_path / "v") == []
    stored = Vault.open(tmp_path / "v")
    if how == "replace":
        import hashlib

        from envvault.model.record import record_sha256

        assert err is None, repr(err)
        assert digests[1].sha256 == record_sha256(hashlib.sha256(old).digest())
        assert b"".join(bytes(stored.get(oid)) for oid in digests[1].chunks) == old
    else:
        assert isinstance(err, EnvironmentProblem) and str(big) in str(err) and "changed while" in str(err), repr(err)
        assert len(digests) == 1  # the small file's; the large one's chunks were never stored
        assert not any(stored.has(oid) for oid in big_oids)


@pytest.mark.parametrize("writers", ["1", "3"])
def test_abort_stops_every_writer_thread(tmp_path, monkeypatch, writers):
    """After abort, no compressor, pack, writer or closer thread of the writer is left running (a pack had
    been handed to the closer before the abort)."""
    from envvault.model.encoding import object_id
    from envvault.vault import packs
    from envvault.vault.store import Vault

    monkeypatch.setenv("ENVVAULT_WRITERS", writers)
    monkeypatch.setattr(packs, "PACK_TARGET", 1)
    vault = Vault.open(tmp_path / "v", create=True)
    committed = threading.Event()
    real = vault._add_to_index
    monkeypatch.setattr(vault, "_add_to_index", lambda *a: (real(*a), committed.set()))
    before = set(threading.enumerate())
    writer = vault.writer(threads=2)
    for i in range(3):
        data = i.to_bytes(4, "big") + bytes(600_000)
        writer.add(object_id(data), data)
    assert committed.wait(30)  # the closer stored a pack
    writer.abort()
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert left == [], left
    assert _tmp_files(tmp_path / "v") == []


@pytest.mark.parametrize("threads", [1, 3])
def test_a_fifo_where_a_file_was_is_one_error_not_a_hang(tmp_path, threads):
    """A FIFO (or a symlink to one) where the scan saw a file, read at its turn: one EnvironmentProblem naming
    it, on the calling thread and on the reader threads alike; opening it never waits for a writer."""
    from envvault.errors import EnvironmentProblem
    from envvault.vault.ingest import Ingester

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(fifo)
    ok = tmp_path / "ok.txt"
    ok.write_bytes(b"fine")
    for bad in (fifo, link):
        ing = Ingester(None, lambda oid: True, store=False, threads=threads)
        got = []
        done = threading.Event()

        def run():
            try:
                for d in ing.map_ordered(lambda p, read: read(p, 10), [ok, bad]):
                    got.append(d)
            except EnvironmentProblem as err:
                got.append(str(err))
            done.set()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        assert done.wait(60), "hung on the FIFO"
        assert len(got) == 2 and got[0].size == 4
        assert "not a regular file" in got[1] and str(bad) in got[1]


def _write_objects(vault_dir: Path, n: int = 60) -> list[str]:
    """``n`` objects of mixed sizes (small ones grouped into frames, large ones a frame each) through one
    pack writer; the names of the pack and index files it stored."""
    from envvault.model.encoding import object_id
    from envvault.vault.store import Vault

    vault = Vault.open(vault_dir, create=True)
    writer = vault.writer(threads=3)
    rng = random.Random(5)
    for i in range(n):
        size = rng.choice([300, 40_000, 700_000, 1_500_000])
        data = i.to_bytes(4, "big") + rng.randbytes(size // 2) + bytes(size // 2)  # compresses to about half
        writer.add(object_id(data), data)
    writer.flush()
    writer.close()
    return sorted(str(p.relative_to(vault_dir)) for top in ("packs", "index")
                  for p in (vault_dir / top).rglob("*") if p.is_file())


def test_packs_are_the_same_bytes_with_one_and_four_writer_threads(tmp_path, monkeypatch):
    """Frames written by several writer threads (each at the place the pack thread gave it, several packs at
    once) make the same packs and index files as one writer thread; each pack's name is the BLAKE3 of its
    bytes (the closer reads the pack back to name it)."""
    import blake3

    from envvault.vault import packs

    monkeypatch.setattr(packs, "PACK_TARGET", 256 << 10)  # many packs, written side by side
    got = {}
    for writers in ("1", "4"):
        monkeypatch.setenv("ENVVAULT_WRITERS", writers)
        vault_dir = tmp_path / f"v{writers}"
        names = _write_objects(vault_dir)
        got[writers] = {name: (vault_dir / name).read_bytes() for name in names}
        pack_files = [n for n in names if n.startswith("packs")]
        assert len(pack_files) > 10, pack_files
        for name in pack_files:
            assert Path(name).stem == blake3.blake3(got[writers][name]).hexdigest(), name
        assert _tmp_files(vault_dir) == []
    assert got["1"] == got["4"]


@pytest.mark.parametrize("writers", ["1", "3"])
def test_a_frame_that_cannot_be_written_stops_the_writer(tmp_path, monkeypatch, writers):
    """A writer thread's pwrite fails (the disk filled up): the producer hears of it at its next objects, one
    StorageError; no temp pack is left and no pack is stored."""
    from envvault.errors import StorageError
    from envvault.vault import packs
    from envvault.vault.store import Vault

    monkeypatch.setenv("ENVVAULT_WRITERS", writers)
    monkeypatch.setattr(packs, "PACK_TARGET", 1 << 20)
    real = os.pwritev
    calls = []

    def filling(fd, bufs, at):
        calls.append(at)
        if len(calls) > 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, bufs, at)

    monkeypatch.setattr(os, "pwritev", filling)
    vault = Vault.open(tmp_path / "v", create=True)
    writer = vault.writer(threads=2)
    n, added = 300, [0]
    err = _run_or_unhang(lambda: _add_then_flush(writer, n, added))
    writer.close()
    added = added[0]
    assert isinstance(err, StorageError) and "space" in str(err).lower(), err
    assert added < n // 2, f"the producer went on for {added} objects after a write failed"
    assert _tmp_files(tmp_path / "v") == []
    assert not any((tmp_path / "v" / "packs").rglob("*.pack"))


def test_ctrl_c_while_flush_waits_then_abort_leaves_nothing(tmp_path, monkeypatch):
    """Ctrl-C while ``flush`` waits for the pack thread, then ``abort`` (as a snap's transaction does): abort
    waits for the pack thread itself (an interrupted ``Thread.join`` marks a running thread as stopped on
    CPython up to 3.11), so no thread, temp pack or descriptor is left. (Found by a helper's review.)"""
    import signal
    import time

    from envvault.model.encoding import object_id
    from envvault.vault import packs
    from envvault.vault.store import Vault

    monkeypatch.setattr(packs, "PACK_TARGET", 1)  # every frame its own pack
    vault = Vault.open(tmp_path / "v", create=True)
    writer = vault.writer(threads=1)
    real = writer._compress_now

    def slow(items):  # a slow compressor: flush waits a while for the pack thread
        time.sleep(0.05)
        return real(items)

    monkeypatch.setattr(writer, "_compress_now", slow)
    fds_before = set(os.listdir("/proc/self/fd"))
    for i in range(20):
        data = i.to_bytes(4, "big") + bytes(600_000)
        writer.add(object_id(data), data)
    old = signal.signal(signal.SIGALRM, signal.default_int_handler)  # raises KeyboardInterrupt, as Ctrl-C
    signal.setitimer(signal.ITIMER_REAL, 0.12)
    try:
        with pytest.raises(KeyboardInterrupt):
            writer.flush()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    writer.abort()
    assert [t.name for t in threading.enumerate() if t.name == "envvault-pack"] == []
    writer.close()
    assert _tmp_files(tmp_path / "v") == []
    assert set(os.listdir("/proc/self/fd")) - fds_before == set()


def test_a_short_read_is_not_the_end_of_a_small_file(tmp_path, monkeypatch):
    """A filesystem that returns fewer bytes than asked (FUSE, NFS, 9p, CIFS): a small file is read to its
    end, not cut at the first short read; a file that grew or shrank since it was listed is read whole."""
    from envvault.vault import ingest

    p = tmp_path / "f"
    data = os.urandom(200_000)
    p.write_bytes(data)
    real = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: real(fd, min(n, 64 << 10)))
    got = ingest._read_file(p, len(data), "sha256", True, lambda oid, d: None)
    assert got.size == len(data)
    for hint in (10, 900_000):  # grown since it was listed, shrunk since
        fd = os.open(p, os.O_RDONLY)
        try:
            assert ingest._read_fd(fd, hint) == data
        finally:
            os.close(fd)


def test_without_glibc_the_malloc_pin_is_tried_once_an_ingest(tmp_path, monkeypatch):
    """Where ``mallopt`` is missing (macOS, musl) the pin is tried once an ingest, not again for each object
    stored after the first 64 MiB. (Found by a helper's review.)"""
    from envvault.vault import ingest
    from envvault.vault.store import Vault
    from envvault.vault.transaction import snapshot_transaction

    calls = []
    monkeypatch.setattr(ingest, "_mallopt", lambda *settings: (calls.append(settings), False)[1])
    monkeypatch.setattr(ingest, "_MALLOC", None)
    monkeypatch.setattr(ingest, "_STEADY_AFTER", 0)  # every stored object would pin
    paths = []
    for i in range(30):
        p = tmp_path / f"{i}.bin"
        p.write_bytes(os.urandom(2000))
        paths.append(p)
    vault = Vault.open(tmp_path / "v", create=True)
    with snapshot_transaction(vault) as txn:
        ing = ingest.Ingester(txn.writer, vault.has, threads=2)
        list(ing.map_ordered(lambda q, read: read(q, q.stat().st_size), paths, weight=lambda q: q.stat().st_size))
        txn.flush()
    assert len(calls) == 1, calls
    assert ingest._MALLOC is None


def test_a_write_that_writes_nothing_is_an_error_not_a_loop(tmp_path, monkeypatch):
    """``pwritev`` returning 0 (nothing written, no error): one StorageError, never an endless retry; no temp
    pack left."""
    from envvault.errors import StorageError
    from envvault.vault.store import Vault

    monkeypatch.setattr(os, "pwritev", lambda fd, bufs, at: 0)
    vault = Vault.open(tmp_path / "v", create=True)
    writer = vault.writer(threads=2)
    err = _run_or_unhang(lambda: _add_then_flush(writer, 5, [0]))
    writer.close()
    assert isinstance(err, StorageError), err
    assert _tmp_files(tmp_path / "v") == []
