"""restore and status on real venvs: the swap, in-place patches, offline restores, SIGKILL at any point,
hostile vaults, --into, lock-only snapshots, and real torch 2.13.0+cpu."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures import catalogue as C
from fixtures import build_wheel, pip, pip_install, python_of, serve_index, site_packages, uv_install, uv_pip
from fixtures.machine import cpython
from fixtures.trees import forge_snapshot, temp_files, tree_state
from tests.evtools import assert_one_line_error, behind_a_gc, ev, ev_env, ev_json

SP = "lib/python3.{}/site-packages"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _vault(path: Path):
    from envvault.vault.store import Vault

    return Vault.open(path)


def assert_matches_snapshot(vault_path: Path, sid: str, venv: Path) -> None:
    """Every file of the snapshot is on disk with the snapshot's bytes; files it lacked are absent."""
    vault = _vault(vault_path)
    doc = vault.load_snapshot(vault.resolve(sid)).doc
    for p in doc["packages"]:
        man = vault.get_json(p["manifest"])
        for f in man["files"]:
            full = venv / f["path"]
            if f["state"] == "missing":
                assert not full.exists(), f["path"]
            elif "link" in f:
                assert os.readlink(full) == f["link"]
            elif f.get("chunks") is not None:
                assert full.is_file(), f["path"]
                assert _b64(full.read_bytes()) == f["sha256"], f["path"]


def _files_of(vault_path: Path, sid: str, name: str) -> dict[str, str]:
    vault = _vault(vault_path)
    doc = vault.load_snapshot(vault.resolve(sid)).doc
    p = next(p for p in doc["packages"] if p["name"] == name)
    return {f["path"]: f.get("sha256") for f in vault.get_json(p["manifest"])["files"]}


def _mtimes(venv: Path, paths) -> dict[str, int]:
    return {p: os.lstat(venv / p).st_mtime_ns for p in paths}


def _base_venv(make_venv, wheelhouse, installer=uv_install, kind="uv") -> Path:
    venv = make_venv(kind)
    keys = (C.TORCH_CU128, C.SMALL_01, C.NS_ALPHA, C.NS_BETA)
    with serve_index([wheelhouse[k] for k in keys]) as url:
        installer(venv, "torchlike==2.11.0+cu128", "smallpkg==0.1.0", "nsa-alpha", "nsa-beta", index_url=url)
    return venv


def _swap(venv: Path, wheelhouse) -> None:
    """servingpkg pulls torchlike 2.11.0 of another build (the PyPI-like cu130 one) over the cu128 one."""
    with serve_index([wheelhouse[C.SERVING], wheelhouse[C.TORCH_PLAIN_B]]) as url:
        uv_install(venv, "--reinstall", "servingpkg", index_url=url)


def _run(*cmd, **kw) -> str:
    out = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=ev_env(Path("/nonexistent")), **kw)
    assert out.returncode == 0, out
    return out.stdout


# -- the swap ----------------------------------------------------------------------------------------


def test_swap_is_diffed_and_restored_byte_for_byte(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = _base_venv(make_venv, wheelhouse)
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv, "-m", "good")["id"]
    sp = site_packages(venv).relative_to(venv).as_posix()
    untouched = [f for f in tree_state(venv) if f.startswith((f"{sp}/smallpkg", f"{sp}/sharedns", f"{sp}/nsa_"))]
    before_untouched = {k: v for k, v in tree_state(venv).items() if k in untouched}
    _swap(venv, wheelhouse)
    assert "cuda 13.0" in _run(venv / "bin" / "torchlike-info")

    d = ev_json(vault, "diff", sid, "current", "--venv", venv)
    assert d["packages"]["added"] == [{"name": "servingpkg", "version": "1.0.0", "build_id": d["packages"]["added"][0]["build_id"]}]
    (torch,) = d["packages"]["changed"]
    assert torch["name"] == "torchlike" and torch["old_version"] == "2.11.0+cu128" and torch["new_version"] == "2.11.0"
    assert torch["build_changed"] is True and torch["build_facts"]["cuda"] == ["12.8", "13.0"]
    text = ev(vault, "diff", sid, "current", "--venv", venv).stdout
    assert "torchlike 2.11.0+cu128 -> 2.11.0 (local label): cuda 12.8 -> 13.0" in text
    assert "\x1b[" not in text  # no colour when stdout is not a TTY
    assert ev(vault, "diff", sid, "current", "--venv", venv, "--exit-code", check=False).returncode == 1
    st = ev_json(vault, "status", "--venv", venv)
    assert st["snapshot"] == sid and not st["empty"] and st["packages"]["added"][0]["name"] == "servingpkg"

    dry = ev_json(vault, "restore", sid, "--venv", venv, "--dry-run")
    assert dry["dry_run"] and dry["plan"]["remove"] == ["servingpkg 1.0.0"] and dry["plan"]["install"] == ["torchlike 2.11.0+cu128"]
    assert (venv / "bin" / "serve").exists()  # dry run changed nothing

    res = ev_json(vault, "restore", sid, "--venv", venv)
    assert res["restored"] == sid and res["verified"] is True and res["changed"] == 2 and res["backup"]
    assert_matches_snapshot(vault, sid, venv)
    assert "torchlike 2.11.0+cu128 cuda 12.8" in _run(venv / "bin" / "torchlike-info")
    assert not (venv / "bin" / "serve").exists() and not list(site_packages(venv).glob("servingpkg*"))
    assert not list(site_packages(venv).glob("torchlike-2.11.0.dist-info"))
    assert {k: v for k, v in tree_state(venv).items() if k in untouched} == before_untouched  # mtimes too
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True
    assert not temp_files(venv) and not (venv / ".envvault-restore.json").exists()

    # the backup undoes the restore
    undo = ev_json(vault, "restore", res["backup"], "--venv", venv)
    assert undo["verified"] and "serving with torchlike 2.11.0+cu130 cuda 13.0" in _run(venv / "bin" / "serve")
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True


