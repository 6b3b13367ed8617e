"""The snap's reading pipeline (issue 11): files read on several threads, objects stored in file order.

Same vault bytes whatever the thread count, bounded bytes in flight, an error raised at its file's turn
and the reader threads stopped.
"""

from __future__ import annotations

import hashlib
import os
import random
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


def test_bytes_in_flight_are_bounded(tmp_path, monkeypatch):
    """Readers far ahead of a slow storing thread wait: bytes read and not yet stored stay near the limit."""
    from envvault.vault import ingest

    monkeypatch.setattr(ingest, "READ_AHEAD", 2 << 20)
    monkeypatch.setattr(ingest, "HEAD_AHEAD", 1 << 20)
    rng = random.Random(3)
    root = tmp_path / "t"
    root.mkdir()
    paths = []
    for i in range(60):
        p = root / f"{i:02d}"
        p.write_bytes(rng.randbytes(200_000))
        paths.append(p)
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
