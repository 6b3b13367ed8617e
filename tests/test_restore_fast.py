"""Issue 11, the restore half: the materializer's generated files and fresh trees, ``restore --into``
written straight from the vault (no wheels, no uv install; scripts get the new interpreter; RECORD rows as
an installer writes them; the stat cache knows every file, so verification never re-reads), and ``export``
rebuilding wheels in parallel with the same bytes as one at a time."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile

import pytest

from envvault import materialize
from envvault.errors import CorruptError
from envvault.materialize import FileSpec
from envvault.restore.installed import installed_script, shebang
from envvault.model.record import record_sha256
from fixtures import catalogue as C
from fixtures.venvs import pip_install, uv_install
from tests.evtools import ev, ev_json


class _Reader:
    def __init__(self, blobs: dict[str, bytes]):
        self.blobs = blobs
        self.index = {oid: ("pack", i, 0, i, len(b), "b") for i, (oid, b) in enumerate(blobs.items())}

    def get(self, oid: str) -> memoryview:
        return memoryview(self.blobs[oid])

    def locate(self, oid: str, refresh: bool = True) -> tuple | None:
        return self.index.get(oid)


def _sha(data: bytes) -> str:
    return record_sha256(hashlib.sha256(data).digest())


def _tmp(final: str) -> str:
    head, name = os.path.split(final)
    return os.path.join(head, f".{name}.test.tmp")


def test_generated_bytes_are_written_and_checked_like_stored_ones(tmp_path):
    good = b"generated RECORD\n"
    specs = [FileSpec("a", (), len(good), _sha(good), 0o644, data=good),
             FileSpec("b", ("o1",), 3, _sha(b"abc"), 0o644)]
    staged = materialize.stage(_Reader({"o1": b"abc"}), tmp_path, specs, _tmp)
    for s in staged:
        materialize.place(s)
    assert (tmp_path / "a").read_bytes() == good and (tmp_path / "b").read_bytes() == b"abc"
    lying = FileSpec("c", (), len(good), _sha(b"other"), 0o644, data=good)
    with pytest.raises(CorruptError):
        materialize.stage(_Reader({}), tmp_path, [lying], _tmp)
    assert not (tmp_path / ".c.test.tmp").exists() and not (tmp_path / "c").exists()


def test_a_stale_temp_file_is_replaced_never_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    (tmp_path / ".f.test.tmp").symlink_to(outside)  # a killed run's leftover (or a planted link)
    data = b"new bytes"
    staged = materialize.stage(_Reader({"o": data}), tmp_path, [FileSpec("f", ("o",), len(data), _sha(data))], _tmp)
    materialize.place(staged[0])
    assert (tmp_path / "f").read_bytes() == data and outside.read_bytes() == b"keep"


def test_a_fresh_tree_is_written_under_final_names(tmp_path):
    blobs = {f"o{i}": f"file {i}".encode() * 50 for i in range(30)}
    specs = [FileSpec(f"f{i}", (oid,), len(d), _sha(d)) for i, (oid, d) in enumerate(blobs.items())]
    staged = materialize.stage(_Reader(blobs), tmp_path, specs, materialize.FINAL_NAME, workers=3)
    assert sorted(os.listdir(tmp_path)) == sorted(f"f{i}" for i in range(30))
    assert all(s.tmp == s.final for s in staged)


def test_scripts_get_the_new_interpreter_as_installers_write_it():
    launcher = b"#!/old/venv/bin/python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom m import f\n"
    assert installed_script(launcher, "/new/bin/python") == launcher.replace(b"/old/venv/bin/python3", b"/new/bin/python")
    long = "/" + "d" * 130 + "/bin/python"
    out = installed_script(b"#!python\nprint(1)\n", long)
    assert out == shebang(long) + b"print(1)\n" and out.startswith(b"#!/bin/sh\n'''exec' '")
    binary = b"\x7fELF\x02\x01"
    assert installed_script(binary, "/new/bin/python") is binary
    shell = b"#!/bin/sh\necho hi\n"
    assert installed_script(shell, "/new/bin/python") is shell


def _installed(make_venv, wheelhouse):
    """A pip venv (pip's launchers, bytecode rows in RECORD) with a console script, headers and data."""
    venv = make_venv("venv")
    pip_install(venv, *(str(wheelhouse[k]) for k in (C.TORCH_PLAIN_A, C.SERVING, C.WITH_HEADERS)))
    return venv


def _record(venv, name: str) -> dict[str, str]:
    di = next(venv.glob(f"lib/python*/site-packages/{name}-*.dist-info"))
    return {ln.split(",")[0]: ln for ln in (di / "RECORD").read_text().splitlines()}


def test_into_writes_from_the_vault_and_status_needs_no_rereading(tmp_path, make_venv, wheelhouse):
    from envvault.snap.scan import statcache_for
    from envvault.vault.store import Vault

    venv = _installed(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    new = tmp_path / "new"
    res = ev_json(vault, "restore", sid, "--into", new)
    assert res["verified"] is True and res["warnings"] == [], res
    assert not [f for d, _, fs in os.walk(new) for f in fs if ".envvault-" in f]
    # Launchers name the new interpreter, and RECORD lists them with their new bytes.
    launchers = [p for p in (new / "bin").iterdir() if p.is_file() and p.read_bytes().startswith(b"#!")
                 and b"import sys" in p.read_bytes() and "activate" not in p.name]
    assert launchers
    rows = {k: v for name in ("servingpkg", "torchlike") for k, v in _record(new, name).items()}
    for p in launchers:
        head = p.read_bytes().split(b"\n", 1)[0]
        assert head == b"#!" + str(new / "bin" / "python").encode(), head
        row = rows.get(f"../../../bin/{p.name}")
        if row is not None:
            assert row.split(",")[1] == "sha256=" + _sha(p.read_bytes()), row
    assert not [k for k in rows if k.endswith(".pyc")]  # no bytecode rows for bytecode not written
    # Every file written is in the stat cache with the stats it has now: status stats, never re-reads.
    cache = statcache_for(Vault.open(vault), new)
    site_files = [os.path.relpath(os.path.join(d, f), new) for d, _, fs in os.walk(new / "lib") for f in fs
                  if not f.endswith(".pyc")]
    missing = [rel for rel in site_files if rel not in cache.files]
    assert missing == []
    st = ev(vault, "status", "--venv", new, "--exit-code")
    assert st.returncode == 0


def _plant_ghost(vault, venv) -> None:
    """A file entry and a group in the stat cache of ``venv`` that only an earlier venv there could have left."""
    from envvault.snap.scan import statcache_for
    from envvault.vault.store import Vault

    old = statcache_for(Vault.open(vault), venv)
    old.put("lib/ghost/gone.py", os.stat(venv / "pyvenv.cfg"), "x" * 43, None)
    old.set_group("lib/ghost-1.0.dist-info", {"summary": {"name": "ghost"}, "files": [], "stats": []})
    old.touch(list(old.files))
    old.save()
    assert "lib/ghost/gone.py" in statcache_for(Vault.open(vault), venv).files


def test_into_where_an_earlier_venv_was_keeps_nothing_of_its_stat_cache(tmp_path, make_venv, wheelhouse):
    """``--into`` a path where an earlier venv stood (and was removed): the new venv's stat cache starts
    empty, so none of the earlier venv's file entries or groups survive its save; the verification takes the
    cache from memory (it is read from disk by nobody) and the new venv is verified and unchanged."""
    import shutil

    from envvault.snap.scan import statcache_for
    from envvault.vault.store import Vault

    venv = _installed(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    new = tmp_path / "new"
    assert ev_json(vault, "restore", sid, "--into", new)["verified"] is True
    _plant_ghost(vault, new)
    shutil.rmtree(new)
    res = ev_json(vault, "restore", sid, "--into", new)
    assert res["verified"] is True and res["warnings"] == [], res
    cache = statcache_for(Vault.open(vault), new)
    assert "lib/ghost/gone.py" not in cache.files and "lib/ghost-1.0.dist-info" not in cache.groups
    site_files = [os.path.relpath(os.path.join(d, f), new) for d, _, fs in os.walk(new / "lib") for f in fs
                  if not f.endswith(".pyc")]
    assert [rel for rel in site_files if rel not in cache.files] == []
    assert any(k.endswith(".dist-info") for k in cache.groups)  # the verification's groups were saved
    assert ev(vault, "status", "--venv", new, "--exit-code").returncode == 0


def test_into_of_a_lock_only_snapshot_where_an_earlier_venv_was_keeps_nothing_of_its_stat_cache(
        tmp_path, make_venv, wheelhouse):
    """The same from a lock-only snapshot (its packages installed from the vault's wheels, nothing staged by
    the materializer): the new venv's stat cache starts empty too."""
    import shutil

    from envvault.snap.scan import statcache_for
    from envvault.vault.store import Vault

    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_PLAIN_B], wheelhouse[C.SMALL_02])
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--no-caches", "--venv", venv)
    lock = ev_json(vault, "snap", "--no-caches", "--venv", venv, "--lock-only")["id"]
    new = tmp_path / "from-lock"
    assert ev_json(vault, "restore", lock, "--into", new)["verified"] is True
    _plant_ghost(vault, new)
    shutil.rmtree(new)
    assert ev_json(vault, "restore", lock, "--into", new)["verified"] is True
    cache = statcache_for(Vault.open(vault), new)
    assert "lib/ghost/gone.py" not in cache.files and "lib/ghost-1.0.dist-info" not in cache.groups
    assert ev(vault, "status", "--venv", new, "--exit-code").returncode == 0


def test_export_in_parallel_writes_the_bytes_of_one_at_a_time(tmp_path, make_venv, wheelhouse, monkeypatch):
    from pathlib import Path

    from envvault.lock import export
    from envvault.vault.store import Vault

    venv = _installed(make_venv, wheelhouse)
    vault_path = tmp_path / "vault"
    sid = ev_json(vault_path, "snap", "--no-caches", "--venv", venv)["id"]
    vault = Vault.open(vault_path)
    export.export_snapshot(vault, sid, Path(tmp_path / "a" / "pylock.toml"))
    monkeypatch.setattr("envvault.materialize.WORKERS", 1)
    export.export_snapshot(vault, sid, Path(tmp_path / "b" / "pylock.toml"))
    a = sorted((tmp_path / "a" / "pylock.wheels").iterdir())
    b = sorted((tmp_path / "b" / "pylock.wheels").iterdir())
    assert [p.name for p in a] == [p.name for p in b] and len(a) >= 2
    for x, y in zip(a, b):
        assert x.read_bytes() == y.read_bytes(), x.name
        with zipfile.ZipFile(x) as zf:  # each member's RECORD hash is its bytes'
            record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
            for line in zf.read(record).decode().splitlines():
                path, digest, _size = line.rsplit(",", 2)
                if digest:
                    assert digest == "sha256=" + _sha(zf.read(path)), path
    assert json.dumps(sorted(p.name for p in a))


def test_a_file_an_untouched_distribution_lists_survives_the_removal_of_another(tmp_path, make_venv):
    """The planner reads an untouched distribution's RECORD only when a removal could hit one of its files
    (restore/current.py defers it): a file two distributions list stays when the one leaving goes."""
    from fixtures.venvs import site_packages, uv_install
    from fixtures.wheels import build_wheel

    shared = b"SHARED = 1\n"
    a = build_wheel(tmp_path / "w", "sharea", "1.0", {"common/shared.py": shared, "common/a.py": b"A = 1\n"})
    b = build_wheel(tmp_path / "w", "shareb", "1.0", {"common/shared.py": shared, "common/b.py": b"B = 1\n"})
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, a)
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    uv_install(venv, b)
    res = ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")
    assert res["verified"] is True and res["plan"]["remove"] == ["shareb 1.0"], res
    sp = site_packages(venv)
    assert (sp / "common" / "shared.py").read_bytes() == shared and (sp / "common" / "a.py").exists()
    assert not (sp / "common" / "b.py").exists()


