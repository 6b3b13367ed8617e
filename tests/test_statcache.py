"""The stat cache: its ids are trusted without the index, so a gc must invalidate every copy in flight."""

from __future__ import annotations

import os
import sys

from fixtures import catalogue as C
from fixtures import uv_install
from tests.evtools import ev, ev_env, ev_json


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
    assert list((vault_dir / "state").glob("stat-*.groups.bin"))


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

    from array import array

    from envvault.vault.statcache import GROUPS_MAGIC, StatCache, group_paths, group_stats_fresh, stat_key

    assert sys.byteorder == "little"  # (the layout checked below is the file's: little-endian int64)
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
    (tmp_path / "state" / "stat-x.groups.json").write_text("{}")  # version 6's groups file: no version reads it
    cache.save()
    assert not (tmp_path / "state" / "stat-x.groups.json").exists()
    raw = (tmp_path / "state" / "stat-x.groups.bin").read_bytes()
    assert raw.startswith(GROUPS_MAGIC)
    size = int.from_bytes(raw[len(GROUPS_MAGIC):len(GROUPS_MAGIC) + 4], "big")
    header = json.loads(raw[len(GROUPS_MAGIC) + 4:len(GROUPS_MAGIC) + 4 + size])
    assert header["version"] == 9  # 9: links out to RECORD's bytes stored as files (8's and 7's groups are not read)
    plain, odd = header["groups"]["plain"], header["groups"]["odd"]
    # the packed group: its paths and stats after the header, no JSON string of them
    assert "files" not in plain and plain["packed"] == [len("a.py\nsub dir/b.so\nc,d.txt"), 3]
    assert raw.endswith(b"a.py\nsub dir/b.so\nc,d.txt" + array("q", sum(keys[:3], [])).tobytes())
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

    from envvault import __version__
    from envvault.caches.snap import take_cache_snapshot
    from envvault.vault.statcache import StatCache, encode_groups_file
    from envvault.vault.store import Vault

    vault = Vault.open(tmp_path / "v", create=True)
    groups = tmp_path / "v" / "state" / "stat-caches.groups.bin"
    groups.parent.mkdir(parents=True, exist_ok=True)
    for extra in ([], "x", 7, None):
        groups.write_bytes(encode_groups_file({"version": StatCache.GROUPS_VERSION, "tool": __version__, "extra": extra}, {}))
        assert vault.stat_cache("stat-caches").extra == {}
    cache = tmp_path / "inductor"
    cache.mkdir()
    (cache / "entry").write_bytes(b"compiled" * 10)
    groups.write_bytes(encode_groups_file({"version": StatCache.GROUPS_VERSION, "tool": __version__, "extra": []}, {}))
    result = take_cache_snapshot(vault, extra_dirs=[cache], discover=False, argv=["t"])
    assert result.snapshot.stats.files == 1


def test_a_groups_file_of_an_older_version_is_not_read(tmp_path):
    """A version 8 groups file holds manifests that recorded links out of the environment which a scan now
    stores as the files they lead to (a uv ``--link-mode symlink`` install): reused, the next snapshot would
    still hold no bytes of them (helper 38). It is not read: the groups are built again."""
    from envvault import __version__
    from envvault.vault.statcache import StatCache, encode_groups_file

    path = tmp_path / "state" / "stat-x"
    path.parent.mkdir(parents=True)
    group = {"record_stat": [1, 2, 3, 4], "meta_stat": [1, 2, 3, 4], "files": [], "stats": [], "missing": [],
             "summary": {}, "manifest_full": "0" * 64}
    for version, read in ((StatCache.GROUPS_VERSION - 1, False), (StatCache.GROUPS_VERSION, True)):
        path.with_name("stat-x.groups.bin").write_bytes(
            encode_groups_file({"version": version, "tool": __version__, "extra": {}}, {"a.dist-info": group}))
        assert ("a.dist-info" in StatCache(path).groups) is read
    assert StatCache.GROUPS_VERSION == 9


