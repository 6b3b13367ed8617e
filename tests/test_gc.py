"""gc: keeps tagged and recent snapshots whole, frees the rest, and never races a snap."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fixtures import catalogue as C
from fixtures import site_packages, uv_install, uv_pip
from tests.evtools import behind_a_gc, ev, ev_env, ev_json


def _vault(path: Path):
    from envvault.vault.store import Vault

    return Vault.open(path)


def _pack_bytes(vault: Path) -> int:
    return sum(p.stat().st_size for p in (vault / "packs").rglob("*.pack"))


def _objects_of(vault: Path, sid: str) -> set[str]:
    from envvault.vault.verify import referenced_objects

    v = _vault(vault)
    return referenced_objects(v, v.load_snapshot(sid).doc)


def _cu128_then_cu130(vault: Path, venv: Path, wheelhouse) -> tuple[str, str]:
    """Snapshots of ``venv`` with torchlike +cu128, then after the swap to +cu130 (the seeds' story)."""
    uv_install(venv, wheelhouse[C.TORCH_CU128], wheelhouse[C.SMALL_01])
    first = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    uv_pip(venv, "uninstall", "torchlike")
    uv_install(venv, wheelhouse[C.TORCH_CU130])
    return first, ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]


def test_keep_last_tags_and_dry_run(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    first, second = _cu128_then_cu130(vault, venv, wheelhouse)
    uv_pip(venv, "uninstall", "torchlike")
    third = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    other = make_venv("uv", name="other")
    uv_install(other, wheelhouse[C.NS_ALPHA])
    lone = ev_json(vault, "snap", "--no-caches", "--venv", other)["id"]
    ev(vault, "tag", first[:8], "known-good")
    assert _vault(vault).tags() == {"known-good": first}
    moved = ev(vault, "tag", third, "known-good").stdout  # a tag moves, and says from where
    assert moved.strip() == f"tagged {third[:12]} as known-good (moved from {first[:12]})", moved
    assert ev(vault, "tag", first[:8], "known-good").stdout.strip().endswith(f"(moved from {third[:12]})")
    assert ev(vault, "tag", first[:8], "known-good").stdout.strip() == f"tagged {first[:12]} as known-good"

    size = _pack_bytes(vault)
    files = sorted(p for p in vault.rglob("*") if p.is_file() and "state" not in p.parts and "locks" not in p.parts)
    dry = ev_json(vault, "gc", "--keep-last", "1", "--dry-run")
    assert dry["dry_run"] and dry["removed_snapshots"] == [second] and dry["freed_bytes"] > 0
    assert sorted(p for p in vault.rglob("*") if p.is_file() and "state" not in p.parts and "locks" not in p.parts) == files

    res = ev_json(vault, "gc", "--keep-last", "1")
    assert res["removed_snapshots"] == [second] and res["kept_snapshots"] == 3
    assert sorted(s["id"] for s in ev_json(vault, "list", "--all")["snapshots"]) == sorted([first, third, lone])
    assert _pack_bytes(vault) < size - 150_000  # the cu130 build's 200 KiB _C.so is gone
    v = _vault(vault)
    gone = _objects_of(vault, first) | _objects_of(vault, third)
    assert all(v.has(o) for o in gone)
    report = ev_json(vault, "verify")
    assert report["ok"] and report["snapshots"] == 3
    # what gc kept still restores
    new = tmp_path / "from-tag"
    assert ev_json(vault, "restore", "known-good", "--into", new)["verified"]

    ev(vault, "untag", "known-good")
    assert ev_json(vault, "gc", "--keep-last", "1")["removed_snapshots"] == []  # what from-tag was made from
    shutil.rmtree(new)  # that environment gone, nothing keeps the untagged snapshot any more
    assert ev_json(vault, "gc", "--keep-last", "1")["removed_snapshots"] == [first]
    assert ev_json(vault, "verify")["ok"]
    proc = ev(vault, "untag", "known-good", check=False)
    assert proc.returncode == 4


def test_keep_last_keeps_what_the_environment_was_restored_to_not_the_backup(tmp_path, make_venv, wheelhouse):
    """After `restore good`, the newest snapshot is the restore's backup of the broken state; `gc --keep-last
    1` keeps what the environment was restored to (its `latest`), and what is kept still restores."""
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    good, broken = _cu128_then_cu130(vault, venv, wheelhouse)
    restored = ev_json(vault, "restore", good, "--venv", venv)
    backup = restored["backup"]
    assert restored["verified"] and backup not in (None, good, broken)
    dry = ev(vault, "gc", "--keep-last", "1", "--dry-run").stdout
    assert dry.startswith("would remove 2 snapshot(s)") and "would rewrite" in dry and "would keep 1" in dry, dry
    res = ev_json(vault, "gc", "--keep-last", "1")
    assert sorted(res["removed_snapshots"]) == sorted([broken, backup]) and res["kept_snapshots"] == 1
    assert ev_json(vault, "status", "--venv", venv)["snapshot"] == good
    assert ev_json(vault, "restore", "latest", "--into", tmp_path / "copy")["verified"]


def test_keep_last_keeps_what_an_environment_was_restored_to_from_another_ones_snapshot(tmp_path, make_venv,
                                                                                      wheelhouse):
    """B restored from A's snapshot a1, C made with --into from a1, then A snapped again: `gc --keep-last 1`
    keeps a1 (B's and C's latest) though A's newest is a2, and drops B's older snapshot and its backup."""
    vault = tmp_path / "vault"
    a, b = make_venv("uv", name="a"), make_venv("uv", name="b")
    uv_install(a, wheelhouse[C.SMALL_01])
    uv_install(b, wheelhouse[C.NS_ALPHA])
    a1 = ev_json(vault, "snap", "--no-caches", "--venv", a)["id"]
    b1 = ev_json(vault, "snap", "--no-caches", "--venv", b)["id"]
    backup = ev_json(vault, "restore", a1, "--venv", b)["backup"]
    assert ev_json(vault, "restore", a1, "--into", tmp_path / "c")["verified"]
    uv_install(a, wheelhouse[C.TORCH_CU128])
    a2 = ev_json(vault, "snap", "--no-caches", "--venv", a)["id"]
    res = ev_json(vault, "gc", "--keep-last", "1")
    kept = {s["id"] for s in ev_json(vault, "list", "--all")["snapshots"]}
    assert kept == {a1, a2} and set(res["removed_snapshots"]) == {b1, backup}, (kept, res)
    for venv in (b, tmp_path / "c"):
        status = ev_json(vault, "status", "--venv", venv)
        assert status["snapshot"] == a1 and status["empty"], status


def test_partly_live_packs_are_rewritten_and_orphans_removed(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_CU128], wheelhouse[C.SMALL_01])
    ev_json(vault, "snap", "--no-caches", "--venv", venv)  # one pack: torchlike and smallpkg together
    uv_pip(venv, "uninstall", "torchlike")
    keep = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    orphan = vault / "packs" / "ab" / ("ab" + "0" * 62 + ".pack")
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"EVPK\x01\x00\x00\x00junk")  # a pack whose writer died before its index
    old_tmp = vault / "tmp" / ".pack.1.dead.tmp"
    old_tmp.write_bytes(b"x")
    os.utime(old_tmp, (time.time() - 7200, time.time() - 7200))
    live_tmp = vault / "tmp" / ".pack.2.live.tmp"  # a writer's of a moment ago: it may still be alive
    live_tmp.write_bytes(b"y")
    before = _pack_bytes(vault)
    res = ev_json(vault, "gc", "--keep-last", "1")
    assert res["rewritten_packs"] >= 1 and res["removed_packs"] >= 1
    assert not orphan.exists() and not old_tmp.exists() and live_tmp.read_bytes() == b"y"
    live_tmp.unlink()
    assert _pack_bytes(vault) < before - 150_000
    v = _vault(vault)
    assert all(v.has(o) for o in _objects_of(vault, keep))
    assert ev_json(vault, "verify")["ok"]
    assert ev_json(vault, "status", "--venv", venv)["empty"]  # the stat cache was dropped, not trusted
    uv_install(venv, wheelhouse[C.SMALL_02])
    assert ev_json(vault, "restore", keep, "--venv", venv)["verified"]