def test_in_place_loads_the_stat_cache_once_and_verification_still_sees_tampering(tmp_path, make_venv, wheelhouse,
                                                                                   monkeypatch):
    """A restore in place loads the target's stat cache once and saves it once; the files it wrote are in it
    with their stats after the rename (the verify scan compares them by lstat, never re-reads them); a file
    changed behind the restore's back (one it did not write, or one it wrote, after writing) fails the
    verification all the same."""
    import shutil

    from envvault.restore import inplace
    from envvault.restore.dispatch import restore_snapshot
    from envvault.snap.scan import statcache_for
    from envvault.vault import statcache
    from envvault.vault.statcache import stat_key
    from envvault.vault.store import Vault
    from fixtures.venvs import site_packages

    venv = _installed(make_venv, wheelhouse)
    vault_path = tmp_path / "vault"
    sid = ev_json(vault_path, "snap", "--no-caches", "--venv", venv)["id"]
    ev(vault_path, "status", "--venv", venv)  # warm: every group has its manifest
    sp = site_packages(venv)
    mine = [k for k in _record(venv, "torchlike") if "/" in k and not k.startswith(("..", "torchlike-"))
            and not k.endswith(".pyc")]
    top = sorted({k.split("/")[0] for k in mine})
    other = next(sp / k for k in _record(venv, "servingpkg")
                 if k.endswith(".py") and not k.startswith("..") and "/" in k)

    loads, saves = [], []
    real_init, real_save = statcache.StatCache.__init__, statcache.StatCache.save

    def counting_init(self, path, **kw):
        loads.append(path.name)
        real_init(self, path, **kw)

    def counting_save(self):
        saves.append(self.groups_path.name)
        real_save(self)

    monkeypatch.setattr(statcache.StatCache, "__init__", counting_init)
    monkeypatch.setattr(statcache.StatCache, "save", counting_save)

    def clean_restore():
        for d in top:
            shutil.rmtree(sp / d)
        loads.clear()
        saves.clear()
        return restore_snapshot(Vault.open(vault_path), sid, venv, backup=False, caches=False)

    res = clean_restore()
    assert res.verified is True and res.written_files >= len(mine), res
    assert len([n for n in loads if n.startswith("stat-") and not n.startswith("stat-caches")]) == 1, loads
    assert len([n for n in saves if n.startswith("stat-") and not n.startswith("stat-caches")]) == 1, saves
    cache = statcache_for(Vault.open(vault_path), venv)
    for rel in mine:
        key = os.path.relpath(sp / rel, venv)
        assert cache.files[key][0] == stat_key(os.lstat(sp / rel)), rel

    real_populate = inplace.populate_statcache

    def tamper_after_writing(vault, target, staged, cache=None):
        real_populate(vault, target, staged, cache)
        for path in victims:
            data = bytearray(path.read_bytes())
            data[0] ^= 0x01  # same size, same mtime: only the bytes (and ctime) differ
            st = path.stat()
            path.write_bytes(bytes(data))
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    monkeypatch.setattr(inplace, "populate_statcache", tamper_after_writing)
    victims = [other]  # a file of a distribution the restore did not touch
    res = clean_restore()
    assert res.verified is False and "servingpkg" in json.dumps(res.remaining), res
    victims = [sp / mine[0]]  # a file the restore has just written (and recorded in the stat cache)
    res = clean_restore()
    assert res.verified is False and "torchlike" in json.dumps(res.remaining), res
    monkeypatch.setattr(inplace, "populate_statcache", real_populate)
    res = clean_restore()
    assert res.verified is True, res


