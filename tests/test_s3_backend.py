"""S3Backend against a real S3 server (moto on 127.0.0.1): the Backend contract of envvault/vault/backend.py,
pagination, locks across "hosts", credentials and bucket errors, and the node-local object cache."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from envvault.errors import CorruptError, StorageError
from envvault.model.encoding import object_id
from envvault.vault.backend import Missing
from envvault.vault.objcache import ObjectCache
from envvault.vault.s3 import S3Backend
from tests.evtools import follows_backend


def test_contract(aws):
    b = S3Backend(f"s3://{aws.bucket()}/team/vault")
    assert follows_backend(b)
    assert b.location.startswith("s3://") and "testing-secret" not in b.location
    assert b.list("snapshots") == [] and b.list("config") == []
    assert b.save("config", "config", b"{}", exclusive=True) is True
    assert b.save("config", "config", b"{other}", exclusive=True) is False
    assert b.load("config", "config") == b"{}"
    assert b.list("config") == ["config"]
    doc = b'{"a":1}'
    sid = object_id(doc)
    assert b.save("snapshots", sid, doc, exclusive=True)
    assert b.load("snapshots", sid) == doc
    assert b.load("snapshots", sid, 2, 3) == doc[2:5]
    assert b.load("snapshots", sid, 5, 100) == doc[5:]
    assert b.load("snapshots", sid, 100, 5) == b""
    with pytest.raises(CorruptError, match="over the limit"):
        b.load("snapshots", sid, limit=3)
    assert b.stat("snapshots", sid).size == len(doc)
    with pytest.raises(Missing):
        b.load("snapshots", "0" * 64)
    with pytest.raises(Missing):
        b.stat("tags", "nope")
    b.save("tags", "v1", (sid + "\n").encode())
    b.save("tags", "v1", (sid + "\n").encode())  # replaced
    assert b.list("tags") == ["v1"]
    assert sorted(b.list("snapshots")) == [sid]
    assert b.remove("tags", "v1") is True and b.remove("tags", "v1") is False
    # the local tree's names, so `aws s3 sync` of a local vault is a bucket vault and back
    assert aws.keys(b.url.bucket) == ["team/vault/config.json", f"team/vault/snapshots/{sid}.json"]


def test_save_file_packs_and_cache(aws, tmp_path):
    cache = ObjectCache(tmp_path / "cache", limit=10 << 20)
    b = S3Backend(f"s3://{aws.bucket()}/v", cache=cache)
    data = os.urandom(3 << 20)
    pid = object_id(data)
    f = tmp_path / "p.tmp"
    f.write_bytes(data)
    b.save_file("packs", pid, f)
    assert not f.exists()
    assert b.list("packs") == [pid]
    assert cache.path("packs", pid).exists(), "a pack this node wrote is in its cache"
    before = b.requests
    assert b.load("packs", pid, 100, 50) == data[100:150]
    assert b.requests == before, "a cached pack is read locally"
    # node B: an empty cache fetches the pack once, whole, then reads locally
    cache_b = ObjectCache(tmp_path / "cache-b", limit=10 << 20)
    nb = S3Backend(b.location, cache=cache_b)
    assert nb.load("packs", pid, 0, 10) == data[:10]
    n = nb.requests
    assert nb.load("packs", pid, 1 << 20, 10) == data[1 << 20: (1 << 20) + 10]
    assert nb.requests == n
    # LRU bound: 4 more packs of 3 MiB into a 10 MiB cache evict the oldest
    for i in range(4):
        d = os.urandom(3 << 20)
        g = tmp_path / f"q{i}"
        g.write_bytes(d)
        nb.save_file("packs", object_id(d), g)
    assert cache_b.usage() <= 10 << 20
    assert not cache_b.path("packs", pid).exists()
    assert nb.load("packs", pid, 5, 5) == data[5:10]  # fetched again


def test_damaged_pack_in_bucket_is_not_cached(aws, tmp_path):
    b = S3Backend(f"s3://{aws.bucket()}/v", cache=ObjectCache(tmp_path / "c", limit=1 << 30))
    data = os.urandom(1000)
    pid = object_id(data)
    b.store and __import__("obstore").put(b.store, f"packs/{pid[:2]}/{pid}.pack", data[:-1] + b"x")
    with pytest.raises(CorruptError, match="does not match its name"):
        b.load("packs", pid, 0, 10)
    assert not b.cache.path("packs", pid).exists()


def test_list_paginates(aws):
    b = S3Backend(f"s3://{aws.bucket()}/p")
    names = [object_id(str(i).encode()) for i in range(1050)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: b.save("index", n, b"{}"), names))
    b.save("index", "not-an-id", b"x")
    before = b.requests
    assert sorted(b.list("index")) == sorted(names)
    assert b.requests - before == 1  # one call to obstore's paginating list (2 LIST requests underneath)


def test_locks(aws):
    b = S3Backend(f"s3://{aws.bucket()}/l")
    with b.lock("vault", exclusive=False) as a, b.lock("vault", exclusive=False) as c:
        assert a and c
        with b.lock("vault", exclusive=True, wait=False) as x:
            assert x is False
    with b.lock("vault", exclusive=True) as x:
        assert x
        with b.lock("vault", exclusive=False, wait=False) as y:
            assert y is False
    assert [k for k in aws.keys(b.url.bucket) if "/locks/" in k] == []
    # an exclusive waiter gets the lock when the shared holder leaves
    got = []
    with b.lock("vault", exclusive=False):
        t = threading.Thread(target=lambda: got.append(b.lock("vault", exclusive=True).__enter__()))
        t.start()
        t.join(1.5)
        assert got == []
    t.join(30)
    assert got == [True]


def test_stale_lock_of_a_killed_process(aws, tmp_path):
    """A lock object left by a process killed with -9 on this host is stale at once (its pid is gone)."""
    bucket = aws.bucket()
    code = ("import os,sys; from envvault.vault.s3 import S3Backend; b=S3Backend(sys.argv[1]);"
            "cm=b.lock('vault', exclusive=True); cm.__enter__(); print('held', flush=True); os._exit(0)")
    proc = subprocess.run([sys.executable, "-c", code, f"s3://{bucket}/k"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert "held" in proc.stdout, proc.stderr
    assert len([k for k in aws.keys(bucket) if "/locks/" in k]) == 1
    b = S3Backend(f"s3://{bucket}/k")
    with b.lock("vault", exclusive=True, wait=False) as held:
        assert held
    assert [k for k in aws.keys(bucket) if "/locks/" in k] == []


def test_wrong_credentials_and_missing_bucket(aws, monkeypatch):
    b = S3Backend(f"s3://no-such-bucket-{os.getpid()}/x")
    with pytest.raises(StorageError, match="bucket does not exist"):
        b.list("snapshots")
    with pytest.raises(StorageError, match="bucket does not exist"):
        b.save("tags", "t", b"x")


def test_wrong_credentials_is_one_error(aws):
    from s3server import FaultProxy

    proxy = FaultProxy(aws.port)
    proxy.forbid = True
    try:
        b = S3Backend(f"s3://{aws.bucket()}/x")
        import obstore.store

        b.store = obstore.store.S3Store(b.url.bucket, prefix="x", endpoint=proxy.url, region="us-east-1",
                                        access_key_id="wrong", secret_access_key="wrong",
                                        client_options={"allow_http": True}, virtual_hosted_style_request=False)
        for call in (lambda: b.list("snapshots"), lambda: b.save("tags", "t", b"x"),
                     lambda: b.load("config", "config")):
            with pytest.raises(StorageError, match="access denied") as info:
                call()
            assert "\n" not in str(info.value) and "wrong" not in str(info.value)
        assert proxy.counts["connections"] <= 6, "a wrong credential is not retried"
    finally:
        proxy.close()


def test_listing_1000_snapshots_costs_few_requests(aws, tmp_path):
    """A node that fetched many snapshot documents one by one leaves a bundle; the next node lists 1,000
    snapshots in a handful of requests (the issue's figure: <= 10)."""
    url = f"s3://{aws.bucket()}/many"
    writer = S3Backend(url)
    docs = {}
    for i in range(1000):
        d = b'{"n":%d}' % i
        docs[object_id(d)] = d
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: writer.save("snapshots", kv[0], kv[1]), docs.items()))

    a = S3Backend(url, cache=ObjectCache(tmp_path / "a", limit=1 << 30))
    names = a.list("snapshots")
    assert sorted(names) == sorted(docs)
    assert all(a.load("snapshots", n) == docs[n] for n in names)
    assert a.requests > 1000  # one GET each: no bundle yet
    bid = a.write_bundle()
    assert bid and f"many/bundles/{bid}.json" in aws.keys(a.url.bucket)

    b = S3Backend(url, cache=ObjectCache(tmp_path / "b", limit=1 << 30))
    import time

    start = time.monotonic()
    assert {n: b.load("snapshots", n) for n in b.list("snapshots")} == docs
    took = time.monotonic() - start
    assert b.requests <= 10, b.requests
    assert took < 5, took  # the issue asks <= 1 s; moto and 2 shared cores make this a loose bound
    # a snapshot written after the bundle is fetched on its own; one deleted is not served from a cache
    late = b'{"late":1}'
    writer.save("snapshots", object_id(late), late)
    gone = names[0]
    writer.remove("snapshots", gone)
    c = S3Backend(url, cache=ObjectCache(tmp_path / "b", limit=1 << 30))
    listed = c.list("snapshots")
    assert object_id(late) in listed and gone not in listed
    assert c.load("snapshots", object_id(late)) == late
    with pytest.raises(Missing):
        c.load("snapshots", gone)