def _wait_until_blocked_on_lock(proc: subprocess.Popen, lock: Path) -> None:
    """Return once ``proc`` waits for an flock on ``lock``, as the kernel lists it in /proc/locks."""
    ino = str(lock.stat().st_ino)
    while True:
        for line in Path("/proc/locks").read_text().splitlines():
            f = line.split()
            if "->" in f and len(f) > f.index("->") + 5:
                i = f.index("->")
                if f[i + 4] == str(proc.pid) and f[i + 5].rsplit(":", 1)[-1] == ino:
                    return
        assert proc.poll() is None, proc.communicate()  # it ended without ever waiting
        time.sleep(0.01)


def test_gc_waits_for_a_running_snap(tmp_path, make_venv, wheelhouse):
    """A snapshot committed while gc wants to run loses nothing: gc waits for the shared lock."""
    from envvault.snap import take_snapshot

    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    ev_json(vault, "snap", "--no-caches", "--venv", venv)
    uv_install(venv, wheelhouse[C.TORCH_CU128])
    v = _vault(vault)
    with v.lock():  # as a snap holds it
        gc = subprocess.Popen([sys.executable, "-m", "envvault", "gc", "--keep-last", "1", "--json"],
                              env=ev_env(vault), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_until_blocked_on_lock(gc, vault / "locks" / "vault.lock")  # blocked on the lock, not just slow
        new = take_snapshot(v, venv, message="concurrent").id
    out, err = gc.communicate(timeout=120)
    assert gc.returncode == 0, err
    assert json.loads(out)["kept_snapshots"] == 1
    fresh = _vault(vault)
    assert all(fresh.has(o) for o in _objects_of(vault, new))
    assert ev_json(vault, "verify")["ok"]


def test_gc_loop_beside_snaps_never_breaks_a_snapshot(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    ev_json(vault, "snap", "--no-caches", "--venv", venv)
    stop = threading.Event()
    gc_runs = []

    def gc_loop():
        while not stop.is_set() and len(gc_runs) < 40:
            gc_runs.append(ev(vault, "gc", "--keep-last", "1", check=False).returncode)

    t = threading.Thread(target=gc_loop)
    t.start()
    try:
        wheels = [C.SMALL_02, C.SMALL_01, C.TORCH_CU128, C.TORCH_CU130]
        for i in range(6):
            uv_install(venv, wheelhouse[wheels[i % 4]])
            sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
            v = _vault(vault)
            if sid in v.snapshot_ids():
                assert all(v.has(o) for o in _objects_of(vault, sid))
    finally:
        stop.set()
        t.join(timeout=300)
    assert gc_runs and set(gc_runs) == {0}
    assert ev_json(vault, "verify")["ok"]
    assert ev_json(vault, "status", "--venv", venv)["empty"]


# Each kill lands at a named point of gc's own work (envvault/crashpoints.py), never after a sleep. One gc
# after another, each killed further on; the evidence that it was mid-work is what it left behind.
GC_KILLS = [
    ("gc_caches_dropped", lambda v, snaps, packs, idx: snaps == 2 and not list((v / "state").glob("stat-*"))),
    ("gc_snapshot_removed", lambda v, snaps, packs, idx: snaps == 1 and packs == idx == 1),  # not rewritten yet
    ("gc_rewritten", lambda v, snaps, packs, idx: snaps == 1 and packs == idx == 2),  # old pack and its copy
    ("gc_index_removed", lambda v, snaps, packs, idx: snaps == 1 and packs == idx + 1),  # a pack left without index
]


def test_sigkill_at_each_gc_point_loses_nothing(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_CU128], wheelhouse[C.SMALL_01])
    ev_json(vault, "snap", "--no-caches", "--venv", venv)  # one pack: torchlike and smallpkg together
    uv_pip(venv, "uninstall", "torchlike")
    keep = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    objects = _objects_of(vault, keep)
    before = _pack_bytes(vault)
    assert len(list((vault / "packs").rglob("*.pack"))) == 1 and list((vault / "state").glob("stat-*"))
    for point, mid_work in GC_KILLS:
        proc = ev(vault, "gc", "--keep-last", "1", check=False, env=ev_env(vault, ENVVAULT_TEST_CRASH_AT=point))
        assert proc.returncode == -signal.SIGKILL, (point, proc.stderr)
        snaps = len(_vault(vault).snapshot_ids())
        packs = len(list((vault / "packs").rglob("*.pack")))
        idx = len(list((vault / "index").glob("*.idx")))
        assert mid_work(vault, snaps, packs, idx), (point, snaps, packs, idx)
        v = _vault(vault)
        assert keep in v.snapshot_ids() and all(v.has(o) for o in objects), point
        assert ev_json(vault, "verify")["ok"], point
    res = ev_json(vault, "gc", "--keep-last", "1")
    assert res["removed_packs"] >= 1  # the pack the killed gc left without its index
    assert _pack_bytes(vault) < before - 150_000
    assert ev_json(vault, "verify")["ok"]
    assert [s["id"] for s in ev_json(vault, "list", "--all")["snapshots"]] == [keep]
    uv_install(venv, wheelhouse[C.SMALL_02])
    assert ev_json(vault, "restore", keep, "--venv", venv)["verified"]


def test_temp_cleaning_removes_links_themselves_and_never_a_folder(tmp_path):
    """The two cleanings of a vault's temp folder (``clean_tmp``: old files; ``clean_dead_tmp``: the files of
    ended processes) share one loop, and each keeps its promises: a symlink is removed itself, never what it
    points to; a folder is never removed; a file of a live writer (fresh, or another process's) is left."""
    from envvault.vault.state import LocalState

    state = LocalState.in_vault(tmp_path / "v")
    tmp = state.tmp_dir
    tmp.mkdir(parents=True)
    outside = tmp_path / "precious.txt"
    outside.write_bytes(b"keep me")
    old = time.time() - 7200
    link = tmp / ".pack.111.aaaaaaaa.tmp"
    link.symlink_to(outside)
    os.utime(link, (old, old), follow_symlinks=False)
    folder = tmp / ".pack.111.bbbbbbbb.tmp"
    folder.mkdir()
    os.utime(folder, (old, old))
    fresh = tmp / ".pack.222.cccccccc.tmp"
    fresh.write_bytes(b"live")
    state.clean_tmp()
    assert not os.path.lexists(link) and outside.read_bytes() == b"keep me"
    assert folder.is_dir() and fresh.read_bytes() == b"live"

    dead = tmp / ".idx.333.dddddddd.tmp"
    dead.symlink_to(outside)
    mine = tmp / ".idx.444.eeeeeeee.tmp"
    mine.write_bytes(b"other process")
    (tmp / ".idx.333.ffffffff.tmp").mkdir()
    state.clean_dead_tmp([333])
    assert not os.path.lexists(dead) and outside.read_bytes() == b"keep me"
    assert (tmp / ".idx.333.ffffffff.tmp").is_dir() and mine.exists() and fresh.exists()



def test_a_snap_that_waited_for_a_gc_stores_what_that_gc_deleted(tmp_path, make_venv, wheelhouse):
    """A snap loads the environment's stat cache, then waits for the vault lock while a gc drops the snapshot
    that cache names (``--keep-last 0``) and every object of it. The snap used to trust the cache's manifest ids
    and commit a snapshot whose objects were gone (exit 0; verify: DAMAGED). Once it holds the lock it now sees
    that a gc ran (``gc-epoch``), forgets the cache, reads and stores the files again."""
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    first = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    code, out, err = behind_a_gc(vault, ["snap", "--no-caches", "--venv", venv, "--json"])
    assert code == 0, err
    second = json.loads(out)
    assert first not in _vault(vault).snapshot_ids()  # the gc dropped it and its objects
    assert second["new_bytes"] > 0  # the files were stored again, not trusted from the cache
    assert ev_json(vault, "verify")["ok"]
    assert all(_vault(vault).has(o) for o in _objects_of(vault, second["id"]))
    assert ev_json(vault, "status", "--venv", venv)["empty"]


@pytest.mark.parametrize("command", ["tag", "restore", "restore-into", "cache-restore"])
def test_a_command_that_waited_for_a_gc_that_deleted_its_snapshot_says_so(tmp_path, make_venv, wheelhouse, command):
    """A tag, a restore in place, a restore --into and a cache restore chose their snapshot before they waited
    for a gc that deleted it (helper 22): the tag named a deleted snapshot (exit 0; a tag made while gc was
    choosing what to drop was ignored: it took no lock), --into made a bare venv (exit 1), the restores said an
    object was missing (exit 5) while verify said ok. Each now takes the lock, finds the snapshot gone, says so
    (exit 4) and changes nothing."""
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    cache = tmp_path / "inductor"
    for i in range(3):
        (cache / f"c{i}").mkdir(parents=True)
        (cache / f"c{i}" / f"k{i}.py").write_bytes(os.urandom(2000))
    env = ev_env(vault, TORCHINDUCTOR_CACHE_DIR=str(cache))
    if command == "cache-restore":
        sid = ev_json(vault, "cache", "snap", "--venv", venv, "--cache-dir", cache, "--no-discover", env=env)["id"]
    else:
        sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    uv_install(venv, wheelhouse[C.SMALL_02])
    shutil.rmtree(cache / "c1")
    before = sorted(p.name for p in site_packages(venv).iterdir())
    left = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*"))
    new = tmp_path / "copy"
    args = {"tag": ["tag", sid, "keep"], "restore": ["restore", sid, "--venv", venv],
            "restore-into": ["restore", sid, "--into", new],
            "cache-restore": ["cache", "restore", "latest", "--venv", venv, "--to", cache]}[command]
    code, out, err = behind_a_gc(vault, args, env=env)
    assert code == 4, (out, err)
    assert f"snapshot {sid[:12]} is gone: a gc deleted it while this command waited" in err, err
    assert "Traceback" not in err
    assert not (vault / "tags" / "keep").exists()
    assert not new.exists()
    assert sorted(p.name for p in site_packages(venv).iterdir()) == before
    assert sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*")) == left
    assert ev_json(vault, "verify")["ok"]


def test_a_gc_that_fails_after_its_deletions_still_moves_the_epoch_at_its_end(tmp_path, make_venv, wheelhouse,
                                                                              monkeypatch):
    """gc moves ``gc-epoch`` when it starts and once more when its work ends, however it ends: a process that
    read the vault during the gc (after the first move) must see, once it holds the lock, that objects may be
    gone. Here the gc fails after it deleted the snapshot and its pack (its temp cleaning raises)."""
    import pytest as _pytest

    from envvault.vault.gc import collect_garbage

    vault_dir = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    sid = ev_json(vault_dir, "snap", "--no-caches", "--venv", venv)["id"]
    vault = _vault(vault_dir)
    epochs = []
    forget = vault.state.forget_stat_caches

    def first_move(**kwargs):
        forget(**kwargs)
        epochs.append((vault_dir / "state" / "gc-epoch").read_bytes())  # as a reader during the gc sees it

    def fail(*args, **kwargs):
        raise RuntimeError("stopped after the deletions")

    monkeypatch.setattr(vault.state, "forget_stat_caches", first_move)
    monkeypatch.setattr(vault, "clean_tmp", fail)
    with _pytest.raises(RuntimeError):
        collect_garbage(vault, keep_last=0)
    assert sid not in _vault(vault_dir).snapshot_ids()  # the deletions were done
    assert epochs and epochs[0].rstrip().endswith(b"-running")
    end = (vault_dir / "state" / "gc-epoch").read_bytes()
    assert end != epochs[0] and not end.rstrip().endswith(b"-running")


def test_a_gc_killed_part_way_leaves_no_index_read_during_it_to_be_trusted(tmp_path, make_venv, wheelhouse):
    """gc moves ``gc-epoch`` at its start and again when it ends; a gc killed by SIGKILL never makes the second
    move. A process that listed the index while that gc deleted (readers take no lock) then saw, once it held
    the lock, the epoch it had read, kept its list, and committed a snapshot whose objects sat in a pack the gc
    had taken the index from: the next gc deleted that pack, and the snapshot was damaged. The first move now
    writes a running value: seen under the lock, it makes a process list the index again."""
    from envvault.snap import take_snapshot

    vault_dir = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    sid = ev_json(vault_dir, "snap", "--no-caches", "--venv", venv)["id"]
    objects = _objects_of(vault_dir, sid)
    gc = subprocess.Popen([sys.executable, "-m", "envvault", "gc", "--keep-last", "0"],
                          env=ev_env(vault_dir, ENVVAULT_TEST_CRASH_AT="gc_snapshot_removed:1:STOP,gc_index_removed"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _pid, how = os.waitpid(gc.pid, os.WUNTRACED)  # stopped with the snapshot deleted, its pack still indexed
        assert os.WIFSTOPPED(how), how
        reader = _vault(vault_dir)
        assert all(reader.has(o) for o in objects)  # listed during the gc
        os.kill(gc.pid, signal.SIGCONT)
        gc.wait(timeout=120)
        assert gc.returncode == -signal.SIGKILL, gc.stderr  # killed with the index gone, the pack still there
    finally:
        gc.kill()
        gc.wait()
    assert not list((vault_dir / "index").glob("*.idx")) and list((vault_dir / "packs").rglob("*.pack"))
    again = take_snapshot(reader, venv, message="after a killed gc")
    ev(vault_dir, "gc")  # deletes the pack without an index
    assert ev_json(vault_dir, "verify", "--read-data")["ok"] is True
    assert again.id in _vault(vault_dir).snapshot_ids()


def test_after_a_gc_killed_part_way_a_process_lists_the_index_again_once(tmp_path, make_venv, wheelhouse):
    """The running ``gc-epoch`` a killed gc leaves stays until the next gc: a process lists the index again the
    first time it holds the lock under that value, not at every lock (helper 25: a guard with a rollback read
    195 index files in place of 49)."""
    vault_dir = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    ev_json(vault_dir, "snap", "--no-caches", "--venv", venv)
    _vault(vault_dir).state.move_gc_epoch(running=True)  # what a gc killed after its first move leaves
    vault = _vault(vault_dir)
    listed = []
    real_list = vault.backend.list
    vault.backend.list = lambda kind, *a, **kw: (listed.append(kind), real_list(kind, *a, **kw))[1]
    vault.index()
    for _ in range(3):
        with vault.lock():
            vault.index()
    assert listed.count("index") == 2, listed  # before the lock, and once again under it