def test_the_verify_scan_compares_what_the_restore_wrote_by_lstat_and_still_sees_damage(tmp_path, make_venv, wheelhouse,
                                                                                        monkeypatch):
    """After an in-place restore, a distribution it wrote whole is verified from the stat cache group the
    restore recorded for it (``apply.remember_written``): the verify scan builds no manifest for it, the next
    status is answered unchanged, and a snap after it names the snapshot's own manifest. A file changed or
    chmod-ed after the restore recorded it, and a file whose mode the commit left different from the
    manifest's (the group is then not recorded), still fail the verification."""
    import shutil

    from envvault.restore import apply, inplace
    from envvault.restore.dispatch import restore_snapshot
    from envvault.snap import manifests
    from envvault.vault.store import Vault
    from fixtures.venvs import site_packages

    venv = _installed(make_venv, wheelhouse)
    vault_path = tmp_path / "vault"
    sid = ev_json(vault_path, "snap", "--no-caches", "--venv", venv)["id"]
    sp = site_packages(venv)
    mine = [k for k in _record(venv, "torchlike") if "/" in k and not k.startswith(("..", "torchlike-"))
            and not k.endswith(".pyc")]
    top = sorted({k.split("/")[0] for k in mine})
    victim = sp / next(k for k in mine if k.endswith(".py"))

    built = []
    real_finish = manifests.ManifestBuilder.finish

    def counting_finish(self, plan):
        built.append(plan.dist.name)
        return real_finish(self, plan)

    monkeypatch.setattr(manifests.ManifestBuilder, "finish", counting_finish)

    def clean_restore():
        for d in top:
            shutil.rmtree(sp / d)
        built.clear()
        return restore_snapshot(Vault.open(vault_path), sid, venv, backup=False, caches=False)

    res = clean_restore()
    assert res.verified is True, res
    assert built == ["torchlike"], built  # the scan before the restore only: the verify scan built nothing
    assert ev(vault_path, "status", "--venv", venv, "--exit-code").returncode == 0
    again = ev_json(vault_path, "snap", "--no-caches", "--venv", venv)
    manifest_of = {sid: {}, again["id"]: {}}
    for snap_id, names in manifest_of.items():
        names.update((p.name, p.manifest) for p in Vault.open(vault_path).load_snapshot(snap_id).snapshot.packages)
    assert manifest_of[again["id"]]["torchlike"] == manifest_of[sid]["torchlike"], manifest_of

    real_remember = inplace.remember_written

    def damage_after_recording(cache, target, installed, packages):
        done = real_remember(cache, target, installed, packages)
        assert done, "the restore recorded no group"
        damage(victim)
        return done

    monkeypatch.setattr(inplace, "remember_written", damage_after_recording)
    for damage in (lambda p: p.write_bytes(p.read_bytes() + b"# edited\n"), lambda p: p.chmod(0o755)):
        res = clean_restore()
        assert res.verified is False and "torchlike" in json.dumps(res.remaining), res
    monkeypatch.setattr(inplace, "remember_written", real_remember)

    real_commit = inplace.commit_plan

    def commit_then_chmod(*args, **kw):
        out = real_commit(*args, **kw)
        victim.chmod(0o755)  # before the stat cache learns the file's stats: only the mode tells
        return out

    recorded = []
    monkeypatch.setattr(inplace, "commit_plan", commit_then_chmod)
    monkeypatch.setattr(inplace, "remember_written",
                        lambda *a: recorded.extend(real_remember(*a)) or recorded)
    res = clean_restore()
    assert recorded == [] and built == ["torchlike", "torchlike"], (recorded, built)
    assert res.verified is False and "torchlike" in json.dumps(res.remaining), res
    monkeypatch.undo()
    res = clean_restore()
    assert res.verified is True, res
    assert apply.remember_written is real_remember