def test_same_version_other_build(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_PLAIN_A])
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    so = site_packages(venv) / "torchlike" / "_C.so"
    good = so.read_bytes()
    uv_install(venv, "--reinstall-package", "torchlike", wheelhouse[C.TORCH_PLAIN_B])
    assert so.read_bytes() != good
    (ch,) = ev_json(vault, "diff", sid, "current", "--venv", venv)["packages"]["changed"]
    assert ch["kind"] == "build" and ch["old_version"] == ch["new_version"] == "2.11.0" and ch["build_changed"]
    text = ev(vault, "status", "--venv", venv).stdout
    assert "torchlike 2.11.0: cuda 12.8 -> 13.0" in text, text
    res = ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")
    assert res["verified"] and res["backup"] is None
    assert so.read_bytes() == good
    assert_matches_snapshot(vault, sid, venv)


# -- in-place edits ------------------------------------------------------------------------------------


def test_in_place_patch_shown_and_undone(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("venv")  # pip installs: RECORD lists .pyc files, which are never stored
    pip_install(venv, str(wheelhouse[C.TORCH_CU128]), str(wheelhouse[C.SMALL_01]))
    py = python_of(venv)
    _run(py, "-c", "import torchlike, smallpkg")
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True  # .pyc in RECORD are not "missing"
    init = site_packages(venv) / "torchlike" / "__init__.py"
    original = init.read_bytes()
    init.write_bytes(original + b"is_fx_symbolic_tracing = lambda: False\n")
    _run(py, "-c", "import torchlike; assert torchlike.is_fx_symbolic_tracing() is False")  # compiles the patch
    others = [p for p in tree_state(venv) if "smallpkg" in p]
    before = {p: v for p, v in tree_state(venv).items() if p in others}

    st = ev_json(vault, "status", "--venv", venv)
    (ch,) = st["packages"]["changed"]
    rel = init.relative_to(venv).as_posix()
    assert ch["kind"] == "edited" and ch["modified_files"] == [rel] and not ch["build_changed"]
    assert rel in ev(vault, "status", "--venv", venv).stdout
    res = ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")
    assert res["verified"] and res["written_files"] == 1 and res["removed_files"] == 0
    assert init.read_bytes() == original
    _run(py, "-c", "import torchlike; assert not hasattr(torchlike, 'is_fx_symbolic_tracing')")
    assert {p: v for p, v in tree_state(venv).items() if p in others} == before
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True


def test_deleted_file_and_upgrade(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01], wheelhouse[C.WITH_HEADERS])
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    uv_install(venv, wheelhouse[C.SMALL_02])
    header = next(venv.glob("include/site/python3.*/withheaders/withheaders.h"))
    header.unlink()
    st = ev_json(vault, "status", "--venv", venv)
    kinds = {c["name"]: c for c in st["packages"]["changed"]}
    assert kinds["smallpkg"]["kind"] == "upgrade"
    assert kinds["withheaders"]["missing_files"] == [header.relative_to(venv).as_posix()]
    res = ev_json(vault, "restore", sid, "--venv", venv)
    assert res["verified"]
    assert header.exists() and not (site_packages(venv) / "smallpkg" / "new.py").exists()
    assert (site_packages(venv) / "smallpkg" / "old.py").exists()
    assert_matches_snapshot(vault, sid, venv)


# -- offline -------------------------------------------------------------------------------------------


