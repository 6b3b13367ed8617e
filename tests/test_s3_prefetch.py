"""S3Backend.prefetch (vault/s3.py): a restore's packs come into the node cache side by side, each with one
GET, however many threads ask for it at once; what is cached already is not fetched again."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor


from envvault.model.encoding import object_id
from envvault.vault.objcache import ObjectCache
from envvault.vault.s3 import S3Backend


def _packs(b: S3Backend, tmp_path, n: int) -> dict[str, bytes]:
    packs = {}
    for i in range(n):
        data = bytes([i]) * (300_000 + i)
        name = object_id(data)
        path = tmp_path / f"p{i}"
        path.write_bytes(data)
        b.save_file("packs", name, path)
        packs[name] = data
    return packs


def test_prefetch_fetches_each_pack_once(aws, tmp_path):
    url = f"s3://{aws.bucket()}/v"
    packs = _packs(S3Backend(url), tmp_path, 12)
    b = S3Backend(url, cache=ObjectCache(tmp_path / "cache"))
    names = list(packs)
    b.prefetch("packs", names, {n: len(d) for n, d in packs.items()})
    # readers race the prefetchers (and each other) for the same packs: one GET each all the same
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda n: b.load("packs", n, 10, 20), names + names[::-1]))
    assert got == [packs[n][10:30] for n in names + names[::-1]]
    deadline = time.monotonic() + 30
    while b._fetchers and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b.requests == len(names)
    b.prefetch("packs", names)  # all cached: nothing to do
    assert b._fetchers == 0 and b.requests == len(names)


def test_prefetch_stops_at_half_the_cache(aws, tmp_path):
    url = f"s3://{aws.bucket()}/v"
    packs = _packs(S3Backend(url), tmp_path, 4)
    b = S3Backend(url, cache=ObjectCache(tmp_path / "cache", limit=1_300_000))
    b.prefetch("packs", list(packs), {n: len(d) for n, d in packs.items()})
    deadline = time.monotonic() + 30
    while b._fetchers and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b.requests == 2  # 650,000 bytes: two packs of about 300,000
    assert [b.load("packs", n, 0, 5) for n in packs] == [d[:5] for d in packs.values()]