def test_a_distribution_whose_dist_info_is_not_all_in_record_is_verified_by_a_rebuild(tmp_path, make_venv, wheelhouse,
                                                                                         monkeypatch):
    """A RECORD that does not list REQUESTED (the file there all the same): the restore cannot vouch for the
    fields a rebuild reads from such a file, so it records no group for that distribution and the verify scan
    builds it from disk; one that lists every dist-info file is still taken from the group."""
    import shutil

    from envvault.restore import inplace
    from envvault.restore.dispatch import restore_snapshot
    from envvault.snap import manifests
    from envvault.vault.store import Vault
    from fixtures.venvs import site_packages

    venv = _installed(make_venv, wheelhouse)
    sp = site_packages(venv)
    di = next(sp.glob("torchlike-*.dist-info"))
    assert (di / "REQUESTED").exists()
    record = di / "RECORD"
    record.write_text("".join(ln for ln in record.read_text().splitlines(keepends=True)
                              if not ln.startswith(f"{di.name}/REQUESTED,")))
    vault_path = tmp_path / "vault"
    sid = ev_json(vault_path, "snap", "--no-caches", "--venv", venv)["id"]
    top = sorted({k.split("/")[0] for k in _record(venv, "torchlike") if "/" in k
                  and not k.startswith(("..", "torchlike-")) and not k.endswith(".pyc")})
    other = next(sp.glob("servingpkg-*.dist-info"))
    built, recorded = [], []
    real_finish, real_remember = manifests.ManifestBuilder.finish, inplace.remember_written
    monkeypatch.setattr(manifests.ManifestBuilder, "finish", lambda self, plan: built.append(plan.dist.name)
                        or real_finish(self, plan))
    monkeypatch.setattr(inplace, "remember_written", lambda *a: recorded.extend(real_remember(*a)) or recorded)
    for d in top:
        shutil.rmtree(sp / d)
    shutil.rmtree(sp / "servingpkg")
    res = restore_snapshot(Vault.open(vault_path), sid, venv, backup=False, caches=False)
    assert res.verified is True, res
    assert sorted(built) == ["servingpkg", "torchlike", "torchlike"], built  # servingpkg: from its group
    by_id = {p.manifest: p.name for p in Vault.open(vault_path).load_snapshot(sid).snapshot.packages}
    assert sorted(by_id[m] for m in recorded) == ["servingpkg"], recorded
    assert (other / "REQUESTED").exists() and ev(vault_path, "status", "--venv", venv, "--exit-code").returncode == 0


