"""The storage seam (envvault/vault/backend.py): every backend keeps one contract, and the vault (snapshots,
tags, objects, gc, verify, the snapshot transaction) works over any backend. Each vault test runs over the
LocalBackend (today's directory, docs/format.md) and over the in-memory backend; the in-memory run also
checks that nothing was written to disk but machine-local state, so the backend is the vault's only path to
its shared files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import blake3
import pytest

from envvault.errors import CorruptError, NotFoundError
from envvault.model.encoding import canonical_json
from envvault.vault.backend import KINDS, Backend, Missing
from envvault.vault.gc import collect_garbage
from tests.evtools import follows_backend
from envvault.vault.local import LocalBackend
from envvault.vault.memory import MemoryBackend
from envvault.vault.state import LocalState
from envvault.vault.store import Vault
from envvault.vault.transaction import snapshot_transaction
from envvault.vault.verify import verify_vault


def _id(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


# -- the contract, for each backend ------------------------------------------------------------------------

@pytest.fixture(params=["local", "memory"])
def backend(request, tmp_path) -> Backend:
    if request.param == "memory":
        return MemoryBackend()
    root = tmp_path / "vault"
    b = LocalBackend(root)
    b.create()
    return b


def test_backend_contract(backend, tmp_path):
    assert follows_backend(backend)
    assert backend.location and "memory" in backend.location or str(tmp_path) in backend.location
    for kind in KINDS:
        assert backend.list(kind) == []
    assert backend.save("snapshots", "a" * 64, b"hello world") is True
    assert backend.load("snapshots", "a" * 64) == b"hello world"
    assert backend.load("snapshots", "a" * 64, 6, 5) == b"world"
    assert backend.load("snapshots", "a" * 64, 6, 100) == b"world"  # fewer at its end
    assert backend.load("snapshots", "a" * 64, 6) == b"world"
    assert backend.stat("snapshots", "a" * 64).size == 11
    with pytest.raises(CorruptError):
        backend.load("snapshots", "a" * 64, limit=10)
    # exclusive: created only when absent, the first writer wins
    assert backend.save("config", "config", b"first", exclusive=True) is True
    assert backend.save("config", "config", b"second", exclusive=True) is False
    assert backend.load("config", "config") == b"first"
    # plain save replaces
    backend.save("tags", "t1", b"x\n")
    backend.save("tags", "t1", b"y\n")
    assert backend.load("tags", "t1") == b"y\n"
    # save_file consumes the local file
    local = tmp_path / "vault" / "tmp" / "pack.tmp" if isinstance(backend, LocalBackend) else tmp_path / "pack.tmp"
    local.write_bytes(b"EVPK")
    backend.save_file("packs", "b" * 64, local)
    assert not local.exists()
    assert backend.load("packs", "b" * 64) == b"EVPK"
    assert sorted(backend.list("packs")) == ["b" * 64]
    assert sorted(backend.list("snapshots")) == ["a" * 64]
    assert sorted(backend.list("config")) == ["config"]
    assert sorted(backend.list("tags")) == ["t1"]
    for kind, name in (("snapshots", "c" * 64), ("tags", "nope"), ("packs", "d" * 64)):
        with pytest.raises(Missing):
            backend.load(kind, name)
        with pytest.raises(NotFoundError):
            backend.stat(kind, name)
    assert backend.remove("tags", "t1") is True
    assert backend.remove("tags", "t1") is False
    assert backend.list("tags") == []
    assert backend.where("snapshots", "a" * 64).startswith(backend.location)
    # locks: shared beside shared; exclusive refused without waiting while held
    with backend.lock("vault", exclusive=False) as a:
        assert a is True
        with backend.lock("vault", exclusive=False) as b:
            assert b is True
        with backend.lock("vault", exclusive=True, wait=False) as c:
            assert c is False
    with backend.lock("vault", exclusive=True, wait=False) as d:
        assert d is True


def test_local_backend_is_the_format_layout(tmp_path):
    root = tmp_path / "vault"
    b = LocalBackend(root)
    b.create()
    b.save("snapshots", "a" * 64, b"{}")
    b.save("index", "b" * 64, b"{}")
    b.save("tags", "good", b"x\n")
    b.save("config", "settings", b"{}")
    assert (root / "snapshots" / f"{'a' * 64}.json").read_bytes() == b"{}"
    assert (root / "index" / f"{'b' * 64}.idx").read_bytes() == b"{}"
    assert (root / "tags" / "good").read_bytes() == b"x\n"
    assert (root / "settings.json").read_bytes() == b"{}"
    assert b.where("packs", "cd" + "0" * 62) == str(root / "packs" / "cd" / f"cd{'0' * 62}.pack")
    assert b.where("locks", "vault") == str(root / "locks" / "vault.lock")
    # temp files and stray names are not objects
    (root / "snapshots" / "x.tmp").write_bytes(b"")
    (root / "index" / "notes.txt").write_bytes(b"")
    assert b.list("snapshots") == ["a" * 64] and b.list("index") == ["b" * 64]
    with pytest.raises(ValueError):
        b.path("tags", "../escape")
    # a symlink is never read through
    os.symlink(root / "tags" / "good", root / "tags" / "link")
    with pytest.raises(CorruptError):
        b.load("tags", "link")


# -- a vault over each backend -------------------------------------------------------------------------------

@pytest.fixture(params=["local", "memory"])
def vault(request, tmp_path) -> Vault:
    if request.param == "local":
        yield Vault.open(tmp_path / "vault", create=True)
        return
    machine = tmp_path / "machine"
    for sub in ("state", "tmp", "locks"):
        (machine / sub).mkdir(parents=True)
    v = Vault.from_backend(MemoryBackend(), LocalState(machine / "state", machine / "tmp", machine / "locks"),
                           create=True)
    yield v
    # Only machine-local state was written to disk: every shared file went through the backend.
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert [p for p in left if not p.startswith("machine/state/")] == []


def _snapshot(vault: Vault, files: dict[str, bytes], *, venv: str = "/venv", created: str = "2026-11-30T10:00:00.000000Z"):
    """One snapshot of one package whose files are ``files``, written through the transaction."""
    with snapshot_transaction(vault) as txn:
        entries = []
        for path, data in sorted(files.items()):
            oid = _id(data)
            if not vault.has(oid):
                txn.writer.add(oid, data)
            entries.append({"path": path, "record": path, "state": "ok", "size": len(data), "chunks": [oid],
                            "sha256": "x", "mode": 0o644})
        manifest = canonical_json({"format": 1, "kind": "dist", "name": "pkg", "version": "1", "files": entries,
                                   "build_id": "1" * 64, "state_id": "1" * 64})
        mid = _id(manifest)
        if not vault.has(mid):
            txn.writer.add(mid, manifest, "m")
        txn.flush()
        doc = {
            "argv": ["envvault", "snap"], "caches": [], "created": created, "env": {}, "fingerprint": "0" * 64,
            "format": 1, "host": {"arch": "x86_64", "hostname": "h", "os": "Linux"}, "kind": "snapshot",
            "lock_only": False, "message": "", "python": {"abi": "cp311", "implementation": "cpython",
                                                           "platform": "linux-x86_64", "version": "3.11.7"},
            "packages": [{"name": "pkg", "version": "1", "build_id": "1" * 64, "state_id": "1" * 64,
                          "manifest": mid, "files": len(files), "size": 0, "missing": [], "modified": []}],
            "stats": {"bytes": 0, "files": len(files), "new_bytes": txn.written_bytes,
                      "new_objects": txn.written_objects, "seconds": 0.0},
            "tool": {"envvault": "0.1.0"}, "trigger": "manual", "venv": venv, "warnings": [],
        }
        return txn.commit(doc), mid


def test_snapshots_and_tags_through_the_backend(vault):
    sid, mid = _snapshot(vault, {"a.py": b"alpha" * 100, "b.py": b"beta"})
    assert vault.snapshot_ids() == [sid]
    assert vault.has_snapshot(sid) and not vault.has_snapshot("f" * 64)
    ref = vault.load_snapshot(sid)
    assert ref.id == sid and ref.snapshot.venv == "/venv"
    assert vault.get(_id(b"beta")) == b"beta"
    assert vault.resolve(sid[:8]) == sid and vault.resolve("latest") == sid
    vault.set_tag("good", sid)
    assert vault.tags() == {"good": sid} and vault.resolve("good") == sid
    vault.remove_tag("good")
    assert vault.tags() == {}
    with pytest.raises(NotFoundError, match=f"in {vault.location}"):
        vault.resolve("nosuchtag")
    vault.save_settings({"caches": {"dirs": ["/x"]}})
    assert vault.settings() == {"caches": {"dirs": ["/x"]}}
    # a fresh Vault over the same backend sees the same objects (index files listed from the backend)
    again = Vault(vault.backend, vault.config, vault.state)
    assert again.get(_id(b"alpha" * 100)) == b"alpha" * 100
    assert verify_vault(again)["ok"]


def test_transaction_aborts_and_commits_nothing(vault):
    with pytest.raises(RuntimeError, match="boom"):
        with snapshot_transaction(vault) as txn:
            txn.writer.add(_id(b"lost"), b"lost")
            raise RuntimeError("boom")
    assert vault.snapshot_ids() == []
    assert not vault.has(_id(b"lost"))
    assert list(vault.state.tmp_dir.iterdir()) == []  # the unfinished pack's temp file is gone


def test_verify_names_damage_and_gc_collects_through_the_backend(vault):
    old, _ = _snapshot(vault, {"a.py": b"old" * 1000, "shared.py": b"shared"}, created="2026-11-30T09:00:00.000000Z")
    new, _ = _snapshot(vault, {"b.py": b"new" * 1000, "shared.py": b"shared"})
    assert verify_vault(vault)["ok"]
    packs_before = set(vault.backend.list("packs"))
    result = collect_garbage(vault, keep_last=1)
    assert result.removed_snapshots == (old,) and result.kept_snapshots == (new,)
    assert vault.snapshot_ids() == [new]
    assert result.removed_packs + result.rewritten_packs >= 1
    assert set(vault.backend.list("packs")) != packs_before
    fresh = Vault(vault.backend, vault.config, vault.state)
    assert fresh.get(_id(b"shared")) == b"shared" and fresh.get(_id(b"new" * 1000)) == b"new" * 1000
    assert not fresh.has(_id(b"old" * 1000))
    assert verify_vault(fresh)["ok"]
    # an orphan pack (no index file) is garbage; a damaged pack is named by verify
    vault.backend.save("packs", "e" * 64, b"EVPK\x01\x00\x00\x00")
    assert collect_garbage(vault).removed_packs == 1 and "e" * 64 not in vault.backend.list("packs")
    (pack,) = [p for p in vault.backend.list("packs") if fresh.index()[_id(b"new" * 1000)][0] == p]
    vault.backend.save("packs", pack, vault.backend.load("packs", pack)[:-8])
    report = verify_vault(Vault(vault.backend, vault.config, vault.state), read_data=True)
    assert not report["ok"] and report["problems"][0]["snapshots"] == [new]


def test_config_is_written_once_and_checked(tmp_path):
    backend = MemoryBackend()
    state = LocalState(tmp_path / "s", tmp_path / "t", tmp_path / "l")
    with pytest.raises(NotFoundError, match="no vault at memory:"):
        Vault.from_backend(backend, state)
    first = Vault.from_backend(backend, state, create=True)
    second = Vault.from_backend(backend, state, create=True)
    assert first.config["vault_id"] == second.config["vault_id"]
    assert json.loads(backend.load("config", "config"))["format"] == 1
    backend.objects[("config", "config")] = b"not json"
    with pytest.raises(CorruptError, match="is not an envvault config"):
        Vault.from_backend(backend, state)


def test_local_vault_bytes_match_the_format(tmp_path):
    """A snapshot through the seam lands where docs/format.md says, with the bytes it says."""
    v = Vault.open(tmp_path / "vault", create=True)
    sid, mid = _snapshot(v, {"a.py": b"alpha"})
    root = Path(tmp_path / "vault")
    data = (root / "snapshots" / f"{sid}.json").read_bytes()
    assert _id(data) == sid and json.loads(data)["packages"][0]["manifest"] == mid
    (idx,) = list((root / "index").iterdir())
    doc = json.loads(idx.read_bytes())
    assert idx.name == f"{doc['pack']}.idx"
    pack = root / "packs" / doc["pack"][:2] / f"{doc['pack']}.pack"
    assert pack.read_bytes()[:8] == b"EVPK\x01\x00\x00\x00" and _id(pack.read_bytes()) == doc["pack"]
    assert sorted(os.listdir(root / "tmp")) == []
