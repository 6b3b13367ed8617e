"""The stat cache: its ids are trusted without the index, so a gc must invalidate every copy in flight."""

from __future__ import annotations

import os

from fixtures import catalogue as C
from fixtures import uv_install
from tests.evtools import ev, ev_json


def test_cache_loaded_before_gc_is_not_saved_back(tmp_path, make_venv, wheelhouse):
    from envvault.snap import statcache_for
    from envvault.vault.gc import collect_garbage
    from envvault.vault.store import Vault

    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    vault_dir = tmp_path / "vault"
    ev(vault_dir, "snap", "--venv", venv)
    vault = Vault.open(vault_dir)
    stale = statcache_for(vault, venv)  # a scan loads the cache ...
    assert stale.groups, "the first snap should have left a stat cache"
    collect_garbage(vault)  # ... a gc runs and deletes every stat cache ...
    assert not list((vault_dir / "state").glob("stat-*"))
    stale.mark_dirty()
    stale.save()  # ... and the scan's save must not bring the old ids back
    assert not list((vault_dir / "state").glob("stat-*"))
    # a cache loaded after the gc saves normally
    fresh = statcache_for(vault, venv)
    fresh.extra["probe"] = {"key": [], "value": {}}
    fresh.mark_dirty()
    fresh.save()
    assert list((vault_dir / "state").glob("stat-*.groups.json"))


def test_snap_after_gc_references_only_stored_objects(tmp_path, make_venv, wheelhouse):
    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    vault = tmp_path / "vault"
    first = ev_json(vault, "snap", "--venv", venv)["id"]
    ev(vault, "gc", "--keep-last", "1")
    uv_install(venv, str(wheelhouse[C.SMALL_02]))
    ev_json(vault, "snap", "--venv", venv)
    ev(vault, "gc", "--keep-last", "1")  # drops the first snapshot and the objects only it used
    assert not (vault / "snapshots" / f"{first}.json").exists()
    uv_install(venv, str(wheelhouse[C.SMALL_01]))  # back to the first state: its objects are gone
    os.sync()
    ev_json(vault, "snap", "--venv", venv)
    assert ev_json(vault, "verify")["ok"]


def test_groups_are_stored_packed_and_read_back(tmp_path):
    """Stat cache version 6: a group's files and stats are two strings; odd paths keep the lists."""
    import json

    from envvault.vault.statcache import StatCache, group_paths, group_stats_fresh, stat_key

    root = tmp_path / "env"
    root.mkdir()
    names = ["a.py", "sub dir/b.so", "c,d.txt", "odd\nname.py"]
    for n in names:
        (root / n).parent.mkdir(exist_ok=True)
        (root / n).write_bytes(b"x" * len(n))
    keys = [stat_key(os.lstat(root / n)) for n in names]
    (tmp_path / "state").mkdir()
    (tmp_path / "locks").mkdir()
    (tmp_path / "tmp").mkdir()
    cache = StatCache(tmp_path / "state" / "stat-x")
    cache.set_group("plain", {"files": names[:3], "stats": keys[:3], "summary": {"name": "p"}})
    cache.set_group("odd", {"files": names, "stats": keys})
    cache.save()
    doc = json.loads((tmp_path / "state" / "stat-x.groups.json").read_bytes())
    assert doc["version"] == 6
    plain, odd = doc["groups"]["plain"], doc["groups"]["odd"]
    assert plain["files"] == "a.py\nsub dir/b.so\nc,d.txt" and isinstance(plain["stats"], str)
    assert odd["files"] == names and odd["stats"] == keys  # a newline in a path: the lists of version 5
    again = StatCache(tmp_path / "state" / "stat-x")
    base = f"{root}/"
    for key, want in (("plain", names[:3]), ("odd", names)):
        group = again.groups[key]
        assert group_paths(group) == want
        assert group_stats_fresh(base, group)
    (root / "sub dir/b.so").write_bytes(b"changed!")  # one file's size and mtime move
    assert not group_stats_fresh(base, again.groups["plain"])
    assert not group_stats_fresh(base, again.groups["odd"])
    (root / "a.py").unlink()
    assert not group_stats_fresh(base, again.groups["plain"])


def test_a_stat_cache_whose_extra_is_not_an_object_is_ignored(tmp_path):
    """state/ comes with a copied vault: a groups file whose ``extra`` is a list (or anything but an object)
    gives an empty memo, and a cache snap that consults it (nvidia-smi's answer) still snaps."""
    import json

    from envvault import __version__
    from envvault.caches.snap import take_cache_snapshot
    from envvault.vault.statcache import StatCache
    from envvault.vault.store import Vault

    vault = Vault.open(tmp_path / "v", create=True)
    groups = tmp_path / "v" / "state" / "stat-caches.groups.json"
    groups.parent.mkdir(parents=True, exist_ok=True)
    for extra in ([], "x", 7, None):
        groups.write_text(json.dumps({"version": StatCache.VERSION, "tool": __version__, "groups": {}, "extra": extra}))
        assert vault.stat_cache("stat-caches").extra == {}
    cache = tmp_path / "inductor"
    cache.mkdir()
    (cache / "entry").write_bytes(b"compiled" * 10)
    groups.write_text(json.dumps({"version": StatCache.VERSION, "tool": __version__, "groups": {}, "extra": []}))
    result = take_cache_snapshot(vault, extra_dirs=[cache], discover=False, argv=["t"])
    assert result.snapshot.stats.files == 1


def test_a_garbled_packed_group_decodes_to_nothing_and_is_never_fresh(tmp_path):
    """The packed stats of a stat cache group (state/ of a vault that may come from someone else) are decoded
    with ``binascii`` behind the check ``base64.b64decode(validate=True)`` made: whatever that refused is
    refused, and such a group is stale (its distribution is read again), never an error."""
    import base64

    from envvault.vault.statcache import encode_stats, group_stats_fresh, unpack_stats

    (tmp_path / "a").write_bytes(b"x")
    st = (tmp_path / "a").lstat()
    files, stats = encode_stats(["a"], [[st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]])
    assert unpack_stats({"files": files, "stats": stats}) == (["a"], base64.b64decode(stats, validate=True))
    base = f"{tmp_path}/"
    assert group_stats_fresh(base, {"files": files, "stats": stats})
    for bad in (stats[:-2] + "$=", stats[:-1], "é" * 44, stats + "\n", stats.replace("=", "") + "==="):
        try:
            base64.b64decode(bad, validate=True)
        except ValueError:
            pass
        else:
            raise AssertionError(f"{bad!r} is valid base64: not a garbled case")
        assert unpack_stats({"files": files, "stats": bad}) is None, bad
        assert group_stats_fresh(base, {"files": files, "stats": bad}) is False, bad
