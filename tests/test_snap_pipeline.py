"""The snap's reading pipeline (issue 11): files read on several threads, objects stored in file order.

Same vault bytes whatever the thread count, bounded bytes in flight, an error raised at its file's turn
and the reader threads stopped.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import threading
from pathlib import Path

import pytest

from fixtures import catalogue as C
from fixtures import uv_install


def _vault_bytes(root: Path) -> dict[str, bytes]:
    """Every pack and index file of a vault, by its path inside the vault."""
    out = {}
    for kind in ("packs", "index"):
        for path in sorted((root / kind).rglob("*")):
            if path.is_file():
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def _tree(root: Path) -> list[Path]:
    """Small files, files just under and over the 1 MiB chunking size, a 9 MiB file cut into chunks, and
    duplicates (within one file's chunks and across files)."""
    rng = random.Random(11)
    root.mkdir()
    paths = []
    shared = rng.randbytes(300_000)
    for i, size in enumerate([0, 1, 100, 5000, 70_000, 600_000, (1 << 20) - 1, 1 << 20, 3_000_000, 9 << 20]):
        p = root / f"f{i:02d}.bin"
        p.write_bytes(rng.randbytes(size))
        paths.append(p)
    for i in range(40):
        p = root / f"small{i:02d}.txt"
        p.write_bytes(rng.randbytes(rng.randrange(1, 40_000)))
        paths.append(p)
    (root / "dup1.bin").write_bytes(shared)
    (root / "dup2.bin").write_bytes(shared)
    (root / "big-dup.bin").write_bytes((root / "f09.bin").read_bytes())
    paths += [root / "dup1.bin", root / "dup2.bin", root / "big-dup.bin"]
    return paths


def _ingest_tree(vault_dir: Path, paths: list[Path], threads: int) -> list:
    from envvault.vault.ingest import Ingester
    from envvault.vault.store import Vault
    from envvault.vault.transaction import snapshot_transaction

    vault = Vault.open(vault_dir, create=True)
    with snapshot_transaction(vault) as txn:
        ing = Ingester(txn.writer, vault.has, threads=threads)
        digests = list(ing.map_ordered(lambda p, read: read(p, p.stat().st_size), paths))
        txn.flush()
    return digests


def test_same_vault_bytes_whatever_the_thread_count(tmp_path):
    paths = _tree(tmp_path / "tree")
    one = _ingest_tree(tmp_path / "v1", paths, threads=1)
    four = _ingest_tree(tmp_path / "v4", paths, threads=4)
    assert one == four
    assert [d.size for d in one] == [p.stat().st_size for p in paths]
    a, b = _vault_bytes(tmp_path / "v1"), _vault_bytes(tmp_path / "v4")
    assert a and a.keys() == b.keys()
    assert all(a[k] == b[k] for k in a)


def test_sha256_and_chunks_match_the_files(tmp_path):
    import base64

    import blake3

    paths = _tree(tmp_path / "tree")
    digests = _ingest_tree(tmp_path / "v", paths, threads=3)
    from envvault.vault.store import Vault

    vault = Vault.open(tmp_path / "v")
    for p, d in zip(paths, digests):
        data = p.read_bytes()
        assert d.sha256 == base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert b"".join(vault.get(oid) for oid in d.chunks) == data
        assert all(blake3.blake3(vault.get(oid)).hexdigest() == oid for oid in d.chunks)
        if len(data) < 1 << 20:
            assert len(d.chunks) == (1 if data else 0)  # a small file is one blob, an empty one none
        else:  # FastCDC: min 256 KiB, max 4 MiB
            assert all(len(vault.get(oid)) <= 4 << 20 for oid in d.chunks)
    assert len(digests[9].chunks) > 2  # the 9 MiB file


def test_env_snap_same_packs_with_one_and_four_readers(tmp_path, make_venv, wheelhouse, monkeypatch):
    from envvault.snap import take_snapshot
    from envvault.vault import ingest
    from envvault.vault.store import Vault

    venv = make_venv("uv")
    uv_install(venv, *(str(wheelhouse[k]) for k in (C.TORCH_CU128, C.NS_ALPHA, C.WITH_HEADERS, C.SMALL_01)))
    snaps = {}
    for n in (1, 4):
        monkeypatch.setattr(ingest, "default_readers", lambda n=n: n)
        vault = Vault.open(tmp_path / f"v{n}", create=True)
        snaps[n] = take_snapshot(vault, venv, argv=["test"])
    assert snaps[1].snapshot.fingerprint == snaps[4].snapshot.fingerprint
    assert [p.manifest for p in snaps[1].snapshot.packages] == [p.manifest for p in snaps[4].snapshot.packages]
    a, b = _vault_bytes(tmp_path / "v1"), _vault_bytes(tmp_path / "v4")
    assert a and a == b


def test_a_planned_read_holds_its_stat_key_not_its_stat_result(tmp_path, make_venv, wheelhouse, monkeypatch):
    """A full scan plans every read ahead of the pipeline (tens of thousands on a GPU host's venv), so a
    ``ReadRequest`` holds no ``os.stat_result`` (about 600 bytes of objects) and no absolute path of its own:
    its stat key, the stat cache then keeps as it is (the same list), and its path relative to the root (the
    manifest entry's own string), the absolute path made from the root when asked for."""
    import gc

    from envvault.snap import manifests, take_snapshot
    from envvault.vault.statcache import StatCache
    from envvault.vault.store import Vault

    venv = make_venv("uv")
    uv_install(venv, *(str(wheelhouse[k]) for k in (C.TORCH_CU128, C.SMALL_01)))
    plans, kept = [], []
    real_plan, real_put_key = manifests.ManifestBuilder.plan, StatCache.put_key
    monkeypatch.setattr(manifests.ManifestBuilder, "plan", lambda self, dist: plans.append(real_plan(self, dist)) or plans[-1])
    monkeypatch.setattr(StatCache, "put_key", lambda self, rel, key, *a: kept.append(key) or real_put_key(self, rel, key, *a))
    take_snapshot(Vault.open(tmp_path / "v", create=True), venv, argv=["test"])
    reads = [r for plan in plans for r in plan.reads]
    assert len(reads) > 20 and kept, (len(reads), len(kept))
    for r in reads:
        assert not any(isinstance(o, os.stat_result) for o in gc.get_referents(r)), r
        st = os.lstat(r.absolute)
        assert r.absolute == os.path.join(str(venv), r.rel) and r.size == st.st_size
        assert r.key == [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
        assert r.rel is r.entry["path"]  # one string for both
    assert {id(k) for k in kept} <= {id(r.key) for r in reads}  # the stat cache keeps the request's key itself


def _small_read_ahead(monkeypatch, tmp_path: Path, sizes: list[int], seed: int) -> list[Path]:
    """A 2 MiB read-ahead (1 MiB more for the head) and files of ``sizes`` random bytes to read."""
    from envvault.vault import ingest

    monkeypatch.setattr(ingest, "READ_AHEAD", 2 << 20)
    monkeypatch.setattr(ingest, "HEAD_AHEAD", 1 << 20)
    rng = random.Random(seed)
    root = tmp_path / "t"
    root.mkdir()
    paths = []
    for i, size in enumerate(sizes):
        p = root / f"{i:02d}"
        p.write_bytes(rng.randbytes(size))
        paths.append(p)
    return paths


def test_bytes_in_flight_are_bounded(tmp_path, monkeypatch):
    """Readers far ahead of a slow storing thread wait: bytes read and not yet stored stay near the limit."""
    from envvault.vault import ingest

    paths = _small_read_ahead(monkeypatch, tmp_path, [200_000] * 60, seed=3)
    peak = 0
    budgets = []
    real = ingest._Budget

    class Watched(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            budgets.append(self)

        def acquire(self, job, n):
            nonlocal peak
            super().acquire(job, n)
            peak = max(peak, self.used)

        def try_acquire(self, job, n):
            nonlocal peak
            took = super().try_acquire(job, n)
            peak = max(peak, self.used)
            return took

    monkeypatch.setattr(ingest, "_Budget", Watched)

    class SlowWriter:
        def __init__(self):
            self.added = []

        def add(self, oid, data, kind="b"):
            threading.Event().wait(0.002)
            self.added.append(oid)

        def queued(self, oid):
            return False

    writer = SlowWriter()
    ing = ingest.Ingester(writer, lambda oid: False, threads=4)
    digests = list(ing.map_ordered(lambda p, read: read(p, p.stat().st_size), paths))
    assert len(digests) == 60 and len(writer.added) == 60
    assert writer.added == [d.chunks[0] for d in digests]  # stored in the files' order
    assert budgets and budgets[0].limit == 2 << 20
    assert 0 < peak <= budgets[0].limit + (1 << 20)


def test_a_reader_hands_over_what_it_holds_before_it_waits(tmp_path, monkeypatch):
    """Readers hand objects over a list at a time; a reader whose list holds more than the room left must
    hand it over before it waits, or the storing thread (waiting for that list) and the reader wait on each
    other. Hand-over sizes larger than the whole budget leave only that rule to avoid it: 200 files of 4 KB
    in batches of 64 with a 64 KiB read-ahead end, in order (they hung before the rule)."""
    from envvault.vault import ingest

    paths = _small_read_ahead(monkeypatch, tmp_path, [4000] * 200, seed=5)
    monkeypatch.setattr(ingest, "HAND_OVER_ITEMS", 1 << 20)
    monkeypatch.setattr(ingest, "HAND_OVER_BYTES", 1 << 30)
    monkeypatch.setattr(ingest, "HEAD_AHEAD", 32 << 10)
    real = ingest._Budget

    class Small(real):
        def __init__(self, limit, head):
            super().__init__(64 << 10, head)  # below map_ordered's 16 MiB floor

    monkeypatch.setattr(ingest, "_Budget", Small)

    class Writer:
        def __init__(self):
            self.added = []

        def add(self, oid, data, kind="b"):
            self.added.append(oid)

        def queued(self, oid):
            return False

    writer = Writer()
    ing = ingest.Ingester(writer, lambda oid: False, threads=2)
    out: list = []
    t = threading.Thread(target=lambda: out.extend(ing.map_ordered(lambda p, read: read(p, 4000), paths,
                                                                     weight=lambda p: 4000)), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "readers and the storing thread waited on each other"
    assert len(out) == 200 and writer.added == [d.chunks[0] for d in out]


@pytest.mark.parametrize("weight", [None, lambda p: 1000])  # one file a job; batches of many files
def test_error_is_raised_at_its_turn_and_readers_stop(tmp_path, weight):
    from envvault.errors import EnvironmentProblem
    from envvault.vault.ingest import Ingester

    root = tmp_path / "t"
    root.mkdir()
    paths = []
    for i in range(30):
        p = root / f"{i:02d}"
        p.write_bytes(os.urandom(50_000))
        paths.append(p)
    paths[7] = root / "gone"  # not there: reading it fails
    ing = Ingester(None, lambda oid: True, store=False, threads=4)
    seen = []
    before = threading.active_count()
    with pytest.raises(EnvironmentProblem, match="gone"):
        for d in ing.map_ordered(lambda p, read: read(p, 50_000), paths, weight=weight):
            seen.append(d)
    assert len(seen) == 7
    assert threading.active_count() <= before  # the reader threads were joined


def test_cache_snap_same_packs_with_one_and_four_readers(tmp_path, monkeypatch):
    from envvault.caches.snap import take_cache_snapshot
    from envvault.vault import ingest
    from envvault.vault.store import Vault

    root = tmp_path / "inductor"
    _tree(root)
    (root / "fxgraph" / "ab").mkdir(parents=True)
    (root / "fxgraph" / "ab" / "entry").write_bytes(random.Random(5).randbytes(2_500_000))
    ids = {}
    for n in (1, 4):
        monkeypatch.setattr(ingest, "default_readers", lambda n=n: n)
        vault = Vault.open(tmp_path / f"v{n}", create=True)
        res = take_cache_snapshot(vault, extra_dirs=[root], discover=False, argv=["test"])
        assert not res.snapshot.warnings, res.snapshot.warnings
        ids[n] = [c.manifest for c in res.snapshot.caches]
    assert ids[1] == ids[4] and ids[1][0]
    a, b = _vault_bytes(tmp_path / "v1"), _vault_bytes(tmp_path / "v4")
    assert a and a == b


def test_large_file_hashed_aside_and_hash_only(tmp_path, monkeypatch):
    """A file past HASH_ASIDE gets its sha256 from the helper thread; without storing, no chunking."""
    import base64

    from envvault.vault import ingest

    monkeypatch.setattr(ingest, "HASH_ASIDE", 3 << 20)
    monkeypatch.setattr(ingest, "_HASH_ASIDE_OK", True)  # as on a host of 8 cores or more
    started = []
    real_aside = ingest._HashAside
    monkeypatch.setattr(ingest, "_HashAside", lambda h: started.append(1) or real_aside(h))
    p = tmp_path / "big.so"
    data = random.Random(9).randbytes(7 << 20)
    p.write_bytes(data)
    want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    seen = []
    ing = ingest.Ingester(None, lambda oid: True, threads=1)
    ing._emit_now = lambda oid, chunk: seen.append(len(chunk))
    d = ing.ingest(p, len(data))
    assert d.sha256 == want and d.size == len(data) and sum(seen) == len(data) and len(d.chunks) == len(seen) > 1
    assert started == [1]
    check = ingest.Ingester(None, lambda oid: True, store=False, threads=2)
    (got,) = list(check.map_ordered(lambda path, read: read(path, len(data)), [p]))
    assert got.sha256 == want and got.size == len(data) and got.chunks is None
    p.unlink()
    with pytest.raises(ingest.EnvironmentProblem):
        ing.ingest(p, len(data))


@pytest.mark.parametrize("size", [1 << 20, (6 << 20) - 1, 6 << 20, (6 << 20) + 1, (8 << 20) + 1, 21 << 20])
def test_windowed_cut_is_cut_stream(tmp_path, size):
    """A reader thread cuts a large file in 6 MiB windows holding no chunk (``_cut_named``): the chunks,
    their ids and the file's sha256 are exactly those of FastCDC's ``cut_stream`` over the whole file, with
    runs of zeros (chunks cut at the largest size) and random bytes; big chunks become FileSlices of it."""
    from envvault.model.encoding import object_id
    from envvault.vault import ingest
    from envvault.vault.packs import FileSlice

    rng = random.Random(size)
    data = bytearray(rng.randbytes(size))
    data[size // 3: size // 3 + (9 << 20)] = bytes(len(data[size // 3: size // 3 + (9 << 20)]))
    path = tmp_path / "big.bin"
    path.write_bytes(bytes(data))
    want = [bytes(c.data) for c in ingest._chunker().cut_stream(open(path, "rb"))]
    emitted = []
    h = hashlib.sha256()
    chunks: list[str] = []
    with open(path, "rb") as f:
        got_size = ingest._cut_named(f, path, h.update, chunks, lambda oid, d: emitted.append((oid, d)))
    assert got_size == size and h.digest() == hashlib.sha256(data).digest()
    assert chunks == [object_id(c) for c in want] == [oid for oid, _ in emitted]
    offset = 0
    for (oid, d), c in zip(emitted, want):
        if len(c) >= (512 << 10):
            assert isinstance(d, FileSlice) and (d.offset, d.length) == (offset, len(c))
            assert d.load(oid) == c
        else:
            assert d == c
        offset += len(c)


def test_file_changed_after_its_chunks_were_named_stores_nothing(tmp_path):
    """The compressor reads a FileSlice again: bytes that no longer have the id the reader gave them (the
    file changed in between) stop the snap with one clear error, and no pack is left behind."""
    from envvault.errors import EnvironmentProblem
    from envvault.model.encoding import object_id
    from envvault.vault.packs import FileSlice
    from envvault.vault.store import Vault
    from envvault.vault.transaction import snapshot_transaction

    path = tmp_path / "lib.so"
    data = random.Random(5).randbytes(2 << 20)
    path.write_bytes(data)
    oid = object_id(data)
    vault = Vault.open(tmp_path / "v", create=True)
    path.write_bytes(data[:1000] + b"X" + data[1001:])  # changed after naming
    with pytest.raises(EnvironmentProblem, match="changed while it was being read"):
        with snapshot_transaction(vault) as txn:
            txn.writer.add(oid, FileSlice(path, 0, len(data)))
            txn.flush()
    assert not any((tmp_path / "v" / "packs").rglob("*.pack"))
    assert not vault.has(oid)
    path.write_bytes(data[: 1 << 20])  # shorter than the slice
    with pytest.raises(EnvironmentProblem, match="changed while"):
        FileSlice(path, 0, len(data)).load(oid)


def test_a_small_piece_is_loaded_without_the_compressors_buffer(tmp_path):
    """A reader takes a named file's small chunk as bytes (``FileSlice.load``): the bytes of that chunk only,
    no 4 MiB buffer kept on its thread (that one is a compressor's, ``view``), which is 8 MiB of a snap's
    memory on 2 readers."""
    import threading

    from envvault.model.encoding import object_id
    from envvault.vault import packs

    data = random.Random(11).randbytes(3 << 20)
    path = tmp_path / "lib.so"
    path.write_bytes(data)
    piece = data[(1 << 20) + 7:(1 << 20) + 7 + (300 << 10)]
    got = {}

    def reader():
        got["bytes"] = packs.FileSlice(path, (1 << 20) + 7, len(piece)).load(object_id(piece))
        got["buffer"] = getattr(packs._slice_buf, "buf", None)

    t = threading.Thread(target=reader)
    t.start()
    t.join()
    assert got["bytes"] == piece and type(got["bytes"]) is bytes
    assert got["buffer"] is None
    view = packs.FileSlice(path, 0, len(data)).view(object_id(data))  # a compressor's read: into its buffer
    assert bytes(view) == data and len(packs._slice_buf.buf) >= len(data)


def test_readers_hold_no_bytes_of_large_chunks(tmp_path, monkeypatch):
    """Three 12 MiB files on four readers with a 2 MiB read-ahead: their big chunks pass as FileSlices, so
    the bytes held stay within the limit (only small tail chunks count), and the packs match one reader's."""
    from envvault.vault import ingest

    paths = _small_read_ahead(monkeypatch, tmp_path, [12 << 20] * 3, seed=8)
    peak = 0
    real = ingest._Budget

    class Watched(real):
        def acquire(self, job, n):
            nonlocal peak
            super().acquire(job, n)
            peak = max(peak, self.used)

        def try_acquire(self, job, n):
            nonlocal peak
            took = super().try_acquire(job, n)
            peak = max(peak, self.used)
            return took

    monkeypatch.setattr(ingest, "_Budget", Watched)
    four = _ingest_tree(tmp_path / "v4", paths, threads=4)
    one = _ingest_tree(tmp_path / "v1", paths, threads=1)
    assert four == one
    assert _vault_bytes(tmp_path / "v4") == _vault_bytes(tmp_path / "v1")
    assert peak < (1 << 20)  # no 12 MiB file's big chunks were held


def test_large_files_named_ahead_give_the_same_vault(tmp_path, monkeypatch):
    """Namer threads cut and name the files of 8 MiB or more ahead of their turn (``_NameAhead``): the
    digests, chunk ids and packs are those of one reader reading everything in order, and every large
    file was named ahead (none read at its turn)."""
    from envvault.vault import ingest

    rng = random.Random(21)
    root = tmp_path / "t"
    root.mkdir()
    paths = []
    for i, size in enumerate([9 << 20, 300, 20 << 20, 70_000, 8 << 20, 5, 12 << 20]):
        p = root / f"{i}.bin"
        p.write_bytes(rng.randbytes(size))
        paths.append(p)
    (root / "same.bin").write_bytes(paths[2].read_bytes())  # a large duplicate: named, stored once
    paths.append(root / "same.bin")
    monkeypatch.setenv("ENVVAULT_NAMERS", "3")
    named = []
    real = ingest._name_file
    monkeypatch.setattr(ingest, "_name_file", lambda path, size: (named.append(path), real(path, size))[1])

    def ingest_tree(vault_dir, threads):
        from envvault.vault.store import Vault
        from envvault.vault.transaction import snapshot_transaction

        vault = Vault.open(vault_dir, create=True)
        with snapshot_transaction(vault) as txn:
            ing = ingest.Ingester(txn.writer, vault.has, threads=threads)
            got = list(ing.map_ordered(lambda p, read: read(p, p.stat().st_size), paths,
                                       weight=lambda p: p.stat().st_size, path=lambda p: p))
            txn.flush()
        return got

    four = ingest_tree(tmp_path / "v4", 4)
    assert sorted(named) == sorted(p for p in paths if p.stat().st_size >= 8 << 20)
    one = ingest_tree(tmp_path / "v1", 1)
    assert four == one
    assert _vault_bytes(tmp_path / "v4") == _vault_bytes(tmp_path / "v1")


def test_a_large_file_that_cannot_be_named_fails_at_its_turn(tmp_path, monkeypatch):
    """A namer's error (the file is gone) is raised at that file's turn, after the results before it, and
    every thread is stopped."""
    from envvault.errors import EnvironmentProblem
    from envvault.vault import ingest

    monkeypatch.setenv("ENVVAULT_NAMERS", "2")
    root = tmp_path / "t"
    root.mkdir()
    small, big = root / "a.txt", root / "big.bin"
    small.write_bytes(b"x" * 100)
    before = threading.active_count()
    ing = ingest.Ingester(None, lambda oid: True, threads=3)
    got = []
    gen = ing.map_ordered(lambda p, read: read(p, 9 << 20 if p == big else 100), [small, big],
                          weight=lambda p: 9 << 20 if p == big else 100, path=lambda p: p)
    with pytest.raises(EnvironmentProblem, match="big.bin"):
        for d in gen:
            got.append(d)
    assert len(got) == 1 and got[0].size == 100
    assert threading.active_count() <= before


def test_thread_counts_from_the_environment(monkeypatch):
    """ENVVAULT_READERS / NAMERS / COMPRESSORS: a count in range is taken (capped), anything else falls back
    to the host's default; NAMERS=0 turns naming ahead off."""
    from envvault.vault import threads

    monkeypatch.delenv("ENVVAULT_NAMERS", raising=False)
    default = threads.default_namers()
    for value, want in (("0", 0), ("5", 5), ("1000", 64), ("-1", default), ("many", default), ("", default)):
        monkeypatch.setenv("ENVVAULT_NAMERS", value)
        assert threads.default_namers() == want, value
    monkeypatch.setenv("ENVVAULT_READERS", "0")  # a reader count starts at 1
    monkeypatch.delenv("ENVVAULT_COMPRESSORS", raising=False)
    assert threads.default_readers() == (2 if _affinity() >= 8 else 1)
    monkeypatch.setenv("ENVVAULT_COMPRESSORS", "3")
    assert threads.default_compressors() == 3
    monkeypatch.setenv("ENVVAULT_WRITERS", "0")  # a writer count starts at 1
    assert threads.default_writers() == 1
    monkeypatch.setenv("ENVVAULT_WRITERS", "2")
    assert threads.default_writers() == 2
    monkeypatch.setenv("ENVVAULT_RESTORERS", "0")  # a restore writes on one thread at least
    assert threads.default_restorers() == max(1, min(8, _affinity()))
    monkeypatch.setenv("ENVVAULT_RESTORERS", "16")
    assert threads.default_restorers() == 16


def test_group_processes_by_cores(monkeypatch):
    """A first snap's group builders: none forked on one core, 2 on 2 to 7 cores, half the cores (at most 8)
    from 8 on; ``ENVVAULT_GROUP_PROCESSES`` overrides it (1 up to 64)."""
    from envvault.vault import threads

    monkeypatch.delenv("ENVVAULT_GROUP_PROCESSES", raising=False)
    for cores, want in ((1, 1), (2, 2), (7, 2), (8, 4), (16, 8), (64, 8)):
        monkeypatch.setattr(threads, "usable_cores", lambda cores=cores: cores)
        assert threads.default_group_processes() == want, cores
    for value, want in (("1", 1), ("3", 3), ("100", 64), ("0", 8), ("many", 8)):
        monkeypatch.setenv("ENVVAULT_GROUP_PROCESSES", value)
        assert threads.default_group_processes() == want, value


def test_the_materializer_writes_on_the_restorers_count():
    """Every restore path takes its thread count from the one rule: ``materialize.WORKERS`` (the default of
    ``stage``, which the environment restore, ``--into``, the compile cache restore and export use) is
    ``ENVVAULT_RESTORERS`` when it is set, read once as envvault is imported."""
    import subprocess

    code = ("import inspect; from envvault import materialize; "
            "print(materialize.WORKERS, inspect.signature(materialize.stage).parameters['workers'].default)")
    default = str(max(1, min(8, _affinity())))  # "0" is no count: the default
    for given, want in (("3", "3"), ("0", default)):
        env = {**os.environ, "ENVVAULT_RESTORERS": given}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.split() == [want, want], out.stdout


def test_a_count_a_user_sets_that_is_no_count_is_ignored_everywhere():
    """Every ``ENVVAULT_*`` count goes through one rule (``threads.env_count``): a value that is no whole
    number, or below the least, gives the default; one above the most is capped. The S3 vault's counts, read
    as ``vault/s3.py`` is imported, follow it too: ``ENVVAULT_S3_RETRIES=0`` once made every S3 call fail
    with an internal error (no attempt at all), and a word failed the import."""
    import subprocess

    from envvault.vault.threads import env_count

    for value, want in (("", 6), ("x", 6), ("1.5", 6), ("0", 6), ("-2", 6), ("1", 1), ("40", 40), ("1000", 100)):
        os.environ["ENVVAULT_TEST_COUNT"] = value
        try:
            assert env_count("ENVVAULT_TEST_COUNT", 1, 100, 6) == want, value
        finally:
            del os.environ["ENVVAULT_TEST_COUNT"]
    code = "from envvault.vault import s3; print(s3.RETRIES, s3.FETCHERS)"
    for retries, fetchers, want in (("0", "none", "6 8"), ("many", "-1", "6 8"), ("2", "3", "2 3"), ("500", "500", "100 64")):
        env = {**os.environ, "ENVVAULT_S3_RETRIES": retries, "ENVVAULT_S3_FETCHERS": fetchers}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.split() == want.split(), (retries, fetchers, out.stdout)


def _affinity() -> int:
    """The cores this test process may run on, asked of the OS here (not through envvault's rule)."""
    return len(os.sched_getaffinity(0))


def test_thread_counts_follow_the_cpu_affinity_not_the_hosts_cores():
    """A job pinned to one core (``taskset``, a container's ``--cpuset-cpus``, a scheduler) gets the thread
    and child counts of one core, whatever the host has: one reader, no namers, two compressors, one
    restorer (the materializer's default too), no forked children, no hashing thread beside the chunking.
    ``os.cpu_count`` would count the host's cores (2 here, up to 128 on a GPU host)."""
    import subprocess

    code = ("import os, sys; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "[os.environ.pop(v, None) for v in ('ENVVAULT_READERS', 'ENVVAULT_NAMERS', 'ENVVAULT_COMPRESSORS', "
            "'ENVVAULT_RESTORERS')]; "
            "from envvault.vault import threads, ingest; from envvault import materialize; "
            "from envvault.vault.forked import workers_for; "
            "print(threads.usable_cores(), threads.default_readers(), threads.default_namers(), "
            "threads.default_compressors(), threads.default_restorers(), materialize.WORKERS, "
            "workers_for(10 ** 6), ingest._HASH_ASIDE_OK)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1", "0", "2", "1", "1", "1", "False"], out.stdout


def test_the_malloc_threshold_is_given_back_when_the_ingest_ends(tmp_path, monkeypatch):
    """A storing ingest with namers pins glibc's mmap threshold at 256 KiB (its RSS) and gives it back when it
    ends, also when it fails: a restore's stage after its backup snap decompresses every frame in the
    same process, 14x slower per 1 MiB frame with the threshold left pinned (bench/malloc_threshold.py)."""
    from envvault.vault import ingest
    from envvault.vault.store import Vault

    calls = []
    monkeypatch.setattr(ingest, "_mallopt", lambda *settings: (calls.append(settings), True)[1])
    monkeypatch.setattr(ingest, "_MALLOC", None)
    monkeypatch.setenv("ENVVAULT_NAMERS", "2")
    p = tmp_path / "big.bin"
    p.write_bytes(random.Random(3).randbytes(9 << 20))
    vault = Vault.open(tmp_path / "v", create=True)
    pinned, relaxed = ((ingest._M_MMAP_THRESHOLD, 256 << 10),), \
        ((ingest._M_MMAP_THRESHOLD, 8 << 20), (ingest._M_TRIM_THRESHOLD, 16 << 20))
    for fails in (False, True):
        calls.clear()

        def fn(path, read):
            if fails:
                raise RuntimeError("boom")
            return read(path, path.stat().st_size)

        _ingest_once(vault, fn, [p], fails, weight=lambda q: q.stat().st_size, path=lambda q: q)
        assert calls == [pinned, relaxed], (fails, calls)
        assert ingest._MALLOC is None


def test_no_garbage_collection_while_the_pipeline_runs(tmp_path):
    """The cyclic collector is off while a threaded ingest runs (a collection holds the GIL and stops every
    stage) and back as it was when the ingest ends, also when it fails; a caller that had it off keeps it off."""
    import gc

    from envvault.vault.store import Vault

    p = tmp_path / "a.bin"
    p.write_bytes(b"x" * 5000)
    vault = Vault.open(tmp_path / "v", create=True)
    seen = []

    def fn(path, read):
        seen.append(gc.isenabled())
        if fails:
            raise RuntimeError("boom")
        return read(path, path.stat().st_size)

    was = gc.isenabled()
    try:
        for before, fails in ((True, False), (True, True), (False, False)):
            (gc.enable if before else gc.disable)()
            seen.clear()
            _ingest_once(vault, fn, [p, p], fails)
            assert seen and not any(seen), (before, fails)
            assert gc.isenabled() is before, (before, fails)
    finally:
        (gc.enable if was else gc.disable)()


def _ingest_once(vault, fn, paths, fails: bool, **how) -> None:
    """One threaded ingest of ``paths`` through ``fn`` in a snapshot transaction of ``vault``; with ``fails``,
    ``fn``'s RuntimeError is expected from it."""
    from envvault.vault.ingest import Ingester
    from envvault.vault.transaction import snapshot_transaction

    with snapshot_transaction(vault) as txn:
        items = Ingester(txn.writer, vault.has, threads=2).map_ordered(fn, paths, **how)
        if fails:
            with pytest.raises(RuntimeError):
                list(items)
        else:
            list(items)
        txn.flush()