def test_a_record_row_naming_a_folder_keeps_the_verify_scan_honest(tmp_path, make_venv, wheelhouse):
    """A RECORD row naming a folder (virtualenv's seeder writes such rows): the manifest has no entry for it and
    an in-place restore does not make it again, so the restore records no group for that distribution and its
    verify scan, rebuilding it from RECORD, says the folder is gone, as status does after it."""
    import shutil

    from fixtures.venvs import site_packages

    venv = _installed(make_venv, wheelhouse)
    sp = site_packages(venv)
    (sp / "servingpkg" / "emptydir").mkdir()
    record = next(sp.glob("servingpkg-*.dist-info")) / "RECORD"
    record.write_text(record.read_text() + "servingpkg/emptydir,,\n")
    vault_path = tmp_path / "vault"
    sid = ev_json(vault_path, "snap", "--no-caches", "--venv", venv)["id"]
    shutil.rmtree(sp / "servingpkg")
    res = ev_json(vault_path, "restore", sid, "--venv", venv, "--no-backup", check=False)
    assert res["verified"] is False and "servingpkg/emptydir" in json.dumps(res["remaining"]), res
    status = ev(vault_path, "status", "--venv", venv, "--exit-code", check=False)
    assert status.returncode == 1 and "emptydir" in status.stdout, status.stdout


