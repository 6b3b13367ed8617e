"""envvault snap / list / show / export / verify on real venvs with real pip and uv installs."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import catalogue as C
from fixtures import build_wheel, pdm_link_install, pip_install, python_of, site_packages, uv_install, uv_pip
from tests.evtools import assert_one_line_error, behind_a_gc, ev, ev_env, ev_json, mounted


def _install_base(venv: Path, wheelhouse: dict, installer=uv_install) -> None:
    wheels = [wheelhouse[k] for k in (C.TORCH_CU128, C.NS_ALPHA, C.NS_BETA, C.WITH_HEADERS, C.SMALL_01)]
    installer(venv, *map(str, wheels))


def _pkg(doc: dict, name: str) -> dict:
    return next(p for p in doc["packages"] if p["name"] == name)


def test_snap_records_everything(tmp_path, make_venv, wheelhouse):
    venv = make_venv("uv")
    _install_base(venv, wheelhouse)
    vault = tmp_path / "vault"
    out = ev_json(vault, "snap", "--venv", venv, "-m", "before serving")
    assert len(out["id"]) == 64 and out["short_id"] == out["id"][:12]
    assert out["packages"] == 5 and out["new_bytes"] > 0 and out["created"]
    assert oct(vault.stat().st_mode & 0o777) == "0o700"
    doc = ev_json(vault, "show", out["id"][:6])
    assert doc["message"] == "before serving"
    assert doc["python"]["version"].startswith("3.") and doc["python"]["abi"].startswith("cp")
    assert doc["host"]["arch"] and "glibc" in doc["host"]
    assert doc["argv"][:2] == [doc["argv"][0], "snap"]
    torch = _pkg(doc, "torchlike")
    assert torch["version"] == "2.11.0+cu128"
    assert torch["build_info"]["cuda"] == "12.8" and torch["build_info"]["git_version"] == C.GIT_VERSION
    assert torch["installer"] == "uv" and torch["requested"] is True
    # every file of every distribution is in the vault, bin/ and include/ too
    ls = ev(vault, "list", "--all").stdout
    assert out["short_id"] in ls and "before serving" in ls
    listed = ev_json(vault, "list", "--all")["snapshots"]
    assert listed[0]["id"] == out["id"] and listed[0]["packages"] == 5
    assert ev_json(vault, "verify")["ok"] is True


def test_files_outside_site_packages_are_stored(tmp_path, make_venv, wheelhouse):
    from envvault.vault.store import Vault

    venv = make_venv("uv")
    _install_base(venv, wheelhouse)
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--venv", venv)["id"]
    v = Vault.open(vault)
    doc = v.load_snapshot(sid).doc
    man = v.get_json(_pkg(doc, "torchlike")["manifest"])
    paths = {f["path"]: f for f in man["files"]}
    assert "bin/torchlike-info" in paths and paths["bin/torchlike-info"]["chunks"]
    assert "share/torchlike/build.txt" in paths
    hdr = v.get_json(_pkg(doc, "withheaders")["manifest"])
    assert any(f["path"].startswith("include/") for f in hdr["files"])
    for f in man["files"]:
        if f.get("chunks"):
            data = b"".join(v.get(c) for c in f["chunks"])
            assert data == (venv / f["path"]).read_bytes()


def test_same_version_other_build_has_other_build_id(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    a, b = make_venv("uv", name="a"), make_venv("venv", name="b", with_pip=True)
    uv_install(a, str(wheelhouse[C.TORCH_PLAIN_A]))
    pip_install(b, str(wheelhouse[C.TORCH_PLAIN_B]))
    da = ev_json(vault, "show", ev_json(vault, "snap", "--venv", a)["id"])
    db = ev_json(vault, "show", ev_json(vault, "snap", "--venv", b)["id"])
    ta, tb = _pkg(da, "torchlike"), _pkg(db, "torchlike")
    assert ta["version"] == tb["version"] == "2.11.0"
    assert ta["build_id"] != tb["build_id"]
    assert (ta["build_info"]["cuda"], tb["build_info"]["cuda"]) == ("12.8", "13.0")
    assert ta["installer"] == "uv" and tb["installer"] == "pip"


def test_same_wheel_by_pip_and_uv_has_one_build_id(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    a, b = make_venv("uv", name="a"), make_venv("venv", name="b", with_pip=True)
    uv_install(a, str(wheelhouse[C.TORCH_CU128]))
    pip_install(b, str(wheelhouse[C.TORCH_CU128]))  # pip byte-compiles and lists .pyc in RECORD
    da = ev_json(vault, "show", ev_json(vault, "snap", "--venv", a)["id"])
    db = ev_json(vault, "show", ev_json(vault, "snap", "--venv", b)["id"])
    assert _pkg(da, "torchlike")["build_id"] == _pkg(db, "torchlike")["build_id"]


def test_in_place_edit_is_marked(tmp_path, make_venv, wheelhouse):
    venv = make_venv("uv")
    _install_base(venv, wheelhouse)
    vault = tmp_path / "vault"
    clean = ev_json(vault, "show", ev_json(vault, "snap", "--venv", venv)["id"])
    target = site_packages(venv) / "torchlike" / "__init__.py"
    target.write_text(target.read_text() + "is_fx_symbolic_tracing = lambda: False\n")
    dirty = ev_json(vault, "show", ev_json(vault, "snap", "--venv", venv)["id"])
    t0, t1 = _pkg(clean, "torchlike"), _pkg(dirty, "torchlike")
    assert t0["modified"] == [] and t1["build_id"] == t0["build_id"]
    assert t1["modified"] == [str(target.relative_to(venv))]
    assert t1["state_id"] != t0["state_id"] and dirty["fingerprint"] != clean["fingerprint"]
    assert "edited in place" in ev(vault, "show", "latest").stdout


def test_second_snap_reads_only_metadata_and_adds_little(tmp_path, make_venv, wheelhouse):
    venv = make_venv("uv")
    _install_base(venv, wheelhouse)
    vault = tmp_path / "vault"
    first = ev_json(vault, "snap", "--venv", venv)
    second = ev_json(vault, "snap", "--venv", venv)
    assert second["new_objects"] == 0 and second["new_bytes"] < 64 * 1024
    assert second["id"] != first["id"]
    # the stat cache answered: no file of the environment was opened (strace-free check: atime-free FS,
    # so instead make every file unreadable-by-content: replace read with a trap via a bad chunk cache)
    uv_install(venv, str(wheelhouse[C.SMALL_02]))
    third = ev_json(vault, "snap", "--venv", venv)
    small = wheelhouse[C.SMALL_02].stat().st_size
    assert 0 < third["new_bytes"] <= 2 * small + 64 * 1024
    assert ev_json(vault, "verify")["ok"]


def test_lock_only_snapshot(tmp_path, make_venv, wheelhouse):
    venv = make_venv("uv")
    _install_base(venv, wheelhouse)
    vault = tmp_path / "vault"
    out = ev_json(vault, "snap", "--venv", venv, "--lock-only")
    assert out["lock_only"] is True and out["packages"] == 5
    doc = ev_json(vault, "show", out["id"])
    assert _pkg(doc, "torchlike")["version"] == "2.11.0+cu128"
    lock = tmp_path / "req.txt"
    ev(vault, "export", out["id"], "--format", "requirements", "-o", lock)
    assert "torchlike==2.11.0+cu128" in lock.read_text()


@pytest.mark.parametrize("kind", ["uv", "venv"])
def test_export_pylock_reproduces_offline(tmp_path, make_venv, wheelhouse, kind):
    from packaging.pylock import Pylock

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    venv = make_venv(kind, with_pip=(kind == "venv"), name="src")
    _install_base(venv, wheelhouse, uv_install if kind == "uv" else pip_install)
    (site_packages(venv) / "torchlike" / "version.py").open("a").write("# patched\n")
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--venv", venv)["id"]
    lock = tmp_path / "out" / "pylock.toml"
    res = ev_json(vault, "export", sid, "-o", lock)
    assert res["wheels"] == res["packages"] >= 5
    doc = tomllib.loads(lock.read_text())
    Pylock.from_dict(doc)  # raises PylockValidationError when invalid
    tl = next(p for p in doc["packages"] if p["name"] == "torchlike")
    assert tl["version"] == "2.11.0+cu128"
    assert tl["tool"]["envvault"]["build_id"]
    fresh = make_venv("uv", name="fresh")
    env = dict(os.environ, UV_NO_CONFIG="1", UV_OFFLINE="1")
    uv_pip(fresh, "sync", "--offline", "--preview-features", "pylock", str(lock), env=env)
    out = subprocess.run([str(fresh / "bin" / "torchlike-info")], capture_output=True, text=True)
    assert "2.11.0+cu128" in out.stdout
    src_doc = ev_json(vault, "show", sid)
    new_doc = ev_json(vault, "show", ev_json(vault, "snap", "--venv", fresh)["id"])
    for p in src_doc["packages"]:
        q = _pkg(new_doc, p["name"])
        assert q["version"] == p["version"]
    # same bytes for every file in site-packages, the in-place patch included
    src_sp, new_sp = site_packages(venv), site_packages(fresh)
    for path in src_sp.rglob("*"):
        rel = path.relative_to(src_sp)
        if path.is_file() and "__pycache__" not in rel.parts and not rel.parts[0].endswith(".dist-info"):
            if rel.parts[0] in ("torchlike", "sharedns", "withheaders", "smallpkg"):
                assert (new_sp / rel).read_bytes() == path.read_bytes(), rel


def test_ids_prefixes_and_ambiguity(tmp_path, make_venv, wheelhouse):
    from envvault.model.encoding import canonical_json, object_id

    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    vault = tmp_path / "vault"
    ids = [ev_json(vault, "snap", "--venv", venv, "-m", str(i))["id"] for i in range(3)]
    assert ev_json(vault, "show", "latest")["id"] == ids[-1]
    assert ev_json(vault, "show", ids[0][:8])["id"] == ids[0]
    assert_one_line_error(ev(vault, "show", "ffff0000", check=False), "ffff0000")
    assert_one_line_error(ev(vault, "show", "ab", check=False), "at least 4")
    assert_one_line_error(ev(vault, "show", "no-such-tag", check=False), "no-such-tag")
    # two snapshot documents whose ids share 4 hex digits: found by trying, written as the vault would
    seen: dict[str, tuple[str, bytes]] = {}
    n = 0
    while True:
        data = canonical_json({"format": 1, "created": "2026-01-01T00:00:00Z", "message": f"m{n}", "packages": []})
        oid = object_id(data)
        if oid[:4] in seen:
            break
        seen[oid[:4]] = (oid, data)
        n += 1
    other, other_data = seen[oid[:4]]
    for i, d in ((oid, data), (other, other_data)):
        (vault / "snapshots" / f"{i}.json").write_bytes(d)
    proc = ev(vault, "show", oid[:4], check=False)
    assert_one_line_error(proc, "ambiguous", oid[:12], other[:12])


def test_bad_targets_get_one_line(tmp_path, make_venv, wheelhouse):
    vault = tmp_path / "vault"
    notenv = tmp_path / "plain"
    notenv.mkdir()
    assert_one_line_error(ev(vault, "snap", "--venv", notenv, check=False), "not a Python environment")
    assert_one_line_error(ev(vault, "snap", "--venv", tmp_path / "nope", check=False), "not a directory")
    assert_one_line_error(ev(vault, "snap", check=False), "--venv")
    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    di = next(site_packages(venv).glob("smallpkg-*.dist-info"))
    record = (di / "RECORD").read_bytes()
    (di / "RECORD").write_text('smallpkg/__init__.py,sha256=abc\n"unterminated,\n')
    assert_one_line_error(ev(vault, "snap", "--venv", venv, check=False), "RECORD")
    (di / "RECORD").unlink()
    assert_one_line_error(ev(vault, "snap", "--venv", venv, check=False), "RECORD is missing")
    (di / "RECORD").write_bytes(record)
    meta = (di / "METADATA").read_text()
    (di / "METADATA").write_text("garbage without headers\n")
    assert_one_line_error(ev(vault, "snap", "--venv", venv, check=False), "METADATA")
    (di / "METADATA").write_text(meta)
    assert ev(vault, "list", "--all", "--json", check=False).stdout.count('"id"') == 0
    ev(vault, "snap", "--venv", venv)


def test_egg_info_install_warns_not_crashes(tmp_path, make_venv, wheelhouse):
    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    egg = site_packages(venv) / "oldthing-1.0-py3.11.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: oldthing\nVersion: 1.0\n")
    vault = tmp_path / "vault"
    out = ev_json(vault, "snap", "--venv", venv)
    assert any("oldthing" in w and "RECORD" in w for w in out["warnings"])
    assert out["packages"] == 2


def _unreadable_env(tmp_path: Path, make_venv, wheelhouse) -> Path:
    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    return venv


def test_unreadable_file_one_line(tmp_path, make_venv, wheelhouse):
    venv = _unreadable_env(tmp_path, make_venv, wheelhouse)
    victim = site_packages(venv) / "smallpkg" / "const.py"
    vault = tmp_path / "vault"
    victim.chmod(0o000)
    cmd = [sys.executable, "-m", "envvault", "snap", "--venv", str(venv)]
    if os.geteuid() == 0:
        # root reads any file; without the DAC override capabilities it obeys modes like everyone
        cmd = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ev_env(vault))
    assert_one_line_error(proc, "const.py", "permission denied")
    assert not list((vault / "snapshots").glob("*.json"))


def test_read_only_vault_and_full_disk(tmp_path, make_venv, wheelhouse):
    venv = make_venv("uv")
    _install_base(venv, wheelhouse)
    # read-only filesystem under an existing vault
    vault = tmp_path / "ro"
    ev(vault, "snap", "--venv", venv)
    before = sorted(p.name for p in (vault / "snapshots").iterdir())
    with mounted(vault):
        uv_install(venv, str(wheelhouse[C.SMALL_02]))
        proc = ev(vault, "snap", "--venv", venv, check=False)
        assert_one_line_error(proc, "read-only")
    assert sorted(p.name for p in (vault / "snapshots").iterdir()) == before
    # a full disk: a 120 KiB tmpfs cannot hold the torchlike build
    full = tmp_path / "full"
    full.mkdir()
    with mounted(full, tmpfs_size="120k"):
        proc = ev(full / "vault", "snap", "--venv", venv, check=False)
        assert_one_line_error(proc, "no space left")
        assert not list((full / "vault" / "snapshots").glob("*.json"))
        assert not list((full / "vault" / "tmp").iterdir())  # a failed snap removes its temp files
        assert ev_json(full / "vault", "verify")["ok"]


def test_two_snaps_at_once(tmp_path, make_venv, wheelhouse):
    a, b = make_venv("uv", name="a"), make_venv("uv", name="b")
    _install_base(a, wheelhouse)
    uv_install(b, str(wheelhouse[C.TORCH_CU130]), str(wheelhouse[C.SMALL_02]))
    vault = tmp_path / "vault"
    env = ev_env(vault)
    procs = [subprocess.Popen([sys.executable, "-m", "envvault", "snap", "--venv", str(v), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for v in (a, b, a)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    ids = {json.loads(o[0])["id"] for o in outs}
    assert len(ids) == 3
    listed = {s["id"] for s in ev_json(vault, "list", "--all")["snapshots"]}
    assert ids <= listed
    assert ev_json(vault, "verify")["ok"]


def _packs(vault: Path) -> tuple[set, set]:
    """(pack ids under packs/, pack ids with an index file)."""
    packs = {p.stem for p in (vault / "packs").rglob("*.pack")}
    indexed = {p.stem for p in (vault / "index").glob("*.idx")}
    return packs, indexed


# Each kill lands at a named point of the snap's own work (envvault/crashpoints.py), never after a sleep,
# and the evidence that it was mid-work is what it left behind.
SNAP_KILLS = [
    ("pack_frame:5", lambda v: any(p.stat().st_size > 5_000_000 for p in (v / "tmp").glob("*pack*"))),  # a temp pack half-written
    ("pack_renamed", lambda v: len(_packs(v)[0] - _packs(v)[1]) == 1),  # a pack without its index
    ("pack_indexed", lambda v: len(_packs(v)[1]) == 1),  # one pack durable, the other still to write
    ("snap_objects", lambda v: len(_packs(v)[1]) >= 2),  # every object durable, no snapshot file
]


# The pipeline as 2 cores run it (one reader), and as a host of 8 cores or more does (readers, namers cutting
# the files of 8 MiB or more ahead of their turn), forced here by the variables.
PIPELINES = {"one-reader": {}, "readers-and-namers": {"ENVVAULT_READERS": "2", "ENVVAULT_NAMERS": "2"}}


@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_sigkill_during_snap_leaves_clean_vault(tmp_path, make_venv, wheelhouse, pipeline):
    venv = make_venv("uv")
    _install_base(venv, wheelhouse)
    # more bytes than one pack holds (packs close at 32 MiB): 30 distinct 1.5 MB files in one package, and
    # (with namers) three 9 MB files after them
    big = site_packages(venv) / "smallpkg"
    rng = random.Random(7)
    sizes = [1_500_000] * 30 + ([9_000_000] * 3 if PIPELINES[pipeline] else [])
    for i, size in enumerate(sizes):
        (big / f"blob{i}.bin").write_bytes(rng.randbytes(size))
    di = next(site_packages(venv).glob("smallpkg-*.dist-info"))
    with (di / "RECORD").open("a") as rec:
        from fixtures.wheels import record_hash
        for i in range(len(sizes)):
            data = (big / f"blob{i}.bin").read_bytes()
            rec.write(f"smallpkg/blob{i}.bin,{record_hash(data)},{len(data)}\n")
    vault = tmp_path / "vault"
    extra = PIPELINES[pipeline]
    for point, mid_work in SNAP_KILLS:
        p = subprocess.run([sys.executable, "-m", "envvault", "snap", "--venv", str(venv)], capture_output=True,
                           text=True, env=ev_env(vault, ENVVAULT_TEST_CRASH_AT=point, **extra), timeout=300)
        assert p.returncode == -signal.SIGKILL, (point, p.stderr)
        assert mid_work(vault), (point, _packs(vault), list((vault / "tmp").iterdir()))
        assert ev_json(vault, "list", "--all")["snapshots"] == []  # nothing committed: no half snapshot listed
        report = ev_json(vault, "verify")
        assert report["ok"], (point, report)
    out = ev_json(vault, "snap", "--venv", venv, env=ev_env(vault, **extra))
    assert ev_json(vault, "verify", "--read-data")["ok"]
    ev(vault, "show", out["id"])
    assert [s["id"] for s in ev_json(vault, "list", "--all")["snapshots"]] == [out["id"]]
    # what the killed snaps had made durable was reused: the finishing snap stored no blob again
    assert out["new_bytes"] < 1_500_000, out


@pytest.mark.torch
def test_snap_and_export_real_torch(tmp_path, torch_venv):
    vault = tmp_path / "vault"
    out = ev_json(vault, "snap", "--venv", torch_venv, "-m", "torch")
    doc = ev_json(vault, "show", out["id"])
    t = _pkg(doc, "torch")
    assert t["version"] == "2.13.0+cpu" and t["build_info"]["version"] == "2.13.0+cpu"
    assert t["build_info"]["cuda"] is None and t["installer"] == "pip"
    assert "torch 2.13.0+cpu" in ev(vault, "list", "--all").stdout
    lock = tmp_path / "x" / "pylock.toml"
    res = ev_json(vault, "export", out["id"], "-o", lock)
    assert res["wheels"] == out["packages"]
    fresh = tmp_path / "fresh"
    uv_pip_env = dict(os.environ, UV_NO_CONFIG="1")
    from fixtures import make_venv as mk
    mk(fresh, "uv", python_of(torch_venv).resolve())
    uv_pip(fresh, "sync", "--offline", "--preview-features", "pylock", str(lock), env=uv_pip_env)
    r = subprocess.run([str(python_of(fresh)), "-c", "import torch; print(torch.__version__, torch.ones(2).sum().item())"],
                       capture_output=True, text=True)
    assert r.stdout.split() == ["2.13.0+cpu", "2.0"], r.stderr
    new = ev_json(vault, "show", ev_json(vault, "snap", "--venv", fresh)["id"])
    assert _pkg(new, "torch")["state_id"] == t["state_id"]


@pytest.mark.parametrize("command", [["snap", "--no-caches"], ["cache", "snap"], ["guard", "--yes", "--", "true"]],
                         ids=["snap", "cache-snap", "guard"])
def test_a_snap_behind_a_held_vault_lock_says_it_waits(tmp_path, make_venv, wheelhouse, command):
    """A gc holds the vault lock exclusively: a snap (a cache snap, a guard) waits for it, and says so on
    stderr at once instead of waiting in silence (helper 19: a status waited 7.7 s printing nothing; helper 21:
    commands that open the vault without the CLI's warnings said nothing); then it goes on and succeeds."""
    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--venv", venv, "--no-caches")
    words = command[:command.index("--")] if "--" in command else command
    code, _out, err = behind_a_gc(vault, [*words, "--venv", venv, *command[len(words):]], keep_last=None)
    assert code == 0, err
    assert "Traceback" not in err


def test_a_dist_info_without_its_metadata_is_read_by_its_folder_name_only_while_record_lists_it(tmp_path, make_venv,
                                                                                                  wheelhouse):
    """METADATA gone, RECORD listing it (an installer's cache it linked into, pruned): the distribution is
    the one its folder names, its METADATA a missing file that ``status`` shows and a restore writes back
    (before: every command failed, "METADATA is missing"). A METADATA RECORD never listed, or a folder name
    that names no version, is still refused in one line."""
    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    di = next(site_packages(venv).glob("smallpkg-*.dist-info"))
    meta = (di / "METADATA").read_bytes()
    (di / "METADATA").unlink()
    status = ev_json(vault, "status", "--venv", venv)
    assert status["empty"] is False and "smallpkg" in json.dumps(status), status
    assert f"{di.name}/METADATA" in json.dumps(status)
    assert ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")["verified"] is True
    assert (di / "METADATA").read_bytes() == meta
    record = (di / "RECORD").read_text()
    (di / "METADATA").unlink()
    (di / "RECORD").write_text("".join(ln for ln in record.splitlines(keepends=True) if "/METADATA," not in ln))
    assert_one_line_error(ev(vault, "snap", "--venv", venv, check=False), f"{di}/METADATA is missing")
    (di / "RECORD").write_text(record)
    for odd in ("smallpkg.dist-info", "smallpkg- .dist-info", "..-1.dist-info", "smallpkg-1 x.dist-info"):
        # names that give no name and version (helper 38: '' and '-' did), RECORD listing the folder's METADATA
        text = (di / "RECORD").read_text().replace(f"{di.name}/", f"{odd}/")
        di = di.rename(di.with_name(odd))
        (di / "RECORD").write_text(text)
        assert f"{odd}/METADATA," in text
        assert_one_line_error(ev(vault, "snap", "--venv", venv, check=False), f"{di}/METADATA is missing")


def test_a_dist_info_folder_whose_name_is_not_utf8_is_left_out_with_a_warning(tmp_path, make_venv, wheelhouse):
    """A dist-info folder named with bytes that are not UTF-8 (helper 38): the snap ended in "internal error:
    UnicodeEncodeError" (a warning naming it could not be written into the snapshot). It is left out with a
    warning, written as typed (``\\xff``); the rest of the environment snaps and restores."""
    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    di = next(site_packages(venv).glob("smallpkg-*.dist-info"))
    odd = os.fsencode(di.with_name("smallpkg-1.0")) + b"\xff.dist-info"
    os.rename(os.fsencode(di), odd)
    vault = tmp_path / "vault"
    doc = ev_json(vault, "snap", "--no-caches", "--venv", venv)
    line = [w for w in doc["warnings"] if "not UTF-8 text" in w]
    assert len(line) == 1 and "smallpkg-1.0\\xff.dist-info" in line[0], doc["warnings"]
    assert "smallpkg" not in [p["name"] for p in ev_json(vault, "show", doc["id"])["packages"]]
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True


def _assert_links_stored_as_files(vault: Path, venv: Path, name: str, linked: list[Path]) -> None:
    """A first snap of ``venv`` warns of nothing and stores each of ``linked`` (package ``name``'s links into an
    installer's cache) as the file it leads to: its bytes and mode, no link."""
    from envvault.vault.store import Vault

    doc = ev_json(vault, "snap", "--no-caches", "--venv", venv)
    assert not doc["warnings"], doc["warnings"]
    man = Vault.open(vault).load_manifest(_pkg(ev_json(vault, "show", doc["id"]), name)["manifest"])
    by_path = {f.path: f for f in man.files}
    for p in linked:
        f = by_path[str(p.relative_to(venv))]
        assert f.link is None and f.state == "ok" and f.chunks is not None and f.mode == p.stat().st_mode & 0o7777, f


def _links_of(venv: Path) -> list[Path]:
    return [p for p in site_packages(venv).rglob("*") if p.is_symlink()]


def test_files_linked_from_an_installers_cache_are_stored_and_restored_once_it_is_pruned(tmp_path, make_venv, wheelhouse):
    """``uv pip install --link-mode symlink`` links every file, METADATA included, from uv's cache. A snapshot
    recorded the links and stored no bytes; once the cache was pruned (``uv cache clean``) the package was
    gone, ``status`` failed ("METADATA is missing") and a restore refused to make links out of the
    environment: nothing could bring it back. A link to a file holding RECORD's bytes is now stored as that
    file; a dist-info whose METADATA is gone while RECORD lists it is read by its folder's name; the restore
    writes regular files and the package imports again."""
    import shutil

    venv = make_venv("uv")
    cache = tmp_path / "uv-cache"
    uv_install(venv, "--link-mode", "symlink", wheelhouse[C.SMALL_01], cache_dir=cache)
    linked = _links_of(venv)
    assert linked and all(os.readlink(p).startswith(str(cache)) for p in linked)
    assert any(p.name == "METADATA" for p in linked)
    vault = tmp_path / "vault"
    _assert_links_stored_as_files(vault, venv, "smallpkg", linked)
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True

    shutil.rmtree(cache)  # the cache pruned: every link dangles
    assert not any(p.exists() for p in linked)
    probe = [str(python_of(venv)), "-c", "import smallpkg; assert smallpkg.__file__"]  # (else a namespace package)
    assert subprocess.run(probe, capture_output=True).returncode != 0
    status = ev(vault, "status", "--venv", venv, "--exit-code", check=False)
    assert status.returncode == 1 and "smallpkg" in status.stdout, status.stderr
    done = ev_json(vault, "restore", "latest", "--venv", venv)
    assert done["verified"] is True, done
    assert not _links_of(venv) and all(p.is_file() for p in linked)
    assert subprocess.run(probe, capture_output=True).returncode == 0
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True


def _all_object_bytes(vault: Path) -> list[bytes]:
    from envvault.vault.store import Vault

    v = Vault.open(vault)
    return [bytes(v.get(oid)) for oid in v.index()]


_LINKED_AFTER_PLANNING = """
import os, sys
from envvault.snap import manifests as M
path, secret = sys.argv[2], sys.argv[3]
planned = M.ManifestBuilder.plan_entry
def then_link(self, dist, rec, *rest):
    got = planned(self, dist, rec, *rest)
    if self.absolute(dist, rec) == path:  # another process makes it a link to a secret once it was planned
        os.symlink(secret, path + ".new")
        os.replace(path + ".new", path)
    return got
M.ManifestBuilder.plan_entry = then_link
from envvault.entry import main
sys.argv = ["envvault", "snap", "--no-caches", "--venv", sys.argv[1]]
main()
"""


def test_a_linked_files_check_and_its_stored_bytes_are_one_file(tmp_path, make_venv):
    """Attacks on a link out of the environment stored as its bytes (helper 38): a RECORD row of an empty file
    linked to ``/proc/self/environ`` (its size says 0: the check read no byte and passed, then the read that
    stored it took the process's environment, a token with it, into the vault); a link retargeted to a secret
    between the check of its bytes and the read that stores them (the read opened the path again). Now the
    read takes only the file of the stat key planned, hashes exactly RECORD's size and wants the file to end
    there before it stores a byte, and stores through the same descriptor: the snap records the first as a link
    and refuses the second; neither secret reaches the vault."""
    from envvault.vault.store import Vault

    wheels = tmp_path / "wheels"
    big = os.urandom(9 << 20)  # a large file too: cut in chunks (at most 4 MiB each: 3 or more), read through a buffered stream
    build_wheel(wheels, "linky", "1.0", {"linky/__init__.py": b"X = 1\n", "linky/py.typed": b"",
                                         "linky/mod.py": b"Y = 2\n" * 1000, "linky/blob.bin": big})
    venv = make_venv("uv")
    cache = tmp_path / "uv-cache"
    uv_install(venv, "--link-mode", "symlink", "linky", find_links=[wheels], cache_dir=cache)
    pkg = site_packages(venv) / "linky"
    (pkg / "py.typed").unlink()
    (pkg / "py.typed").symlink_to("/proc/self/environ")
    vault = tmp_path / "vault"
    token = "envvault-test-token-5d1c"
    doc = json.loads(ev(vault, "snap", "--no-caches", "--json", "--venv", venv,
                        env=ev_env(vault, SECRET_TOKEN=token)).stdout)
    assert any("py.typed -> /proc/self/environ" in w for w in doc["warnings"]), doc["warnings"]
    man = Vault.open(vault).load_manifest(_pkg(ev_json(vault, "show", doc["id"]), "linky")["manifest"])
    entry = next(f for f in man.files if f.path.endswith("linky/py.typed"))
    assert entry.link == "/proc/self/environ" and entry.chunks is None
    blob = next(f for f in man.files if f.path.endswith("linky/blob.bin"))
    assert blob.link is None and blob.state == "ok" and len(blob.chunks) > 1
    assert not any(token.encode() in data for data in _all_object_bytes(vault))

    secret = tmp_path / "id_rsa"
    secret.write_bytes(b"-----BEGIN PRIVATE KEY----- envvault-test-secret\n" * 50)
    for name in ("mod.py", "blob.bin"):  # a small file, a large one
        other = make_venv("uv")
        uv_install(other, "--link-mode", "symlink", "linky", find_links=[wheels], cache_dir=cache)
        link = site_packages(other) / "linky" / name
        race_vault = tmp_path / f"race-{name}"
        proc = subprocess.run([sys.executable, "-c", _LINKED_AFTER_PLANNING, str(other), str(link), str(secret)],
                              env=ev_env(race_vault), capture_output=True, text=True)
        assert os.readlink(link) == str(secret)  # the retarget happened
        assert proc.returncode == 7 and "changed while it was being read" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        assert not any(b"envvault-test-secret" in data for data in _all_object_bytes(race_vault))


_REWRITE = """
import os, sys
from envvault.vault import ingest
target, marker = sys.argv[2], sys.argv[3].encode()
def rewrite():  # another process writes the file the link leads to, in place (its inode kept)
    size = os.path.getsize(target)
    with open(target, "r+b") as f:
        f.write((marker * (size // len(marker) + 1))[:size])
for name in [n for n in ("sha256_prefix", "read_exactly", "_read_exactly", "_cut_named") if hasattr(ingest, n)]:  # (the 1st: 36a853d's)
    def read_then_rewrite(*args, _read=getattr(ingest, name), **kw):
        got = _read(*args, **kw)
        rewrite()
        return got
    setattr(ingest, name, read_then_rewrite)
from envvault.entry import main
sys.argv = ["envvault", "snap", "--no-caches", "--venv", sys.argv[1]]
main()
"""


def test_a_linked_file_written_in_place_after_its_read_stores_none_of_the_new_bytes(tmp_path, make_venv):
    """The file a link leads to, written in place (the same inode) by another process once envvault has read
    it: the first version of the pinned read read it a second time to store it and stored what it found then
    (helper 40). Now a small file is stored from the one read that was checked, and a large one's chunks,
    re-read when they are packed, are stored only while they still have the ids the checked read gave them
    (else the snap fails, exit 7): the new bytes never reach the vault."""
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "linky", "1.0", {"linky/__init__.py": b"X = 1\n", "linky/mod.py": b"Y = 2\n" * 1000,
                                         "linky/blob.bin": os.urandom(3 << 20)})
    for name, code in (("mod.py", 0), ("blob.bin", 7)):
        venv = make_venv("uv")
        uv_install(venv, "--link-mode", "symlink", "linky", find_links=[wheels], cache_dir=tmp_path / f"uvc-{name}")
        for other in list(site_packages(venv).rglob("*")):  # only this one file stays a link to the cache
            if other.name != name and other.is_symlink():
                data = other.read_bytes()
                other.unlink()
                other.write_bytes(data)
        target = os.readlink(site_packages(venv) / "linky" / name)
        vault = tmp_path / f"vault-{name}"
        proc = subprocess.run([sys.executable, "-c", _REWRITE, str(venv), target, "NEWBYTES-5e2a"],
                              env=ev_env(vault), capture_output=True, text=True)
        assert Path(target).read_bytes().startswith(b"NEWBYTES-5e2a")  # the rewrite happened
        assert proc.returncode == code and "Traceback" not in proc.stderr, proc.stderr
        if code:
            assert "changed while it was being read" in proc.stderr, proc.stderr
        assert not any(b"NEWBYTES-5e2a" in data for data in _all_object_bytes(vault))