def test_credentials_region_and_endpoint_from_a_profile(aws, tmp_path, monkeypatch):
    creds, conf = tmp_path / "credentials", tmp_path / "config"
    creds.write_text("[default]\naws_access_key_id = nope\naws_secret_access_key = nope\n"
                     "[team]\naws_access_key_id = team-key\naws_secret_access_key = team-secret\n")
    conf.write_text(f"[profile team]\nregion = eu-west-1\nendpoint_url = {aws.url}\n")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(conf))
    monkeypatch.setenv("AWS_PROFILE", "team")
    bucket = aws.bucket()
    b = S3Backend(f"s3://{bucket}/p")
    cfg = {str(k).lower(): v for k, v in b.store.config.items()}
    assert cfg.get("aws_access_key_id", cfg.get("access_key_id")) == "team-key", cfg.keys()
    assert cfg.get("aws_region", cfg.get("region")) == "eu-west-1"
    b.save("tags", "t", b"x")  # reaches moto through the profile's endpoint_url
    assert aws.keys(bucket) == ["p/tags/t"]
    monkeypatch.setenv("AWS_PROFILE", "missing")
    from envvault.errors import UsageError

    with pytest.raises(UsageError, match="profile 'missing'"):
        S3Backend(f"s3://{bucket}/p")