def test_a_garbled_groups_file_is_an_empty_cache_never_an_error(tmp_path):
    """The groups file (state/ of a vault that may come from someone else) is one whole or nothing: no magic,
    a header that is not a JSON object, a length past the end, a packed count that is not one, bytes missing or
    left over, a group both packed and with lists: the cache is empty (every distribution is read again), never
    an error, and nothing is read past the file. Packed paths that are not UTF-8 (read only when a scan needs
    them) make their group stale."""
    import json

    from envvault import __version__
    from envvault.vault.statcache import (GROUPS_MAGIC, StatCache, decode_groups_file, encode_groups_file,
                                          encode_stats, group_file_count, group_stats_fresh, unpacked_group)

    for d in ("state", "locks", "tmp"):
        (tmp_path / d).mkdir()
    (tmp_path / "a").write_bytes(b"x")
    st = (tmp_path / "a").lstat()
    files, stats = encode_stats(["a", "b"], [[st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]] * 2)
    head = {"version": StatCache.GROUPS_VERSION, "tool": __version__, "extra": {}}
    good = encode_groups_file(head, {"g": {"files": files, "stats": stats, "summary": {}}})
    lazy = decode_groups_file(good)["groups"]["g"]
    assert group_file_count(lazy) == 2 and "files" not in lazy  # read when first needed
    assert unpacked_group(lazy) == {"files": "a\nb", "stats": stats, "summary": {}}

    def header(groups) -> bytes:
        text = json.dumps(dict(head, groups=groups)).encode()
        return GROUPS_MAGIC + len(text).to_bytes(4, "big") + text

    bad = [
        b"", b"garbage", good[:len(GROUPS_MAGIC) + 2], good[:-1], good + b"\0", header({"g": {}})[:-1] + b"!",
        GROUPS_MAGIC + (1 << 31).to_bytes(4, "big") + b"{}",
        header([]), header({"g": {"packed": [3, -1]}}) + b"a\nb",
        header({"g": {"packed": "3,2"}}) + b"a\nb" + stats,
        header({"g": {"packed": [3, 2, 1]}}) + b"a\nb" + stats,
        header({"g": {"packed": [3, 2], "files": "a\nb"}}) + b"a\nb" + stats,
        header({"g": {"packed": [3, 1 << 40]}}) + b"a\nb" + stats,
        GROUPS_MAGIC + (2).to_bytes(4, "big") + b"[]",
    ]
    path = tmp_path / "state" / "stat-x"
    for raw in bad:
        assert decode_groups_file(raw) is None, raw[:80]
        (tmp_path / "state" / "stat-x.groups.bin").write_bytes(raw)
        cache = StatCache(path)
        assert cache.groups == {} and cache.identity() is None, raw[:80]
    (tmp_path / "state" / "stat-x.groups.bin").write_bytes(good)
    assert unpacked_group(StatCache(path).groups["g"])["stats"] == stats
    (tmp_path / "state" / "stat-x.groups.bin").write_bytes(header({"g": {"packed": [3, 2]}}) + b"a\n\xff" + stats)
    group = StatCache(path).groups["g"]  # loaded: the header is whole
    assert unpacked_group(group) == {} and not group_stats_fresh(str(tmp_path) + "/", group)  # stale