def test_a_file_swapped_for_a_link_after_it_was_planned_is_not_followed(tmp_path, make_venv, wheelhouse):
    """A package file that was a regular file when the scan planned its read and is a symlink to a secret when
    the read opens it: the read followed the link and stored the secret (helper 40). A planned regular file is
    opened without following a link: the snap fails, exit 7, and no byte of the secret is stored."""
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    module = next(p for p in site_packages(venv).glob("smallpkg/*.py"))
    secret = tmp_path / "id_rsa"
    secret.write_bytes(b"-----BEGIN PRIVATE KEY----- envvault-test-swap\n" * 40)
    vault = tmp_path / "vault"
    proc = subprocess.run([sys.executable, "-c", _LINKED_AFTER_PLANNING, str(venv), str(module), str(secret)],
                          env=ev_env(vault), capture_output=True, text=True)
    assert module.is_symlink()  # the swap happened
    assert proc.returncode == 7 and "did it change while envvault read" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(b"envvault-test-swap" in data for data in _all_object_bytes(vault))


def test_a_link_to_a_file_of_another_size_than_records_is_never_read(tmp_path, make_venv, wheelhouse):
    """A package file replaced by a link to a file of another size than RECORD's (here a sparse file of 1 TiB)
    was read whole to hash it, on every scan whose cache was stale (helper 40: 8 GiB, 22 s; a larger one
    hangs the command). It is not RECORD's file whatever it holds: recorded as a modified link, unread."""
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    module = next(p for p in site_packages(venv).glob("smallpkg/*.py"))
    huge = tmp_path / "huge.bin"
    with open(huge, "wb") as f:
        f.truncate(1 << 40)
    module.unlink()
    module.symlink_to(huge)
    vault = tmp_path / "vault"
    for command in (["snap", "--no-caches"], ["status"]):
        doc = json.loads(ev(vault, *command, "--json", "--venv", venv, timeout=120, check=False).stdout)
        assert doc, command
    status = ev_json(vault, "status", "--venv", venv)
    assert status["empty"] is True  # (the same link, the same entry)