def test_a_record_that_lists_a_file_twice_restores_in_place(tmp_path, make_venv, wheelhouse):
    """A RECORD naming one file twice (a real tool's slip; pip's RECORD reader takes it): the snapshot lists it
    twice, and an in-place restore writes it once (it failed at its commit: the second rename found its temp
    file gone), verified, byte for byte; status then finds nothing changed."""
    from fixtures.venvs import site_packages

    venv = _installed(make_venv, wheelhouse)
    sp = site_packages(venv)
    record = next(sp.glob("servingpkg-*.dist-info")) / "RECORD"
    row = next(ln for ln in record.read_text().splitlines() if ln.split(",")[0].endswith(".py")
               and not ln.startswith(".."))
    record.write_text(record.read_text() + row + "\n")
    victim = sp / row.split(",")[0]
    before = victim.read_bytes()
    vault_path = tmp_path / "vault"
    sid = ev_json(vault_path, "snap", "--no-caches", "--venv", venv)["id"]
    victim.unlink()
    res = ev_json(vault_path, "restore", sid, "--venv", venv, "--no-backup")
    assert res["verified"] is True, res
    assert victim.read_bytes() == before
    assert ev(vault_path, "status", "--venv", venv, "--exit-code").returncode == 0


def _target_cache_io(monkeypatch):
    """Count the loads and saves of a target's stat cache (``stat-<key>``, not the caches' own)."""
    from envvault.vault import statcache

    loads, saves = [], []
    real_init, real_save = statcache.StatCache.__init__, statcache.StatCache.save

    def counting_init(self, path, **kw):
        if path.name.startswith("stat-") and not path.name.startswith("stat-caches"):
            loads.append(path.name)
        real_init(self, path, **kw)

    def counting_save(self):
        if self.groups_path.name.startswith("stat-") and not self.groups_path.name.startswith("stat-caches"):
            saves.append(self.groups_path.name)
        real_save(self)

    monkeypatch.setattr(statcache.StatCache, "__init__", counting_init)
    monkeypatch.setattr(statcache.StatCache, "save", counting_save)
    return loads, saves