def test_a_group_that_is_not_what_a_group_holds_makes_the_whole_file_nothing():
    """Each reader of a group (the scan, the freshness check, the compile cache snap) takes its fields with
    ``.get`` and uses them as what they are; a group of another shape (a string, a list, a field of another
    type, files and stats that do not pair up) makes the groups file nothing, never an internal error."""
    import json

    from envvault import __version__
    from envvault.vault.statcache import (GROUPS_MAGIC, StatCache, decode_groups_file, encode_groups_file,
                                          group_problem)

    head = {"version": StatCache.GROUPS_VERSION, "tool": __version__, "extra": {}}
    key = [1, 2, 3, 4]
    good = {"record_stat": key, "meta_stat": key, "files": "a\nb", "stats": b"\0" * 64, "missing": ["c"],
            "summary": {"name": "a"}, "manifest_full": "a" * 64, "manifest_check": "b" * 64,
            "lock": {"record_stat": key, "meta_stat": key, "summary": {}}}
    cache_group = {"dirs": [["", 1, 2], ["x", 3, 4]], "files": ["f"], "stats": [key], "tree_fp": {},
                   "env_key": "k", "entry": {}}
    for group in (good, cache_group, {"summary": {}}, {}):
        assert group_problem(group) is None, group
        assert decode_groups_file(encode_groups_file(head, {"g": group})) is not None, group
    bad = ["x", [1], 7, None, True,
           dict(good, record_stat="x"), dict(good, meta_stat=[1, 2]), dict(good, record_stat=[1, 2, 3, "4"]),
           dict(good, missing="c"), dict(good, missing=[1]), dict(good, summary=[]), dict(good, summary="s"),
           dict(good, manifest_full=7), dict(good, manifest_check="short"),
           dict(good, lock={"summary": {}}), dict(good, lock={"record_stat": key, "meta_stat": key, "summary": 1}),
           dict(good, lock=[]),
           dict(cache_group, dirs=[["a", 1]]), dict(cache_group, dirs="d"), dict(cache_group, dirs=[[1, 2, 3]]),
           dict(cache_group, tree_fp=[]), dict(cache_group, env_key=1), dict(cache_group, entry="e"),
           dict(good, stats=b"\0" * 33), {k: v for k, v in good.items() if k != "summary"},
           dict(cache_group, stats=[[1, 2, 3]]), dict(cache_group, files=["f", "g"]), dict(cache_group, files=[1]),
           dict(cache_group, stats="s"), {"files": "a", "stats": None}, {"stats": [key]}]
    for group in bad:
        assert group_problem(group) is not None, group
        if isinstance(group, dict):
            raw = encode_groups_file(head, {"ok": good, "g": group})
        else:  # not an object: the encoder takes none, so the header is written here
            text = json.dumps(dict(head, groups={"g": group})).encode()
            raw = GROUPS_MAGIC + len(text).to_bytes(4, "big") + text
        assert decode_groups_file(raw) is None, group


def _broken_group_file(groups_file, change) -> None:
    """Rewrite the groups file with ``change(groups)`` applied to its decoded groups, as a copied vault could."""
    import json

    from envvault.vault.statcache import decode_groups_file, encode_groups_file

    from envvault.vault.statcache import GROUPS_MAGIC

    doc = decode_groups_file(groups_file.read_bytes())
    change(doc["groups"])
    odd = {k: v for k, v in doc["groups"].items() if not isinstance(v, dict)}  # the encoder takes objects only
    groups = {k: ({"odd": k} if k in odd else v) for k, v in doc["groups"].items()}
    raw = encode_groups_file({k: v for k, v in doc.items() if k != "groups"}, groups)
    start = len(GROUPS_MAGIC) + 4
    end = start + int.from_bytes(raw[len(GROUPS_MAGIC):start], "big")
    header = raw[start:end]
    for k, v in odd.items():
        header = header.replace(json.dumps({"odd": k}, separators=(",", ":")).encode(), json.dumps(v).encode())
    groups_file.write_bytes(GROUPS_MAGIC + len(header).to_bytes(4, "big") + header + raw[end:])