def test_restore_after_index_and_cache_are_gone(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    cache = tmp_path / "uv-cache"
    own = tmp_path / "own-wheels"
    own.mkdir()
    wheels = [Path(shutil.copy(wheelhouse[k], own)) for k in (C.TORCH_CU128, C.SMALL_01)]
    venv = make_venv("uv")
    with serve_index(wheels) as url:
        uv_install(venv, "torchlike==2.11.0+cu128", "smallpkg==0.1.0", index_url=url, cache_dir=cache)
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    uv_pip(venv, "uninstall", "torchlike")
    uv_install(venv, wheelhouse[C.SMALL_02])
    shutil.rmtree(own)  # the index's wheels are gone...
    shutil.rmtree(cache)  # ...and so is uv's cache
    env = ev_env(vault, UV_OFFLINE="1", PIP_NO_INDEX="1", http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9")
    res = json.loads(ev(vault, "restore", sid, "--venv", venv, "--json", env=env).stdout)
    assert res["verified"]
    assert_matches_snapshot(vault, sid, venv)
    assert "cuda 12.8" in _run(venv / "bin" / "torchlike-info")
    # a fresh venv, offline too
    new = tmp_path / "copy"
    res = json.loads(ev(vault, "restore", sid, "--into", new, "--json", env=env).stdout)
    assert res["verified"] and "cuda 12.8" in _run(new / "bin" / "torchlike-info")


# -- crash safety --------------------------------------------------------------------------------------


def _swap_setup(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = _base_venv(make_venv, wheelhouse)
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    _swap(venv, wheelhouse)
    (site_packages(venv) / "sharedns" / "alpha" / "__init__.py").write_text("edited = True\n")
    after_swap = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    return vault, venv, sid, after_swap


def _known_contents(vault: Path, *sids: str) -> dict[str, set]:
    v = _vault(vault)
    known: dict[str, set] = {}
    for sid in sids:
        for p in v.load_snapshot(sid).doc["packages"]:
            for f in v.get_json(p["manifest"])["files"]:
                if f.get("sha256"):
                    known.setdefault(f["path"], set()).add(f["sha256"])
    return known


def _assert_no_torn_files(venv: Path, known: dict[str, set]) -> None:
    """Every file under a final name holds one of the versions a snapshot recorded: none is half-written."""
    for rel, sums in known.items():
        full = venv / rel
        if full.is_file() and not full.is_symlink() and "/__pycache__/" not in rel:
            assert _b64(full.read_bytes()) in sums, rel


@pytest.mark.parametrize("point", ["journal", "stage:3", "staged", "commit:1", "commit:12", "remove_dir", "committed", "verified"])
def test_sigkill_at_named_points_then_rerun_completes(tmp_path, make_venv, wheelhouse, point):
    vault, venv, sid, after = _swap_setup(tmp_path, make_venv, wheelhouse)
    known = _known_contents(vault, sid, after)
    proc = ev(vault, "restore", sid, "--venv", venv, "--json", check=False,
              env=ev_env(vault, ENVVAULT_TEST_CRASH_AT=point))
    assert proc.returncode == -signal.SIGKILL, proc
    _assert_no_torn_files(venv, known)
    if point not in ("verified",):
        assert (venv / ".envvault-restore.json").exists()
        status = ev(vault, "status", "--venv", venv, check=False)
        assert f"a restore of {sid[:12]} onto {venv} was interrupted" in status.stderr
    res = ev_json(vault, "restore", sid, "--venv", venv)
    assert res["verified"] is True
    assert_matches_snapshot(vault, sid, venv)
    assert not temp_files(venv) and not (venv / ".envvault-restore.json").exists()
    assert not (venv / "bin" / "serve").exists()
    assert not list(site_packages(venv).glob("servingpkg*")) and not (site_packages(venv) / "servingpkg").exists()
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True
    # one backup only: the rerun finished the first run's restore instead of backing up a half state
    backups = [s for s in ev_json(vault, "list", "--all")["snapshots"] if s["trigger"] == "restore-backup"]
    assert len(backups) <= 1


def test_status_and_snap_while_a_restore_runs_wait_for_its_end(tmp_path, make_venv, wheelhouse):
    """A restore stopped part way through its commit (``commit:1:STOP``: SIGSTOP at the named point): status
    said it was interrupted, named a restore that would be refused, or failed with "METADATA is missing;
    reinstall that package" (a dist-info folder between its old and new files); a snap recorded the
    half-restored tree (helper 23, F3). Both now wait for that restore to end, saying so, and answer about
    the tree it leaves."""
    import select

    vault, venv, sid, _after = _swap_setup(tmp_path, make_venv, wheelhouse)
    proc = subprocess.Popen([sys.executable, "-m", "envvault", "restore", sid, "--venv", str(venv), "--json"],
                            env=ev_env(vault, ENVVAULT_TEST_CRASH_AT="commit:1:STOP"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    waiting = []
    try:
        _pid, how = os.waitpid(proc.pid, os.WUNTRACED)  # returns once it stopped itself at the point
        assert os.WIFSTOPPED(how), how
        for args in (["status", "--venv", venv, "--json"], ["snap", "--no-caches", "--venv", venv, "--json"],
                     ["guard", "--venv", venv, "--yes", "--json", "--", "true"]):
            waiting.append(subprocess.Popen([sys.executable, "-m", "envvault", *map(str, args)], env=ev_env(vault),
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            ready, _, _ = select.select([waiting[-1].stderr], [], [], 120)  # a bound: the note comes at once
            assert ready, "nothing said while waiting for the restore"
            line = waiting[-1].stderr.readline()
            assert f"waiting for the restore of {venv} that is running to finish" in line, line
            assert waiting[-1].poll() is None
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and json.loads(out)["verified"], err
        (status_out, status_err), (snap_out, snap_err), (guard_out, guard_err) = (w.communicate(timeout=300)
                                                                                 for w in waiting)
    finally:
        for p in (proc, *waiting):
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait()
    assert waiting[0].returncode == 0, status_err
    doc = json.loads(status_out)
    assert doc["empty"] and doc["interrupted_restore"] is None
    assert waiting[1].returncode == 0, snap_err
    snap = json.loads(snap_out)
    assert not snap["warnings"], snap
    assert ev_json(vault, "diff", sid, snap["id"])["empty"]
    assert waiting[2].returncode == 0, guard_err  # guard's snapshots too: of the tree the restore left
    assert ev_json(vault, "diff", sid, json.loads(guard_out)["before"])["empty"]


def test_into_under_a_file_or_a_dangling_link_says_so(tmp_path, make_venv, wheelhouse):
    """``--into`` under a parent that is a file or a symlink to nothing: one line naming it (exit 3), not "cannot
    write ...: File exists" (exit 6; helper 24)."""
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    (tmp_path / "afile").write_text("x\n")
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    for parent, what in ((tmp_path / "afile", "is not a folder"), (tmp_path / "dangling", "a symlink to a missing one")):
        proc = ev(vault, "restore", sid, "--into", parent / "x", check=False)
        assert proc.returncode == 3, proc.stderr
        assert_one_line_error(proc, str(parent), what)
    assert not (tmp_path / "nothing").exists()


def _big_wheel(out: Path, version: str, seed: str) -> Path:
    rnd = random.Random(seed)
    files = {}
    for i in range(600):
        size = rnd.choice([200, 3000, 40_000, 300_000])
        files[f"bigpkg/sub{i % 20}/m{i}.py"] = (f"# {seed} {i}\n".encode() + rnd.randbytes(size)).replace(b"\x00", b"0")
    files["bigpkg/__init__.py"] = f"VERSION = {version!r}\n".encode()
    return build_wheel(out, "bigpkg", version, files, console_scripts={"bigpkg-run": "bigpkg:main"})


def test_sigkill_at_random_times_then_rerun(tmp_path, make_venv):
    """Five restores, each killed at a seeded-random passage of a named point (envvault/crashpoints.py):
    while staging or between renames, so every kill lands mid-work however fast the machine is."""
    vault = tmp_path / "vault"
    one = _big_wheel(tmp_path / "w1", "1.0", "one")
    two = _big_wheel(tmp_path / "w2", "2.0", "two")
    venv = make_venv("uv")
    uv_install(venv, one)
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    uv_install(venv, two)
    after = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    known = _known_contents(vault, sid, after)
    files = [rel for rel in known if "/__pycache__/" not in rel]
    assert len(files) > 600

    def inodes() -> dict:
        return {rel: (venv / rel).stat().st_ino for rel in files if (venv / rel).exists()}

    rnd = random.Random(7)
    for point in ("stage", "commit", "stage", "commit", "commit"):
        at = f"{point}:{rnd.randint(1, 90)}"  # each run has more than 600 files to stage and rename
        before = inodes()
        proc = subprocess.run([sys.executable, "-m", "envvault", "restore", sid, "--venv", str(venv), "--no-backup"],
                              env=ev_env(vault, ENVVAULT_TEST_CRASH_AT=at), capture_output=True, text=True, timeout=300)
        assert proc.returncode == -signal.SIGKILL, (at, proc.stderr)
        _assert_no_torn_files(venv, known)
        assert (venv / ".envvault-restore.json").exists(), at  # killed mid-restore: the journal is still there
        assert temp_files(venv), at  # staged files wait under temp names
        now = inodes()
        renamed = sum(1 for rel, ino in now.items() if before.get(rel) != ino)
        # killed while staging: nothing renamed into place yet; killed between renames: some, not all
        assert (renamed > 0) == (point == "commit") and renamed < len(files) / 2, (at, renamed)
    res = ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")
    assert res["verified"]
    assert_matches_snapshot(vault, sid, venv)
    assert not temp_files(venv) and not (venv / ".envvault-restore.json").exists()


# -- a hostile vault -----------------------------------------------------------------------------------


def _hostile(vault_path: Path, sid: str, venv: Path, bad_file: dict) -> str:
    from envvault.model.encoding import object_id

    vault = _vault(vault_path)
    doc = vault.load_snapshot(sid).doc
    payload = b"owned\n"
    oid = object_id(payload)
    files = [{"path": f"{SP.format(sys.version_info[1])}/evil/__init__.py", "record": "evil/__init__.py",
              "sha256": _b64(payload), "size": len(payload), "mode": 0o644, "chunks": [oid], "state": "ok"},
             dict(bad_file, **({"chunks": [oid], "sha256": _b64(payload), "size": len(payload)} if "link" not in bad_file else {}))]
    man = {"kind": "dist", "format": 1, "name": "evil", "version": "1.0", "build_id": "e" * 64, "state_id": "e" * 64,
           "dist_info": f"{SP.format(sys.version_info[1])}/evil-1.0.dist-info", "installer": "pip", "requested": True,
           "wheel": {}, "direct_url": None, "record": "ok", "build_info": None, "files": files}
    return forge_snapshot(vault, doc, [man], {oid: payload})


@pytest.mark.parametrize("bad", [
    {"path": "../../escaped.py", "record": "../../escaped.py", "mode": 0o644, "state": "ok"},
    {"path": "/tmp/envvault-absolute-escape.py", "record": "x", "mode": 0o644, "state": "ok"},
    {"path": "lib/escape-link", "record": "x", "link": "../../../../../../../../tmp", "state": "ok", "mode": 0o777},
    {"path": "lib/abs-link", "record": "x", "link": "/etc", "state": "ok", "mode": 0o777},
    {"path": "outside/through-link.py", "record": "x", "mode": 0o644, "state": "ok"},
], ids=["dotdot", "absolute", "symlink-out", "symlink-absolute", "through-existing-symlink"])
def test_hostile_manifest_is_refused_with_nothing_written(tmp_path, make_venv, wheelhouse, bad):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    outside = tmp_path / "outside-dir"
    outside.mkdir()
    (venv / "outside").symlink_to(outside)  # a symlink in the environment that leads out
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    evil = _hostile(vault, sid, venv, bad)
    before = tree_state(venv)
    snaps_before = sorted(os.listdir(vault / "snapshots"))
    proc = ev(vault, "restore", evil, "--venv", venv, check=False)
    assert_one_line_error(proc, "refusing")
    assert proc.returncode == 3
    assert tree_state(venv) == before  # nothing written, not even a journal
    assert list(outside.iterdir()) == [] and not Path("/tmp/envvault-absolute-escape.py").exists()
    assert not (tmp_path / "escaped.py").exists()
    assert sorted(os.listdir(vault / "snapshots")) == snaps_before  # its backup was dropped


def test_in_place_refused_across_python_minor(tmp_path, make_venv, wheelhouse):
    other = cpython("3.12")
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    foreign = make_venv("uv", python=other, name="foreign")
    before = tree_state(foreign)
    proc = ev(vault, "restore", sid, "--venv", foreign, "--no-backup", check=False)
    assert_one_line_error(proc, "refusing to restore in place", "--into")
    assert proc.returncode == 3 and tree_state(foreign) == before


# -- --into --------------------------------------------------------------------------------------------


def test_into_builds_a_fresh_venv_whose_scripts_run(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("venv")
    pip_install(venv, *(str(wheelhouse[k]) for k in (C.TORCH_PLAIN_A, C.SERVING, C.WITH_HEADERS, C.NS_ALPHA)))
    init = site_packages(venv) / "torchlike" / "__init__.py"
    init.write_bytes(init.read_bytes() + b"PATCHED = True\n")  # an edit the snapshot keeps
    (site_packages(venv) / "sharedns" / "alpha" / "__init__.py").unlink()  # and a deletion
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    new = tmp_path / "elsewhere" / "fresh"
    res = ev_json(vault, "restore", sid, "--into", new)
    assert res["verified"] is True and res["mode"] == "into" and res["target"] == str(new)
    out = _run(new / "bin" / "serve")
    assert "serving with torchlike 2.11.0+cu128 cuda 12.8" in out
    assert (new / "bin" / "serve").read_text().startswith(f"#!{new}/bin/python")
    assert "PATCHED = True" in (site_packages(new) / "torchlike" / "__init__.py").read_text()
    assert not (site_packages(new) / "sharedns" / "alpha" / "__init__.py").exists()
    assert ev_json(vault, "status", "--venv", new)["empty"] is True
    assert ev_json(vault, "status", "--venv", new, "--against", sid)["empty"] is True
    # a second --into onto the same path is refused
    proc = ev(vault, "restore", sid, "--into", new, check=False)
    assert_one_line_error(proc, "already an environment")
    # nor inside an environment or the vault (helper 20, F2: a venv built in the source's site-packages, which
    # the source then imported from): refused before anything is made, dry runs included
    for inside, where in ((site_packages(venv) / "zz", "inside the environment"), (new / "sub", "inside the environment"),
                          (vault / "inner", "inside the vault")):
        for dry in ([], ["--dry-run"]):
            proc = ev(vault, "restore", sid, "--into", inside, *dry, check=False)
            assert proc.returncode == 3, proc.stderr
            assert_one_line_error(proc, where)
            assert not inside.exists()


def test_into_names_a_missing_python_version():
    from envvault.errors import NotFoundError
    from envvault.model.snapshot import PythonInfo
    from envvault.restore.uv import find_python

    with pytest.raises(NotFoundError, match="no Python 3.99.1 is available"):
        find_python(PythonInfo(version="3.99.1", base_prefix="/nonexistent"))


# -- lock-only snapshots -------------------------------------------------------------------------------


def test_lock_only_restores_through_uv_with_reinstall(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_PLAIN_A], wheelhouse[C.SMALL_01])
    ev_json(vault, "snap", "--no-caches", "--venv", venv)  # a full snapshot holds the builds' files
    lock = ev_json(vault, "snap", "--no-caches", "--venv", venv, "--lock-only")["id"]
    uv_install(venv, "--reinstall-package", "torchlike", wheelhouse[C.TORCH_PLAIN_B])
    uv_install(venv, wheelhouse[C.SMALL_02])
    res = ev_json(vault, "restore", lock, "--venv", venv, "--no-backup")
    assert res["mode"] == "lock" and res["verified"] is True
    assert "torchlike" in res["plan"]["reinstall"] and res["plan"]["offline"] is True
    assert "cuda 12.8" in _run(venv / "bin" / "torchlike-info")
    assert ev_json(vault, "status", "--venv", venv, "--against", lock)["empty"] is True


def test_lock_only_into_a_new_venv(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_PLAIN_B], wheelhouse[C.SMALL_02])
    ev_json(vault, "snap", "--no-caches", "--venv", venv)
    lock = ev_json(vault, "snap", "--no-caches", "--venv", venv, "--lock-only")["id"]
    new = tmp_path / "from-lock"
    res = ev_json(vault, "restore", lock, "--into", new)
    assert res["verified"] is True
    assert "cuda 13.0" in _run(new / "bin" / "torchlike-info")


def test_lock_only_without_sources_fails_listing_packages(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_CU128], wheelhouse[C.SMALL_01])
    lock = ev_json(vault, "snap", "--no-caches", "--venv", venv, "--lock-only")["id"]
    uv_pip(venv, "uninstall", "torchlike", "smallpkg")
    before = tree_state(venv)
    proc = ev(vault, "restore", lock, "--venv", venv, check=False)
    assert_one_line_error(proc, "no known source", "torchlike 2.11.0+cu128", "smallpkg 0.1.0")
    assert proc.returncode == 4 and tree_state(venv) == before


# -- real torch ----------------------------------------------------------------------------------------


TORCH_WHEELS = Path("/opt/wheels")


@pytest.fixture(scope="session")
def torch_venv(tmp_path_factory) -> Path:
    """A venv with real torch 2.13.0+cpu, pip-installed from this machine's disk. Fails (never skips)
    when the wheel is not there: these tests are part of what restore promises."""
    wheels = sorted(TORCH_WHEELS.glob("torch-2.13.0+cpu-*.whl"))
    assert wheels, f"torch 2.13.0+cpu wheel not found in {TORCH_WHEELS}"
    from fixtures import make_venv

    venv = make_venv(tmp_path_factory.mktemp("torch") / "venv", "venv")
    pip_install(venv, "torch==2.13.0+cpu", find_links=[TORCH_WHEELS], index_url="file:///opt/pypi/simple")
    return venv


def test_real_torch_version_edit_and_removal_restored(tmp_path, torch_venv):
    vault = tmp_path / "vault"
    venv = tmp_path / "tv"
    shutil.copytree(torch_venv, venv, symlinks=True)
    py = python_of(venv)
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv, timeout=1800)["id"]
    version_py = site_packages(venv) / "torch" / "version.py"
    original = version_py.read_bytes()
    version_py.write_bytes(original.replace(b"2.13.0+cpu", b"2.13.0+cu999"))
    assert "2.13.0+cu999" in _run(py, "-c", "import torch; print(torch.__version__)")
    st = ev_json(vault, "status", "--venv", venv)
    (ch,) = st["packages"]["changed"]
    assert ch["name"] == "torch" and ch["modified_files"] == [version_py.relative_to(venv).as_posix()]
    res = ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")
    assert res["verified"] and res["written_files"] == 1
    assert version_py.read_bytes() == original
    assert _run(py, "-c", "import torch; print(torch.__version__)").strip() == "2.13.0+cpu"

    # torch removed entirely (as an install that swaps it away does first): back from the vault alone
    pip(venv, "uninstall", "-y", "torch")
    assert not (site_packages(venv) / "torch").exists()
    t0 = time.monotonic()
    res = ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")
    took = time.monotonic() - t0
    assert res["verified"] and res["written_files"] > 1000, res
    assert_matches_snapshot(vault, sid, venv)
    out = _run(py, "-c", "import torch; print(torch.__version__, torch.ones(3).sum().item())")
    assert out.split() == ["2.13.0+cpu", "3.0"]
    print(f"restore of the whole torch: {took:.2f}s")


def test_hostile_manifest_is_refused_for_into_too(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    evil = _hostile(vault, sid, venv, {"path": "../../escaped.py", "record": "../../../../../escaped.py",
                                       "mode": 0o644, "state": "ok"})
    new = tmp_path / "new"
    proc = ev(vault, "restore", evil, "--into", new, check=False)
    assert_one_line_error(proc, "refusing", "contains '..'")
    assert proc.returncode == 3 and not new.exists() and not (tmp_path / "escaped.py").exists()


def test_removing_one_of_a_namespace_pair_keeps_the_other(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.NS_ALPHA])
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    uv_install(venv, wheelhouse[C.NS_BETA])
    alpha = site_packages(venv) / "sharedns" / "alpha" / "__init__.py"
    before = tree_state(alpha.parent)
    res = ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")
    assert res["verified"] and res["plan"]["remove"] == ["nsa-beta 1.0"]
    assert not (site_packages(venv) / "sharedns" / "beta").exists()
    assert tree_state(alpha.parent) == before
    _run(python_of(venv), "-c", "import sharedns.alpha")


def test_manifest_path_checks():
    from envvault.restore.plan import check_rel_path

    assert check_rel_path("lib/python3.11/site-packages/x.py") is None
    for bad in ("/etc/passwd", "../x", "lib/../../x", "a/./b", "a//b", "a\x00b", "", None):
        assert check_rel_path(bad) is not None, bad


def test_into_a_folder_made_by_someone_else_while_it_waited_is_left_alone(tmp_path, make_venv, wheelhouse):
    """``restore --into NEW`` waits for the vault lock while the user makes a venv at NEW (``python -m venv``)
    and puts a file in it: the restore removed that venv with the file when uv then failed on it, as if it had
    made it (helper 23, F1). It now claims NEW once it holds the lock, finds it taken, refuses (exit 3) and
    removes nothing."""
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    new = tmp_path / "new"

    def users_venv():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(new)], check=True, timeout=120)
        (new / "my_notes.txt").write_text("mine\n")

    code, out, err = behind_a_gc(vault, ["restore", sid, "--into", new], keep_last=None, meanwhile=users_venv)
    assert code == 3, (out, err)
    assert "became an environment while this restore waited" in err and "Traceback" not in err
    assert (new / "my_notes.txt").read_text() == "mine\n" and (new / "pyvenv.cfg").is_file()


def test_two_restores_into_one_new_folder_at_once(tmp_path, make_venv, wheelhouse):
    """Two ``restore --into NEW`` of one path, both waiting for the vault lock, then both let go: both failed
    and NEW was left missing, with misleading lines (exit 6 "cannot write pyvenv.cfg", exit 2, exit 7: helper
    23, F1). One builds NEW and verifies; the other is refused (exit 3) and removes nothing of it."""
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    new = tmp_path / "new"
    other: list[subprocess.Popen] = []

    def second_restore():
        import select

        other.append(subprocess.Popen([sys.executable, "-m", "envvault", "restore", sid, "--into", str(new), "--json"],
                                      env=ev_env(vault), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        ready, _, _ = select.select([other[0].stderr], [], [], 120)  # both now wait for the vault lock
        assert ready and "waiting for the vault lock" in other[0].stderr.readline()

    code, out, err = behind_a_gc(vault, ["restore", sid, "--into", new, "--json"], keep_last=None,
                                 meanwhile=second_restore)
    out2, err2 = other[0].communicate(timeout=300)
    results = sorted([(code, out, err), (other[0].returncode, out2, err2)], key=lambda r: r[0])
    (ok_code, ok_out, ok_err), (refused_code, _o, refused_err) = results
    assert ok_code == 0 and json.loads(ok_out)["verified"] is True, ok_err
    assert refused_code == 3, refused_err
    assert ("another envvault restore of" in refused_err or "became an environment" in refused_err
            or "is already an environment" in refused_err), refused_err
    assert "Traceback" not in refused_err
    assert ev_json(vault, "status", "--venv", new)["empty"]


def test_a_garbled_dist_info_names_the_way_a_restore_repairs_it(tmp_path, make_venv, wheelhouse):
    """A RECORD garbled after the snapshot (a killed installer): ``restore`` stopped with "reinstall that
    package ... and snap again", no way for the restore itself (helper 29, defect 4). The line now names the
    folder to remove; once it is removed, the restore writes the package back whole and verifies."""
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    dist_info = next(site_packages(venv).glob("smallpkg-*.dist-info"))
    with open(dist_info / "RECORD", "a") as f:
        f.write("garbage,\n")
    proc = ev(vault, "restore", sid, "--venv", venv, check=False)
    assert proc.returncode == 7
    assert_one_line_error(proc, "RECORD is garbled", f"remove {dist_info} and run the restore again")
    shutil.rmtree(dist_info)
    res = ev_json(vault, "restore", sid, "--venv", venv)
    assert res["verified"] is True
    assert_matches_snapshot(vault, sid, venv)


def test_a_fifo_put_where_a_package_file_was_is_reported_and_replaced(tmp_path, make_venv, wheelhouse):
    """A FIFO in place of a package file stopped status, snap and every restore with "not a regular file (did
    it change while envvault read the environment?)", exit 7 (helper 29). It is the file gone: status names it
    deleted, without opening the FIFO (it would block), and a restore puts the file back."""
    vault = tmp_path / "vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    victim = sorted((site_packages(venv) / "smallpkg").rglob("*.py"))[0]
    victim.unlink()
    os.mkfifo(victim)
    (change,) = ev_json(vault, "status", "--venv", venv, timeout=60)["packages"]["changed"]
    assert change["missing_files"] == [victim.relative_to(venv).as_posix()], change
    res = ev_json(vault, "restore", sid, "--venv", venv, timeout=60)
    assert res["verified"] is True and victim.is_file()
    assert_matches_snapshot(vault, sid, venv)


def test_the_dry_run_counts_the_files_the_restore_removes(tmp_path, make_venv, wheelhouse):
    """pip compiles bytecode and lists it in RECORD: ``--dry-run`` said "remove 11 files", the restore "10
    removed" (helper 31); both count the files there now, bytecode left out of both."""
    vault = tmp_path / "vault"
    venv = make_venv("venv", with_pip=True)
    pip_install(venv, str(wheelhouse[C.TORCH_CU128]))
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    pip_install(venv, str(wheelhouse[C.SMALL_01]))
    assert list(site_packages(venv).glob("smallpkg/__pycache__/*.pyc"))  # pip compiled it
    dry = ev(vault, "restore", sid, "--venv", venv, "--dry-run")
    res = ev_json(vault, "restore", sid, "--venv", venv)
    assert res["verified"] is True and f"remove {res['removed_files']} files," in dry.stdout, (dry.stdout, res)


def test_real_numpy_linked_from_uvs_cache_comes_back_after_the_cache_is_pruned(tmp_path, make_venv):
    """A real package installed the way ``uv pip install --link-mode symlink`` installs it (every file, its
    extension modules and ``numpy.libs`` included, a link into uv's cache), from this machine's package index:
    once ``uv cache clean`` removed what the links lead to, ``restore latest`` brings back a working numpy
    from the snapshot alone, as regular files (before: the snapshot held links only and the restore refused
    them)."""
    venv = make_venv("uv")
    cache = tmp_path / "uv-cache"
    uv_install(venv, "--link-mode", "symlink", "numpy", index_url="file:///opt/pypi/simple", cache_dir=cache)
    check = [str(python_of(venv)), "-c", "import numpy; print(numpy.arange(10).reshape(2, 5).sum(axis=0).tolist())"]
    assert subprocess.run(check, capture_output=True, text=True).stdout.split() == ["[5,", "7,", "9,", "11,", "13]"]
    linked = [p for p in site_packages(venv).rglob("*") if p.is_symlink()]
    assert len(linked) > 100 and any(p.suffix == ".so" for p in linked)
    vault = tmp_path / "vault"
    snap = ev_json(vault, "snap", "--no-caches", "--venv", venv)
    assert not snap["warnings"], snap["warnings"]
    from fixtures import find_uv

    subprocess.run([find_uv(), "cache", "clean", "--cache-dir", str(cache)], check=True, capture_output=True)
    assert subprocess.run(check, capture_output=True).returncode != 0
    assert ev_json(vault, "restore", "latest", "--venv", venv)["verified"] is True
    assert not any(p.is_symlink() for p in linked) and all(p.is_file() for p in linked)
    assert subprocess.run(check, capture_output=True, text=True).stdout.split() == ["[5,", "7,", "9,", "11,", "13]"]
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True


def _listing(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _requests_linked_out(tmp_path, make_venv) -> tuple[Path, Path, Path]:
    """A venv with real requests (and its dependencies) whose package folder is a symlink to ``out/requests``."""
    venv = make_venv("uv")
    uv_install(venv, "--link-mode", "copy", "requests", index_url="file:///opt/pypi/simple", cache_dir=tmp_path / "uvc")
    site = site_packages(venv)
    out = tmp_path / "out" / "requests"
    out.parent.mkdir()
    shutil.move(site / "requests", out)
    (site / "requests").symlink_to(out, target_is_directory=True)
    return venv, site, out


def test_a_package_folder_linked_out_of_the_environment_comes_back_as_a_folder(tmp_path, make_venv):
    """A package whose folder is a symlink into a cache outside the environment (what pdm's older ``symlink``
    cache method left, and any hand-made shared install): the snapshot reads its files through the link, but a
    restore refused to write under a symlink leading out, so once the cache was pruned or changed nothing
    could bring the package back (exit 3). The restore now replaces the link with a folder of the snapshot's
    files; where the link led is left exactly as it was, and a link whose files are all right stays."""
    venv, site, cache = _requests_linked_out(tmp_path, make_venv)
    check = [str(python_of(venv)), "-c", "import requests, requests.adapters; print(requests.__version__)"]
    version = subprocess.run(check, capture_output=True, text=True, check=True).stdout.strip()
    vault = tmp_path / "vault"
    snap = ev_json(vault, "snap", "--no-caches", "--venv", venv)
    assert not snap["warnings"], snap["warnings"]

    # All files right: nothing to do, the link stays.
    res = ev_json(vault, "restore", "latest", "--venv", venv)
    assert res["verified"] is True and (site / "requests").is_symlink()

    # The cache changed under the link (another environment's upgrade, a user's edit): the link goes.
    (cache / "api.py").write_text("raise ImportError('not the snapshot')\n")
    before = _listing(cache.parent)
    status = ev_json(vault, "status", "--venv", venv)
    assert [c["name"] for c in status["packages"]["changed"]] == ["requests"], status
    dry = ev_json(vault, "restore", "latest", "--venv", venv, "--dry-run")
    assert dry["plan"]["unlinked"] == [(site / "requests").relative_to(venv).as_posix()], dry["plan"]
    assert (site / "requests").is_symlink()  # (a dry run changes nothing)
    res = ev_json(vault, "restore", "latest", "--venv", venv)
    assert res["verified"] is True, res
    assert any("symlink out of the environment" in w for w in res["warnings"]), res["warnings"]
    assert not (site / "requests").is_symlink() and (site / "requests" / "api.py").is_file()
    assert _listing(cache.parent) == before  # nothing written, changed or removed where the link led
    assert subprocess.run(check, capture_output=True, text=True).stdout.strip() == version
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True

    # Linked again, then the cache pruned: the dangling link is replaced as well.
    shutil.rmtree(site / "requests")
    (site / "requests").symlink_to(cache, target_is_directory=True)
    shutil.rmtree(cache.parent)
    assert subprocess.run(check, capture_output=True).returncode != 0
    assert ev_json(vault, "restore", "latest", "--venv", venv)["verified"] is True
    assert subprocess.run(check, capture_output=True, text=True).stdout.strip() == version
    assert not cache.parent.exists()


def test_a_link_out_above_the_site_folder_is_still_refused(tmp_path, make_venv, wheelhouse):
    """The replacement is for a package's folder only: a site-packages that is itself a symlink out of the
    environment holds every package, and a restore that needs to write there is refused as before (one line,
    exit 3), nothing written where it leads."""
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    site = site_packages(venv)
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    outside = tmp_path / "elsewhere" / "site-packages"
    outside.parent.mkdir()
    shutil.move(site, outside)
    site.symlink_to(outside, target_is_directory=True)
    victim = sorted((outside / "smallpkg").rglob("*.py"))[0]
    victim.unlink()
    before = _listing(outside)
    r = ev(vault, "restore", sid, "--venv", venv, check=False)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert_one_line_error(r, "leads outside the environment")
    assert site.is_symlink() and _listing(outside) == before


def test_a_link_put_back_while_the_restore_replaces_it_is_never_written_through(tmp_path, make_venv):
    """Helper 41: the restore removed the package folder's link out, then made "the folder" with
    ``makedirs(exist_ok=True)``; a link put back in that moment (another user of a shared site folder) had the
    restore rename every file of the package through it, outside the environment, and report "verified". The
    folder is now made with ``mkdir`` (never one that is there): the restore stops (exit 7, one line, its
    journal kept) and nothing is written where that link leads."""
    venv, site, out = _requests_linked_out(tmp_path, make_venv)
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--no-caches", "--venv", venv)
    (out / "api.py").write_text("raise ImportError('not the snapshot')\n")
    victim = tmp_path / "victim"
    victim.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "envvault", "restore", "latest", "--venv", str(venv)],
                            env=ev_env(vault, ENVVAULT_TEST_CRASH_AT="commit:1:STOP"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _pid, how = os.waitpid(proc.pid, os.WUNTRACED)  # stopped once the link is gone
        assert os.WIFSTOPPED(how), how
        assert not os.path.lexists(site / "requests")
        (site / "requests").symlink_to(victim, target_is_directory=True)
        os.kill(proc.pid, signal.SIGCONT)
        _out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
    assert proc.returncode == 7 and "appeared while the restore replaced the symlink" in err, (proc.returncode, err)
    assert "Traceback" not in err
    assert list(victim.iterdir()) == []


def test_a_kept_file_under_a_package_folder_linked_out_is_never_chmod_ed(tmp_path, make_venv):
    """Helper 41: a file of a package folder linked out of the environment that only lost its execute bit's
    state (the cache's file chmod-ed by someone) was chmod-ed back where the link leads, outside the
    environment. A kept file under a folder leading out is now written anew (the link replaced by a folder),
    and the file outside keeps its mode."""
    venv, site, out = _requests_linked_out(tmp_path, make_venv)
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--no-caches", "--venv", venv)
    (out / "api.py").chmod(0o755)
    res = ev_json(vault, "restore", "latest", "--venv", venv)
    assert res["verified"] is True, res
    assert (out / "api.py").stat().st_mode & 0o777 == 0o755
    assert not (site / "requests").is_symlink() and (site / "requests" / "api.py").stat().st_mode & 0o777 == 0o644