def _cache_ids_stored(vault_path, venv) -> tuple[int, list[str]]:
    """How many manifest ids the target's saved stat cache names, and those the vault does not hold."""
    from envvault.snap.scan import statcache_for
    from envvault.vault.store import Vault

    vault = Vault.open(vault_path)
    cache = statcache_for(vault, venv)
    ids = [g[k] for g in cache.groups.values() for k in ("manifest_full", "manifest_lock") if g.get(k)]
    return len(ids), [i for i in ids if not vault.has(i)]


def test_backup_shares_the_restores_stat_cache_and_saves_it_once(tmp_path, make_venv, wheelhouse, monkeypatch):
    """With the default backup, the backup snap and the restore use one stat cache: loaded once, saved once,
    after the backup committed; every id it names is in the vault, and, as after any snap, the file entries
    this run did not use (a file gone since) are dropped."""
    from envvault.restore.dispatch import restore_snapshot
    from envvault.snap.scan import statcache_for
    from envvault.vault.store import Vault

    venv = _installed(make_venv, wheelhouse)
    vault_path = tmp_path / "vault"
    sid = ev_json(vault_path, "snap", "--no-caches", "--venv", venv)["id"]
    uv_install(venv, "--reinstall-package", "torchlike", wheelhouse[C.TORCH_PLAIN_B])
    ghost = "lib/ghost.py"  # an entry for a file that no longer exists
    cache = statcache_for(Vault.open(vault_path), venv)
    cache.put(ghost, os.lstat(venv / "pyvenv.cfg"), "x" * 43, None)
    cache.save()
    assert ghost in statcache_for(Vault.open(vault_path), venv).files
    loads, saves = _target_cache_io(monkeypatch)
    snapshots = []
    real_save = type(cache).save

    def save_seeing_snapshots(self):
        snapshots.append(len(os.listdir(vault_path / "snapshots")))
        real_save(self)

    monkeypatch.setattr(type(cache), "save", save_seeing_snapshots)
    res = restore_snapshot(Vault.open(vault_path), sid, venv, backup=True, caches=False)
    assert res.verified is True and res.backup, res
    assert len(loads) == 1 and len(saves) == 1 and snapshots == [2], (loads, saves, snapshots)
    monkeypatch.undo()
    named, missing = _cache_ids_stored(vault_path, venv)
    assert named > 0 and missing == []
    assert ghost not in statcache_for(Vault.open(vault_path), venv).files
    back = ev_json(vault_path, "restore", res.backup, "--venv", venv, "--no-backup")
    assert back["verified"] is True
    assert ev_json(vault_path, "status", "--venv", venv)["snapshot"] == res.backup