def test_a_broken_group_in_a_copied_vault_is_read_again_never_an_internal_error(tmp_path, make_venv, wheelhouse):
    """state/ comes with a copied vault (the key of a common venv path can be guessed): a group that is a
    string, or one whose files all match but whose summary the model does not take, costs a read of that
    distribution again; status and snap answer as on a clean cache, and the next save puts a good group back."""
    from envvault.vault.statcache import decode_groups_file

    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]), str(wheelhouse[C.NS_ALPHA]))
    vault = tmp_path / "vault"
    ev(vault, "snap", "--venv", venv, "--no-caches")
    groups_file = next((vault / "state").glob("stat-*.groups.bin"))
    keys = sorted(decode_groups_file(groups_file.read_bytes())["groups"])
    assert len(keys) == 2

    def as_string(groups):
        groups[keys[0]] = "x"

    def bad_summary(groups):
        groups[keys[1]]["summary"] = dict(groups[keys[1]]["summary"], version=7)

    for change in (as_string, bad_summary):
        _broken_group_file(groups_file, change)
        for quick in ("1", "0"):
            proc = ev(vault, "status", "--venv", venv, "--exit-code", check=False,
                      env=ev_env(vault, ENVVAULT_QUICK_STATUS=quick))
            assert (proc.returncode, proc.stderr) == (0, ""), proc
            assert "unchanged since snapshot" in proc.stdout
        _broken_group_file(groups_file, change)
        proc = ev(vault, "snap", "--venv", venv, "--no-caches", check=False)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc
        healed = decode_groups_file(groups_file.read_bytes())["groups"]
        assert sorted(healed) == keys and all(isinstance(healed[k]["summary"]["version"], str) for k in keys)


def test_the_writer_never_writes_a_header_the_reader_refuses(monkeypatch):
    """A header past ``HEADER_LIMIT`` would make the whole cache nothing on every load: the writer leaves out
    the compile cache roots' groups first (a row a folder in the header), then every group, so the
    distributions' shortcuts survive a cache of very many folders."""
    from envvault import __version__
    from envvault.vault import statcache
    from envvault.vault.statcache import StatCache, decode_groups_file, encode_groups_file

    head = {"version": StatCache.GROUPS_VERSION, "tool": __version__, "extra": {"probe": {}}}
    env_group = {"record_stat": [1, 2, 3, 4], "files": "a", "stats": b"\0" * 32, "summary": {"name": "a"}}
    cache_group = {"dirs": [[f"d{i}", i, i] for i in range(2000)], "files": "f", "stats": b"\0" * 32,
                   "tree_fp": {}, "env_key": "k", "entry": {}}
    groups = {"lib/a.dist-info": env_group, "cache:/c": cache_group}
    assert set(decode_groups_file(encode_groups_file(head, groups))["groups"]) == set(groups)
    monkeypatch.setattr(statcache, "HEADER_LIMIT", 4096)
    assert set(decode_groups_file(encode_groups_file(head, groups))["groups"]) == {"lib/a.dist-info"}
    many = {f"lib/p{i}.dist-info": env_group for i in range(100)}
    assert decode_groups_file(encode_groups_file(head, many))["groups"] == {}
    assert decode_groups_file(encode_groups_file(dict(head, extra={"x": "y" * 5000}), {}))["extra"] == {}


