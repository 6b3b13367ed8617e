"""Listing from snapshot heads (docs/format.md, "Snapshot heads"): the same rows as the documents give, a second
listing on a node parses no document, and a new node lists a bucket of many snapshots from the heads objects
in a few requests without reading one document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envvault.model.encoding import canonical_json, object_id
from envvault.model.heads import head_of
from envvault.vault.heads import STATE_NAME, snapshot_heads
from envvault.vault.store import Vault
from fixtures import catalogue as C
from fixtures import uv_install
from s3server import FaultProxy
from test_backend import _snapshot, vault  # noqa: F401 - the fixture (local and memory backends)
from test_s3_vault import jrun, node


def test_heads_are_the_documents_and_saved(vault: Vault, monkeypatch):  # noqa: F811
    ids = [_snapshot(vault, {f"{i}.py": b"x" * i}, created=f"2026-11-30T10:00:0{i}.000000Z")[0] for i in range(3)]
    listed = snapshot_heads(vault)
    assert [sid for sid, _ in listed] == ids[::-1]  # newest first
    for sid, head in listed:
        assert head == head_of(vault.load_snapshot(sid).snapshot)
    assert set(json.loads(vault.state.read(STATE_NAME))["heads"]) == set(ids)

    def no_documents(sid):
        raise AssertionError(f"read snapshot {sid}")

    monkeypatch.setattr(vault, "load_snapshot", no_documents)
    assert snapshot_heads(vault) == listed
    vault.backend.remove("snapshots", ids[0])  # gone from the vault: gone from the list and the saved heads
    assert [sid for sid, _ in snapshot_heads(vault)] == ids[:0:-1]
    assert set(json.loads(vault.state.read(STATE_NAME))["heads"]) == set(ids[1:])
    monkeypatch.undo()
    vault.state.write(STATE_NAME, b"{not json")  # a damaged file is rebuilt
    assert snapshot_heads(vault) == listed[:2]


def _bucket_with_one_snap(s3_server, tmp_path: Path, make_venv, wheelhouse, message: str) -> tuple[str, str, str]:
    """``(bucket, url, snapshot id)``: a fresh bucket vault into which node "a" snapped a lock-only venv."""
    bucket = s3_server.bucket()
    url = f"s3://{bucket}/v"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_CU128])
    sid = jrun(node(s3_server, tmp_path, "a", url), "snap", "--lock-only", "--no-caches", "--venv", venv, "-m",
               message)["id"]
    return bucket, url, sid


def test_a_new_node_lists_a_bucket_from_heads(s3_server, tmp_path: Path, make_venv, wheelhouse):  # noqa: F811
    bucket, url, sid = _bucket_with_one_snap(s3_server, tmp_path, make_venv, wheelhouse, "run -1")
    from envvault.vault.s3 import S3Backend

    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3_server.env().items():
            mp.setenv(k, v)
        backend = S3Backend(url)
        doc = json.loads(backend.load("snapshots", sid))
        for i in range(40):
            data = canonical_json(dict(doc, message=f"run {i}", created=f"2030-01-01T00:00:{i:02d}.000000Z"))
            backend.save("snapshots", object_id(data), data)
    first = jrun(node(s3_server, tmp_path, "c", url), "list", "--all")["snapshots"]
    assert len(first) == 41 and first[0]["message"] == "run 39"
    assert [k for k in s3_server.keys(bucket, "v/heads/") if k.endswith(".json")], "the first node shared its heads"
    proxy = FaultProxy(s3_server.port, rate=0.0)
    try:
        d = node(s3_server, tmp_path, "d", url, endpoint=proxy.url)
        assert jrun(d, "list", "--all")["snapshots"] == first
        assert proxy.counts["requests"] <= 10, proxy.counts
    finally:
        proxy.close()
    cached = tmp_path / "cache-d"
    assert not [p for p in cached.rglob("*") if p.is_file() and "snapshots" in p.parts], "no document was read"


def test_snaps_share_their_heads_so_a_new_node_lists_in_a_few_requests(s3_server, tmp_path: Path, make_venv,
                                                                         wheelhouse, monkeypatch):
    """Snapshots committed by snaps (here 40, four writers at a time, one of them then removed as gc would):
    a new node lists them all from the heads objects in at most 10 requests, reading no document, though no
    lister ever computed a head; the heads objects stay few and drop the removed snapshot."""
    from concurrent.futures import ThreadPoolExecutor

    from envvault.model.snapshot import parse_snapshot

    bucket, url, sid = _bucket_with_one_snap(s3_server, tmp_path, make_venv, wheelhouse, "run -1")
    assert len([k for k in s3_server.keys(bucket, "v/heads/") if k.endswith(".json")]) == 1, "the snap shared"
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("ENVVAULT_CACHE_DIR", str(tmp_path / "cache-w"))
    doc = json.loads(Vault.open(url).backend.load("snapshots", sid))

    def commit(i: int) -> str:
        writer = Vault.open(url)  # one writer process each
        snap = parse_snapshot(dict(doc, message=f"run {i}", created=f"2030-01-01T00:00:{i:02d}.000000Z"))
        return writer.commit_snapshot(snap)

    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(commit, range(40)))
    gone = made[0]
    assert Vault.open(url).delete_snapshot(gone)
    commit(40)
    objects = [k for k in s3_server.keys(bucket, "v/heads/") if k.endswith(".json")]
    assert len(objects) == 1, objects  # the last snap, alone, merged every object it read
    kept = [q for q in (tmp_path / "cache-w").rglob("*") if q.is_file() and "heads" in q.parts]
    assert 1 <= len(kept) <= 4, kept  # the writers' node cache drops the heads objects they deleted
    proxy = FaultProxy(s3_server.port, rate=0.0)
    try:
        d = node(s3_server, tmp_path, "d", url, endpoint=proxy.url)
        rows = jrun(d, "list", "--all")["snapshots"]
        assert proxy.counts["requests"] <= 5, proxy.counts  # config.json once, 3 listings, the one heads object
    finally:
        proxy.close()
    assert len(rows) == 41 and rows[0]["message"] == "run 40" and gone not in {r["id"] for r in rows}
    assert not [p for p in (tmp_path / "cache-d").rglob("*") if p.is_file() and "snapshots" in p.parts]
    raw = json.loads(Vault.open(url).backend.get_key(objects[0][len("v/"):], 1 << 20))
    assert len(raw["heads"]) == 41 and gone not in raw["heads"]


def test_hostile_heads_objects_are_bounded_and_never_passed_on(s3_server, tmp_path: Path, make_venv, wheelhouse,
                                                               monkeypatch):
    """Heads objects someone else put in the bucket: one whose heads are garbage, one over the size limit
    (here 4 KiB), one whose name is not its id. A new node lists the right rows (computing what they do not
    give from the documents); a snap merges none of the garbage into the heads object it writes."""
    import obstore

    from envvault.model.snapshot import parse_snapshot
    from envvault.vault import s3_heads

    bucket, url, sid = _bucket_with_one_snap(s3_server, tmp_path, make_venv, wheelhouse, "real")
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("ENVVAULT_CACHE_DIR", str(tmp_path / "cache-w"))
    store = s3_server._store(bucket)
    garbage = canonical_json({"format": 1, "heads": {sid: {"created": 7, "packages": "many"}}})
    big = canonical_json({"format": 1, "heads": {sid: {"created": "2030-01-01T00:00:00Z", "message": "x" * 8192}}})
    for data in (garbage, big):
        obstore.put(store, f"v/heads/{object_id(data)}.json", data)
    obstore.put(store, f"v/heads/{'0' * 64}.json", garbage)  # not its id
    monkeypatch.setattr(s3_heads, "_LIMIT", 4096)

    rows = jrun(node(s3_server, tmp_path, "d", url), "list", "--all")["snapshots"]
    assert [(r["id"], r["message"]) for r in rows] == [(sid, "real")]

    doc = json.loads(Vault.open(url).backend.load("snapshots", sid))
    new = Vault.open(url).commit_snapshot(parse_snapshot(dict(doc, message="second")))
    hostile = {f"v/heads/{object_id(garbage)}.json", f"v/heads/{object_id(big)}.json", f"v/heads/{'0' * 64}.json"}
    written = [json.loads(Vault.open(url).backend.get_key(k[len("v/"):], 1 << 20))
               for k in s3_server.keys(bucket, "v/heads/") if k.endswith(".json") and k not in hostile]
    merged = [w for w in written if new in w["heads"]]
    assert len(merged) == 1, written
    assert f"v/heads/{object_id(garbage)}.json" not in s3_server.keys(bucket, "v/heads/")  # read, so merged away
    from envvault.model.heads import parse_head

    heads = merged[0]["heads"]
    assert [parse_head(h).message for h in heads.values()] and heads.get(sid, {"message": "real"})["message"] == "real"


def test_a_lister_merges_many_heads_objects(s3_server, tmp_path: Path, make_venv, wheelhouse, monkeypatch):
    """Writers that committed at once leave a heads object each: a node that lists and reads 3 or more of
    them writes one that covers them all, as it exits, and deletes those (the next node reads one)."""
    import obstore

    from envvault.model.snapshot import parse_snapshot

    bucket, url, sid = _bucket_with_one_snap(s3_server, tmp_path, make_venv, wheelhouse, "first")
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("ENVVAULT_CACHE_DIR", str(tmp_path / "cache-w"))
    doc = json.loads(Vault.open(url).backend.load("snapshots", sid))
    store = s3_server._store(bucket)
    for i in range(3):  # three more snapshots, each with a heads object of its own (as concurrent writers leave)
        snap = parse_snapshot(dict(doc, message=f"w{i}", created=f"2030-01-01T00:00:0{i}.000000Z"))
        data = snap.to_json()
        obstore.put(store, f"v/snapshots/{object_id(data)}.json", data)
        one = canonical_json({"format": 1, "heads": {object_id(data): head_of(snap).to_dict()}})
        obstore.put(store, f"v/heads/{object_id(one)}.json", one)
    assert len([k for k in s3_server.keys(bucket, "v/heads/") if k.endswith(".json")]) == 4
    rows = jrun(node(s3_server, tmp_path, "d", url), "list", "--all")["snapshots"]
    assert len(rows) == 4
    left = [k for k in s3_server.keys(bucket, "v/heads/") if k.endswith(".json")]
    assert len(left) == 1, left
    merged = json.loads(Vault.open(url).backend.get_key(left[0][len("v/"):], 1 << 20))
    assert set(merged["heads"]) == {r["id"] for r in rows}