def test_a_backup_that_fails_before_its_commit_saves_no_stat_cache(tmp_path, make_venv, wheelhouse, monkeypatch):
    """A backup snap that fails after scanning (its new manifests queued, never committed) ends the restore
    with nothing changed and leaves the saved stat cache as it was: no group names a manifest the vault
    lacks (a later snap trusts those ids without the index)."""
    from envvault.errors import EnvvaultError
    from envvault.restore.dispatch import restore_snapshot
    from envvault.vault.store import Vault
    from envvault.vault.transaction import SnapshotTransaction

    venv = _installed(make_venv, wheelhouse)
    vault_path = tmp_path / "vault"
    sid = ev_json(vault_path, "snap", "--no-caches", "--venv", venv)["id"]
    uv_install(venv, "--reinstall-package", "torchlike", wheelhouse[C.TORCH_PLAIN_B])
    swapped = next(venv.glob("lib/python*/site-packages/torchlike/_C.so")).read_bytes()
    before = sorted(p.name for p in (vault_path / "state").iterdir())
    cache_before = {p.name: p.read_bytes() for p in (vault_path / "state").iterdir() if p.name.startswith("stat-")}

    def disk_full(self):
        raise EnvvaultError("no space left on device (injected)")

    monkeypatch.setattr(SnapshotTransaction, "flush", disk_full)
    with pytest.raises(EnvvaultError, match="injected"):
        restore_snapshot(Vault.open(vault_path), sid, venv, backup=True, caches=False)
    monkeypatch.undo()
    assert next(venv.glob("lib/python*/site-packages/torchlike/_C.so")).read_bytes() == swapped
    assert sorted(p.name for p in (vault_path / "state").iterdir()) == before
    assert {p.name: p.read_bytes() for p in (vault_path / "state").iterdir()
            if p.name.startswith("stat-")} == cache_before
    named, missing = _cache_ids_stored(vault_path, venv)
    assert named > 0 and missing == []
    res = ev_json(vault_path, "restore", sid, "--venv", venv)
    assert res["verified"] is True and res["backup"]


def test_a_manifest_file_without_a_mode_that_is_not_bytecode_keeps_its_distribution_out_of_the_groups(tmp_path):
    """``_as_recorded`` (the restore's check before it records a distribution's group): a file on disk as its
    entry and the stat cache record it passes; the same file in an entry without a mode (only bytecode has
    none in a manifest envvault writes; a crafted vault may say so of any file) fails, since a group leaves such
    entries out and a later edit of that file would never be seen; bytecode without a mode passes."""
    from types import SimpleNamespace

    from envvault.model.manifest import FileEntry
    from envvault.restore.apply import _as_recorded
    from envvault.vault.statcache import stat_key

    root = tmp_path / "env"
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    mod = root / "pkg" / "mod.py"
    mod.write_bytes(b"x = 1\n")
    mod.chmod(0o644)
    (root / "pkg" / "__pycache__" / "mod.cpython-312.pyc").write_bytes(b"\0" * 16)
    sha = record_sha256(b"x = 1\n")
    cache = SimpleNamespace(files={"pkg/mod.py": (stat_key(os.lstat(mod)), sha)})
    base = f"{root}/"
    pyc = FileEntry(path="pkg/__pycache__/mod.cpython-312.pyc", record="pkg/__pycache__/mod.cpython-312.pyc")
    with_mode = FileEntry(path="pkg/mod.py", record="pkg/mod.py", sha256=sha, size=6, mode=0o644)
    no_mode = FileEntry(path="pkg/mod.py", record="pkg/mod.py", sha256=sha, size=6)
    assert _as_recorded(cache, base, SimpleNamespace(files=[with_mode, pyc]))
    assert not _as_recorded(cache, base, SimpleNamespace(files=[no_mode, pyc]))