def test_packed_files_are_read_from_the_groups_file_that_was_loaded(tmp_path):
    """A cache's groups keep their packed files and stats in the groups file until a scan needs them (in the
    forked child that checks them, mostly); read then through the descriptor it was loaded from, so a save
    that replaced the file since (another process's) never mixes two files; a forked child reads them
    through its own copy of the descriptor."""
    import os

    from envvault import __version__
    from envvault.vault.statcache import StatCache, encode_groups_file, encode_stats, unpacked_group

    for d in ("state", "locks", "tmp"):
        (tmp_path / d).mkdir()
    head = {"version": StatCache.GROUPS_VERSION, "tool": __version__, "extra": {}}
    key = [1, 2, 3, 4]
    files, stats = encode_stats(["a", "b"], [key, key])
    path = tmp_path / "state" / "stat-x"
    groups_file = tmp_path / "state" / "stat-x.groups.bin"
    groups_file.write_bytes(encode_groups_file(head, {"g": {"files": files, "stats": stats, "summary": {}}}))
    cache = StatCache(path)
    other = encode_stats(["c", "d", "e"], [key] * 3)
    replacement = tmp_path / "tmp" / "new"
    replacement.write_bytes(encode_groups_file(head, {"g": {"files": other[0], "stats": other[1], "summary": {}}}))
    os.replace(replacement, groups_file)  # as a save does
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a forked child reads the group from the file its parent loaded
        os.write(w, unpacked_group(cache.groups["g"])["files"].encode())
        os._exit(0)
    os.close(w)
    assert os.read(r, 100) == b"a\nb"
    os.waitpid(pid, 0)
    assert unpacked_group(cache.groups["g"])["files"] == "a\nb" and cache.groups["g"]["stats"] == stats
    assert unpacked_group(StatCache(path).groups["g"])["files"] == "c\nd\ne"


def test_a_copied_group_shares_its_groups_file_and_none_is_pickled(tmp_path):
    """A copy of a loaded group reads the same descriptor, which is closed once (two closes would close a
    file the process opened since); a group not yet read cannot be pickled (its descriptor is this
    process's)."""
    import copy
    import pickle

    import pytest

    from envvault import __version__
    from envvault.vault.statcache import StatCache, encode_groups_file, encode_stats, unpacked_group

    for d in ("state", "locks", "tmp"):
        (tmp_path / d).mkdir()
    files, stats = encode_stats(["a", "b"], [[1, 2, 3, 4]] * 2)
    head = {"version": StatCache.GROUPS_VERSION, "tool": __version__, "extra": {}}
    (tmp_path / "state" / "stat-x.groups.bin").write_bytes(
        encode_groups_file(head, {"g": {"files": files, "stats": stats, "summary": {}}}))
    cache = StatCache(tmp_path / "state" / "stat-x")
    twin = copy.deepcopy(cache.groups["g"])
    with pytest.raises(TypeError):
        pickle.dumps(cache.groups["g"])
    del twin
    import gc

    gc.collect()
    other = os.open(tmp_path / "a-file", os.O_CREAT | os.O_RDWR)  # may take a number a double close frees
    try:
        assert unpacked_group(cache.groups["g"])["files"] == "a\nb"
        os.fstat(other)  # still open
    finally:
        os.close(other)


def test_a_groups_file_that_is_a_link_or_a_fifo_is_an_empty_cache_never_a_wait(tmp_path):
    """The groups file is opened as every file of a vault (its state/ may be someone else's): a symlink there
    (to a good groups file, or to /dev/zero) or a FIFO makes the cache empty at once; nothing is followed,
    read without end or waited on."""
    import os

    from envvault import __version__
    from envvault.vault.statcache import StatCache, encode_groups_file, encode_stats

    for d in ("state", "locks", "tmp"):
        (tmp_path / d).mkdir()
    files, stats = encode_stats(["a"], [[1, 2, 3, 4]])
    good = tmp_path / "good.groups.bin"
    good.write_bytes(encode_groups_file({"version": StatCache.GROUPS_VERSION, "tool": __version__, "extra": {}},
                                        {"g": {"files": files, "stats": stats, "summary": {}}}))
    path = tmp_path / "state" / "stat-x"
    groups_file = tmp_path / "state" / "stat-x.groups.bin"
    os.symlink(good, groups_file)
    assert StatCache(path).groups == {}
    groups_file.unlink()
    os.symlink("/dev/zero", groups_file)
    assert StatCache(path).groups == {}
    groups_file.unlink()
    os.mkfifo(groups_file)
    assert StatCache(path).groups == {}  # no writer ever opens it: a wait would hang the test
    groups_file.unlink()
    os.link(good, groups_file)  # the same bytes as a regular file: read
    assert set(StatCache(path).groups) == {"g"}
