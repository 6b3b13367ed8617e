"""Hostile objects in a shared bucket (docs/format.md, "Object storage", "Snapshot heads", "Lock objects"),
against a real S3 server on 127.0.0.1 (moto, tests/s3server.py): whoever else can write the bucket may put
any bytes under any name. Heads objects and bundles are optimisations, so a bad one is ignored; a bad lock
object is judged by its age alone; nothing read is unbounded or raises out of the command."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import obstore
import pytest

from envvault.model.encoding import object_id
from envvault.vault import s3 as s3mod
from envvault.vault.objcache import ObjectCache
from envvault.vault.s3 import S3Backend

DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.fixture
def bucket(aws):
    """``(backend, raw obstore store, prefix)`` of an empty vault prefix in a fresh bucket, with a node cache."""
    name = aws.bucket()
    backend = S3Backend(f"s3://{name}/v")
    backend.cache = ObjectCache(Path(tempfile.mkdtemp()) / "objects", limit=1 << 30)
    return backend, aws._store(name), "v/"


def test_deeply_nested_heads_and_bundles_are_ignored(bucket):
    b, store, pre = bucket
    hid = object_id(DEEP)
    obstore.put(store, f"{pre}heads/{hid}.json", DEEP)
    obstore.put(store, f"{pre}bundles/{hid}.json", DEEP)
    doc = b'{"kind":"snapshot"}'
    sid = object_id(doc)
    obstore.put(store, f"{pre}snapshots/{sid}.json", doc)
    assert b.shared_heads({sid}) == {}
    b.share_head(sid, {"created": "2030-01-01T00:00:00.000000Z"})  # ignores the bad object, writes its own
    written = [k for k in (m["path"] for batch in obstore.list(store, f"{pre}heads/") for m in batch) if hid not in k]
    assert len(written) == 1
    b.list("snapshots")
    assert b.load("snapshots", sid) == doc  # the bad bundle skipped, the document read on its own


def test_an_oversized_bundle_is_refused_by_its_size(bucket, monkeypatch):
    """A bundle over the document limit (here 64 KiB) is not read: its size is checked from the response
    before the body is (a multi-GiB one would otherwise be held in memory on every cold node)."""
    b, store, pre = bucket
    monkeypatch.setattr(s3mod, "DEFAULT_LIMIT", 64 << 10)
    doc = b'{"kind":"snapshot"}'
    sid = object_id(doc)
    big = json.dumps({"format": 1, "snapshots": {sid: doc.decode()}, "pad": "x" * (256 << 10)}).encode()
    obstore.put(store, f"{pre}bundles/{object_id(big)}.json", big)
    obstore.put(store, f"{pre}snapshots/{sid}.json", doc)
    fetched = []
    real_get = b.get_key
    monkeypatch.setattr(b, "get_key", lambda key, limit: fetched.append((key, limit)) or real_get(key, limit))
    b.list("snapshots")
    assert b.load("snapshots", sid) == doc
    assert fetched and all(limit == 64 << 10 for _key, limit in fetched)
    assert b.get_key(fetched[0][0], 64 << 10) is None  # refused, not read


@pytest.mark.parametrize("body", [b"[]", b'"x"', DEEP, "host-huge-pid", "host-negative-pid"])
def test_a_bad_lock_object_does_not_stop_the_vault(bucket, body):
    """A lock object that is not an object, or names a pid no process can have on this host: judged by its
    age (young: it excludes a writer of an exclusive lock, as an unknown holder does), never an error."""
    from envvault.vault.lockobjects import _place

    b, store, pre = bucket
    here = _place()  # this host, boot and PID namespace: where a pid can be judged gone
    if body == "host-huge-pid":
        body = json.dumps({**here, "pid": 10**30, "exclusive": True}).encode()
    elif body == "host-negative-pid":
        body = json.dumps({**here, "pid": -1, "exclusive": True}).encode()
    obstore.put(store, f"{pre}locks/vault-{'f' * 32}.json", body)
    with b.lock("vault", exclusive=False, wait=False) as held:
        # A same-host pid that cannot exist is a dead holder: its object is removed and the lock is ours.
        # Otherwise an object that says nothing readable is a young unknown holder: it excludes.
        dead = b"pid" in body
        assert held is dead
    left = [m["path"] for batch in obstore.list(store, f"{pre}locks/") for m in batch]
    assert (f"{pre}locks/vault-{'f' * 32}.json" in left) is (not dead)
    assert all("vault-f" in k for k in left)  # no lock object of ours left behind