def test_a_link_out_of_the_environment_to_other_bytes_stays_a_link_its_bytes_never_stored(tmp_path, make_venv,
                                                                                             wheelhouse):
    """A package file a user replaced by a link leading out of the environment to other bytes (a secret, say)
    is recorded as a link, named in one warning per distribution, and its bytes are not stored in the vault
    (which may be shared): only a link to RECORD's own bytes is stored as a file."""
    from envvault.model.encoding import object_id
    from envvault.vault.store import Vault

    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    module = next(p for p in site_packages(venv).glob("smallpkg/*.py"))
    secret = tmp_path / "secret.txt"  # of the module's very size: only its bytes tell it apart
    size = module.stat().st_size
    secret.write_bytes((b"not the package's bytes: a private key, say\n" * (size // 40 + 1))[:size])
    module.unlink()
    module.symlink_to(secret)
    vault = tmp_path / "vault"
    proc = ev(vault, "snap", "--no-caches", "--venv", venv)
    line = [ln for ln in proc.stderr.splitlines() if "symlinks that lead out of the environment" in ln]
    assert len(line) == 1 and line[0].startswith("warning: smallpkg 0.1.0: 1 file(s)") and str(secret) in line[0]
    sid = ev_json(vault, "list")["snapshots"][0]["id"]
    v = Vault.open(vault)
    man = v.load_manifest(_pkg(ev_json(vault, "show", sid), "smallpkg")["manifest"])
    entry = next(f for f in man.files if f.path == str(module.relative_to(venv)))
    assert entry.link == str(secret) and entry.state == "modified" and entry.chunks is None
    assert not v.has(object_id(secret.read_bytes()))
    copied = make_venv("uv")
    uv_install(copied, wheelhouse[C.SMALL_01])
    assert "lead out of" not in ev(vault, "snap", "--no-caches", "--venv", copied).stderr


_PDM_LINKED = ("requests-2.34.2", "urllib3-2.8.0", "idna-3.20", "certifi-2026.7.22")


def test_a_pdm_install_linked_into_its_cache_is_stored_and_restored_once_the_cache_is_pruned(tmp_path, make_venv):
    """pdm with its install cache on (``install.cache_method = "symlink"``, its default then) makes every file
    a symlink into its package cache and writes ``sha256=`` (no hash) for each in RECORD. Every snap of such
    an environment failed ("RECORD is garbled ... has a bad hash 'sha256='", exit 7). Now those rows read as
    rows without a hash, and take their hashes from the RECORD of the cached copy pdm's ``REFER_TO`` names,
    so each link is stored as the package's file, checked; once the cache is pruned ``status`` names the
    files and ``restore latest`` brings back working packages (real requests and its dependencies from this
    machine's index). The build id stays that of RECORD as written: the same with the cache gone."""
    import glob
    import shutil

    venv = make_venv("uv")
    uv_install(venv, "--link-mode", "copy", "charset-normalizer", index_url="file:///opt/pypi/simple",
               cache_dir=tmp_path / "uvc")
    cache = tmp_path / "pdm-cache" / "packages"
    for stem in _PDM_LINKED:
        (wheel,) = glob.glob(f"/opt/pypi/files/{stem}-*.whl")
        pdm_link_install(venv, wheel, cache)
    linked = _links_of(venv)
    assert len(linked) > 50 and any(p.name == "METADATA" for p in linked)
    check = [str(python_of(venv)), "-c", "import requests, requests.adapters, urllib3, idna; print(requests.__version__)"]
    assert subprocess.run(check, capture_output=True, text=True).stdout.strip() == "2.34.2"
    vault = tmp_path / "vault"
    _assert_links_stored_as_files(vault, venv, "requests",
                                  [p for p in linked if "requests" in p.relative_to(site_packages(venv)).parts[0]])
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True

    shutil.rmtree(cache.parent)  # ``pdm cache clear``: every link dangles
    assert subprocess.run(check, capture_output=True).returncode != 0
    status = ev_json(vault, "status", "--venv", venv)
    assert sorted(c["name"] for c in status["packages"]["changed"]) == ["certifi", "idna", "requests", "urllib3"], status
    assert all(c["kind"] == "edited" and not c["build_changed"] for c in status["packages"]["changed"]), status
    done = ev_json(vault, "restore", "latest", "--venv", venv)
    assert done["verified"] is True, done
    assert not _links_of(venv)
    assert subprocess.run(check, capture_output=True, text=True).stdout.strip() == "2.34.2"
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True


def test_a_hashless_link_stores_no_bytes_nobody_named_first(tmp_path, make_venv):
    """Attacks on the hashes a pdm cache gives (a site folder may be writable by others, a ``REFER_TO`` may name
    any folder): a RECORD row without a hash for a link to a secret that the cached RECORD does not name; one
    that the cached RECORD names with a hash other than the secret's (whoever wrote it did not know the
    secret); a ``REFER_TO`` that is a FIFO (never waited on). Each snap finishes; no byte of the secret
    reaches the vault (the links are recorded as links, with the warning that a restore refuses them)."""
    from envvault.vault.store import Vault

    secret = tmp_path / "id_ed25519"
    secret.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY----- envvault-test-secret\n" * 8)
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "linky", "1.0", {"linky/__init__.py": b"X = 1\n", "linky/mod.py": b"Y = 2\n" * 100})
    (wheel,) = wheels.glob("linky-*.whl")
    size = secret.stat().st_size
    for case in ("unnamed", "wrong-hash", "fifo"):
        venv = make_venv("uv", name=f"venv-{case}")
        cache = tmp_path / f"cache-{case}"
        dist_info = pdm_link_install(venv, wheel, cache)
        (site_packages(venv) / "linky" / "key.txt").symlink_to(secret)
        record = (dist_info / "RECORD").read_text()
        (dist_info / "RECORD").write_text(record.replace("linky/mod.py,", f"linky/key.txt,sha256=,{size}\nlinky/mod.py,"))
        if case == "wrong-hash":
            cached = next(cache.iterdir()) / dist_info.name / "RECORD"
            cached.write_text(cached.read_text() + f"linky/key.txt,sha256={'A' * 43},{size}\n")
        if case == "fifo":
            (dist_info / "REFER_TO").unlink()
            os.mkfifo(dist_info / "REFER_TO")
        vault = tmp_path / f"vault-{case}"
        doc = ev_json(vault, "snap", "--no-caches", "--venv", venv, timeout=120)
        assert any("lead out of the environment" in w for w in doc["warnings"]), (case, doc["warnings"])
        man = Vault.open(vault).load_manifest(_pkg(ev_json(vault, "show", doc["id"]), "linky")["manifest"])
        key = next(f for f in man.files if f.path.endswith("linky/key.txt"))
        assert key.link == str(secret) and key.chunks is None, (case, key)
        assert not any(b"envvault-test-secret" in data for data in _all_object_bytes(vault)), case


def _linky(tmp_path: Path, x: str) -> Path:
    """A ``linky 1.0`` wheel whose ``__init__.py`` holds ``X = <x>`` (one build per ``x``, all of one size)."""
    return build_wheel(tmp_path / f"wheels-{x}", "linky", "1.0", {"linky/__init__.py": f"X = {x}\n".encode()})


def _x_of(venv: Path) -> str:
    got = subprocess.run([str(python_of(venv)), "-c", "import linky; print(linky.X)"], capture_output=True, text=True)
    return got.stdout.strip() or got.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("change", ["another build in another cache folder", "the cached file and RECORD edited",
                                    "the cached RECORD gone, the file replaced"])
def test_a_pdm_linked_package_whose_cache_changed_is_changed(tmp_path, make_venv, change):
    """Helper 41: RECORD gives pdm's links no hash and the build id is that RECORD's, so a package pdm installed
    again from another build of the same version (files of the same sizes, another cache folder), or its
    cached file edited with the cached RECORD to match, or the cached RECORD gone and the file replaced, was
    "unchanged" to status, and a restore had nothing to do. The bytes of a linked row now enter the state id
    (a link whose row has no hash and whose file is not of RECORD's size is modified): status names the
    package, and the restore brings back the snapshot's bytes as files."""
    import hashlib
    import base64

    venv = make_venv("uv")
    dist_info = pdm_link_install(venv, _linky(tmp_path, "1"), tmp_path / "cache-1")
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--no-caches", "--venv", venv)
    assert _x_of(venv) == "1" and ev_json(vault, "status", "--venv", venv)["empty"] is True
    cached = tmp_path / "cache-1" / "linky-1.0-py3-none-any"
    if change == "another build in another cache folder":  # ``pdm remove linky`` then ``pdm add`` of the other
        shutil.rmtree(site_packages(venv) / "linky")
        shutil.rmtree(dist_info)
        pdm_link_install(venv, _linky(tmp_path, "2"), tmp_path / "cache-2")
    elif change == "the cached file and RECORD edited":
        (cached / "linky" / "__init__.py").write_bytes(b"X = 3\n")
        digest = base64.urlsafe_b64encode(hashlib.sha256(b"X = 3\n").digest()).rstrip(b"=").decode()
        rows = (cached / dist_info.name / "RECORD").read_text().splitlines()
        (cached / dist_info.name / "RECORD").write_text("".join(
            (f"linky/__init__.py,sha256={digest},6" if r.startswith("linky/__init__.py,") else r) + "\n" for r in rows))
    else:
        (cached / dist_info.name / "RECORD").unlink()
        (cached / "linky" / "__init__.py").write_bytes(b"X = 'other bytes'\n")
    assert _x_of(venv) != "1"
    status = ev(vault, "status", "--venv", venv, "--exit-code", check=False)
    assert status.returncode == 1 and "linky" in status.stdout, (status.stdout, status.stderr)
    assert "no differences" not in status.stdout
    res = ev_json(vault, "restore", "latest", "--venv", venv)
    assert res["verified"] is True, res
    assert _x_of(venv) == "1" and ev_json(vault, "status", "--venv", venv)["empty"] is True
