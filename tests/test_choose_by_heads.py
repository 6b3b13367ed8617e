"""Choosing a snapshot without reading them all (issue 11): ``status`` and ``latest`` choose by the snapshots'
heads (``state/snapshot-heads.json``, docs/format.md "Snapshot heads"; a snapshot never changes under its id),
read only the snapshots without a head, and check the one they pick against its document, so forged heads (a
copied vault brings its ``state/``; a bucket's heads are anyone's) change nothing."""

from __future__ import annotations

import json

import pytest

from envvault.vault.heads import snapshot_heads
from envvault.vault.store import Vault
from fixtures.venvs import make_venv
from tests.evtools import ev, ev_json


@pytest.fixture(scope="module")
def two_envs(tmp_path_factory):
    root = tmp_path_factory.mktemp("summaries")
    a, b = make_venv(root / "a"), make_venv(root / "b")
    vault = root / "vault"
    ids = {}
    for name, venv in (("a1", a), ("b1", b), ("a2", a), ("b2", b)):
        ids[name] = ev_json(vault, "snap", "--venv", venv, "--no-caches", "--lock-only", "-m", name)["id"]
    return root, vault, a, b, ids


def _count_loads(monkeypatch) -> list[str]:
    loads: list[str] = []
    real = Vault.load_snapshot
    monkeypatch.setattr(Vault, "load_snapshot", lambda self, sid: (loads.append(sid), real(self, sid))[1])
    return loads


def test_latest_reads_only_the_snapshot_it_picks(two_envs, monkeypatch):
    root, vault_dir, a, b, ids = two_envs
    vault = Vault.open(vault_dir)
    snapshot_heads(vault)  # the heads are saved
    loads = _count_loads(monkeypatch)
    assert vault.resolve("latest", venv=str(a)) == ids["a2"]
    assert vault.resolve("latest") == ids["b2"]
    assert loads == [ids["a2"], ids["b2"]]  # one check each, no other snapshot read
    rows = json.loads((vault_dir / "state" / "snapshot-heads.json").read_text())["heads"]
    assert set(rows) == set(ids.values())


def test_a_forged_summary_is_caught_and_the_choice_made_from_the_snapshots(two_envs):
    root, vault_dir, a, b, ids = two_envs
    vault = Vault.open(vault_dir)
    snapshot_heads(vault)
    path = vault_dir / "state" / "snapshot-heads.json"
    doc = json.loads(path.read_text())
    doc["heads"][ids["b2"]]["created"] = "2999-01-01T00:00:00Z"  # b's newest claims to be the newest of all ...
    doc["heads"][ids["b2"]]["venv"] = str(a)  # ... and of env a
    path.write_text(json.dumps(doc))
    assert Vault.open(vault_dir).resolve("latest", venv=str(a)) == ids["a2"]
    out = ev(vault_dir, "status", "--venv", a, "--json")
    assert json.loads(out.stdout)["snapshot"] == ids["a2"]
    fixed = json.loads(path.read_text())["heads"]  # the heads were rebuilt from the documents
    assert fixed[ids["b2"]]["venv"] == str(b)


def test_damaged_cache_and_deleted_snapshots(two_envs):
    root, vault_dir, a, b, ids = two_envs
    path = vault_dir / "state" / "snapshot-heads.json"
    path.write_bytes(b"[" * 100_000)  # not a file this code writes (too deep for json.loads)
    assert Vault.open(vault_dir).resolve("latest", venv=str(b)) == ids["b2"]
    doc = json.loads(path.read_text())
    doc["heads"]["f" * 64] = dict(doc["heads"][ids["a1"]], created="2999-01-01T00:00:00Z")  # a snapshot that
    path.write_text(json.dumps(doc))  # is gone: never chosen, dropped
    assert Vault.open(vault_dir).resolve("latest", venv=str(a)) == ids["a2"]
    assert "f" * 64 not in json.loads(path.read_text())["heads"]


def test_heads_saved_before_these_fields_are_rebuilt(two_envs):
    """Heads an earlier envvault saved (no ``kind``, ``interpreter``, ``system``) do not match their
    documents' heads: the first choice rebuilds them, and the next one reads only the snapshot it picks."""
    root, vault_dir, a, b, ids = two_envs
    vault = Vault.open(vault_dir)
    snapshot_heads(vault)
    path = vault_dir / "state" / "snapshot-heads.json"
    doc = json.loads(path.read_text())
    for h in doc["heads"].values():
        for key in ("kind", "interpreter", "system"):
            h.pop(key, None)
    path.write_text(json.dumps(doc))
    assert Vault.open(vault_dir).resolve("latest", venv=str(b)) == ids["b2"]
    assert all("kind" in h for h in json.loads(path.read_text())["heads"].values())


def test_cache_restore_latest_skips_a_newer_snapshot_whose_caches_were_not_read(tmp_path):
    """`cache restore` (latest) chooses by the heads, then checks that the chosen snapshot holds a cache
    with files: a newer cache snapshot whose only cache could not be read (no manifest) gives way to the
    older one that holds files."""
    from envvault.caches.snap import take_cache_snapshot
    from envvault.commands.plain import resolve_caches as _resolve
    from envvault.model.snapshot import build_snapshot

    cache = tmp_path / "inductor"
    cache.mkdir()
    (cache / "entry").write_bytes(b"compiled" * 10)
    vault = Vault.open(tmp_path / "v", create=True)
    older = take_cache_snapshot(vault, extra_dirs=[cache], discover=False, argv=["t"]).id
    doc = vault.load_snapshot(older).snapshot.to_dict()
    unread = [{**c, "manifest": None, "reason": "unreadable"} for c in doc["caches"]]
    newer = vault.commit_snapshot(build_snapshot(
        kind="cache-snapshot", created="2999-01-01T00:00:00Z", message="unread", trigger="cache-snap", argv=["t"],
        venv=None, lock_only=False, python=doc["python"], host=doc["host"], env={}, packages=[], caches=unread,
        fingerprint=None, warnings=[], stats={"files": 0, "bytes": 0, "new_bytes": 0, "new_objects": 0,
                                              "seconds": 0}, tool=doc["tool"]))
    assert newer != older
    snapshot_heads(vault)  # saved: the newer head says it has a cache
    assert _resolve(Vault.open(tmp_path / "v"), "latest") == older
