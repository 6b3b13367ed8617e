"""The quick status (issue 11; envvault/quick.py, envvault/snap/verdict.py): an unchanged environment answered
from the verdict of the last full status, before the CLI and the model are imported, and every change after
that verdict still seen, with the answer the full command gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import catalogue as C
from fixtures import site_packages, uv_install, uv_pip
from tests.evtools import ev, ev_env, ev_json

# What the full command imports and the quick one must not: the CLI, the model, the diff, the vault's store.
_FULL_ONLY = ("click", "envvault.cli", "envvault.diff", "envvault.model.snapshot", "envvault.vault.store",
              "envvault.vault.ingest", "envvault.snap.scan")


def _status(vault: Path, venv: Path, *extra: str, quick: bool = True) -> tuple[int, str, str, bool, set]:
    """``status --venv venv --exit-code`` as users run it: (exit code, stdout, stderr, answered quickly: the
    CLI was never imported, the modules imported)."""
    env = ev_env(vault, **({} if quick else {"ENVVAULT_QUICK_STATUS": "0"}))
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "envvault", *extra, "status", "--venv",
                           str(venv), "--exit-code"], capture_output=True, text=True, env=env, timeout=300)
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    assert "envvault.quick" in imported  # the measurement sees the command's imports
    err = "\n".join(ln for ln in proc.stderr.splitlines() if not ln.startswith("import time:"))
    assert "Traceback" not in err, err
    return proc.returncode, proc.stdout, err, not any(name in imported for name in _FULL_ONLY), imported


def _agrees(vault: Path, venv: Path) -> tuple[int, str, bool]:
    """The status with the quick path allowed, checked to answer as the full command does; (code, stdout,
    quick). The full command runs second: it may record a verdict the first must not have needed."""
    code, out, _err, quick, _ = _status(vault, venv)
    full_code, full_out, _err, full_quick, _ = _status(vault, venv, quick=False)
    assert not full_quick
    assert (code, out) == (full_code, full_out)
    return code, out, quick


def _venv_with_two(make_venv, wheelhouse, kind: str = "uv") -> Path:
    venv = make_venv(kind)
    if kind == "uv":
        uv_install(venv, str(wheelhouse[C.SMALL_01]), str(wheelhouse[C.NS_ALPHA]))
    else:
        from fixtures import pip_install

        pip_install(venv, str(wheelhouse[C.SMALL_01]), str(wheelhouse[C.NS_ALPHA]))
    return venv


@pytest.mark.parametrize("kind", ["uv", "venv"])
def test_a_second_unchanged_status_is_answered_before_the_cli(tmp_path, make_venv, wheelhouse, kind):
    venv = _venv_with_two(make_venv, wheelhouse, kind)
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--venv", venv, "--no-caches")["id"]
    code, out, quick = _agrees(vault, venv)  # the snap left the verdict
    assert (code, quick) == (0, True)
    assert out == f"{venv}: unchanged since snapshot {sid[:12]}\n"
    (next((vault / "state").glob("verdict-*.json"))).unlink()
    code, again, _err, quick, _ = _status(vault, venv)
    assert (code, again, quick) == (0, out, False)  # no verdict: the full command answers, and leaves one
    code, again, _err, quick, imported = _status(vault, venv)
    assert (code, again, quick) == (0, out, True)
    # nor what only the records of the full path need (dataclasses and inspect: 5-7 ms on the GPU host)
    assert not imported & {"dataclasses", "inspect", "hashlib", "subprocess"}, imported
    # --vault on the command line, in both spellings, is taken too
    assert _status(tmp_path / "elsewhere", venv, "--vault", str(vault))[::3] == (0, True)
    assert _status(tmp_path / "elsewhere", venv, f"--vault={vault}")[::3] == (0, True)


def _edit_in_place(venv: Path) -> None:
    path = site_packages(venv) / "smallpkg" / "__init__.py"
    data = path.read_bytes()
    path.write_bytes(data[:-1] + (b"#" if data[-1:] != b"#" else b"!"))  # same size, another byte


def _install_other(venv: Path, wheelhouse) -> None:
    uv_install(venv, str(wheelhouse[C.NS_BETA]))


def _uninstall(venv: Path, wheelhouse) -> None:
    uv_pip(venv, "uninstall", "nsa-alpha")


def _upgrade(venv: Path, wheelhouse) -> None:
    uv_install(venv, str(wheelhouse[C.SMALL_02]))


def _delete_file(venv: Path, wheelhouse) -> None:
    (site_packages(venv) / "smallpkg" / "__init__.py").unlink()


def _file_to_link(venv: Path, wheelhouse) -> None:
    """A stored file replaced by a symlink to other bytes (helper 19, F1: every check said unchanged)."""
    path = site_packages(venv) / "smallpkg" / "__init__.py"
    (path.parent / "evil.py").write_text("raise SystemExit('not smallpkg')\n")
    path.unlink()
    path.symlink_to("evil.py")


def _file_to_folder(venv: Path, wheelhouse) -> None:
    """A stored file replaced by a folder of that name (helper 19, F3: read as one of virtualenv's folder rows)."""
    path = site_packages(venv) / "smallpkg" / "__init__.py"
    path.unlink()
    path.mkdir()


@pytest.mark.parametrize("change", [
    lambda venv, wh: _edit_in_place(venv), _install_other, _uninstall, _upgrade, _delete_file, _file_to_link,
    _file_to_folder,
], ids=["edit-in-place", "install", "uninstall", "upgrade", "delete-a-file", "file-to-link", "file-to-folder"])
def test_every_change_after_a_verdict_is_seen(tmp_path, make_venv, wheelhouse, change):
    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--venv", venv, "--no-caches")
    _status(vault, venv)  # records the verdict
    assert _status(vault, venv)[3]
    change(venv, wheelhouse)
    code, out, quick = _agrees(vault, venv)
    assert (code, quick) == (1, False)
    assert "changed since snapshot" in out


@pytest.mark.parametrize("change", [_file_to_link, _file_to_folder], ids=["file-to-link", "file-to-folder"])
def test_a_restore_puts_back_the_file_a_link_or_a_folder_replaced(tmp_path, make_venv, wheelhouse, change):
    """The snapshot's regular file comes back (it said "already matches" and left the link or the folder)."""
    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    path = site_packages(venv) / "smallpkg" / "__init__.py"
    data = path.read_bytes()
    sid = ev_json(vault, "snap", "--venv", venv, "--no-caches")["id"]
    change(venv, wheelhouse)
    ev(vault, "restore", sid, "--venv", venv, "--no-backup")
    assert not path.is_symlink() and path.is_file() and path.read_bytes() == data
    assert _agrees(vault, venv)[0] == 0


def test_a_folder_holding_files_where_a_file_goes_is_refused_before_anything_is_written(tmp_path, make_venv, wheelhouse):
    """A stored file replaced by a folder the user put files in: the restore refuses at once (exit 3), dry
    run included, with nothing written, never part way through its commit (helper 21, F4: exit 7 after other
    files were already put back); the folder and its files are kept."""
    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--venv", venv, "--no-caches")["id"]
    _edit_in_place(venv)  # another change the restore would make first
    edited = (site_packages(venv) / "smallpkg" / "__init__.py").read_bytes()
    other = next(p for p in (site_packages(venv) / "smallpkg").iterdir() if p.suffix == ".py" and p.name != "__init__.py")
    other.unlink()
    other.mkdir()
    (other / "mine.txt").write_text("keep\n")
    for dry in (["--dry-run"], []):
        proc = ev(vault, "restore", sid, "--venv", venv, *dry, check=False)
        assert proc.returncode == 3, proc.stderr
        assert "non-empty directory where the snapshot has a file" in proc.stderr
    assert (other / "mine.txt").read_text() == "keep\n"
    assert (site_packages(venv) / "smallpkg" / "__init__.py").read_bytes() == edited  # nothing written
    assert not (venv / ".envvault-restore.json").exists()


def test_a_venv_setting_changed_in_pyvenv_cfg_is_a_change_and_restored(tmp_path, make_venv, wheelhouse):
    """include-system-site-packages flipped (helper 19, F4: recorded by the next snap, never reported): status
    and diff name it, a restore in place puts the snapshot's value back and then verifies."""
    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--venv", venv, "--no-caches")["id"]
    cfg = venv / "pyvenv.cfg"
    text = cfg.read_text()
    assert "include-system-site-packages = false" in text
    cfg.write_text(text.replace("include-system-site-packages = false", "include-system-site-packages = true"))
    code, out, _quick = _agrees(vault, venv)
    assert code == 1 and "include-system-site-packages false -> true" in out
    dry = ev(vault, "restore", sid, "--venv", venv, "--dry-run").stdout
    assert "include-system-site-packages true -> false" in dry and cfg.read_text() != text
    done = ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")
    assert done["verified"] and done["settings_set"] == ["include-system-site-packages = false"]
    assert "include-system-site-packages = false" in cfg.read_text()
    assert _agrees(vault, venv)[0] == 0
    assert ev(vault, "diff", sid, "current", "--venv", venv).stdout.startswith("no differences")


def test_a_restore_killed_before_it_sets_pyvenv_cfg_leaves_the_setting_to_the_next_run(tmp_path, make_venv, wheelhouse):
    """pyvenv.cfg is rewritten after the commit and the journal does not name it (inplace.py): a restore killed
    in its commit leaves the old setting, which status still reports and the next restore sets."""
    import signal

    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--venv", venv, "--no-caches")["id"]
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace("include-system-site-packages = false", "include-system-site-packages = true"))
    init = site_packages(venv) / "smallpkg" / "__init__.py"
    init.write_bytes(init.read_bytes() + b"# edited\n")
    killed = ev(vault, "restore", sid, "--venv", venv, "--no-backup", check=False,
                env=ev_env(vault, ENVVAULT_TEST_CRASH_AT="commit:1"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "include-system-site-packages = true" in cfg.read_text()  # killed before the file was rewritten
    status = ev(vault, "status", "--venv", venv, check=False)
    assert "include-system-site-packages false -> true" in status.stdout, status.stdout
    done = ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")
    assert done["verified"] and done["settings_set"] == ["include-system-site-packages = false"]
    assert "include-system-site-packages = false" in cfg.read_text()
    assert _agrees(vault, venv)[0] == 0


def test_a_folder_pip_moved_aside_is_left_out_with_a_warning(tmp_path, make_venv, wheelhouse):
    """A dist-info pip renamed to ``~...`` while it uninstalls (half emptied: no METADATA) made status and
    snap fail with exit 7 and "reinstall that package" (helper 19, F6); pip leaves it out as an invalid
    distribution, and so does the scan, with a warning."""
    import shutil

    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--venv", venv, "--no-caches")
    di = next(site_packages(venv).glob("smallpkg-*.dist-info"))
    stash = di.with_name("~" + di.name[1:])
    shutil.copytree(di, stash)
    (stash / "METADATA").unlink()
    code, out, _quick = _agrees(vault, venv)
    assert code == 0 and "unchanged" in out
    got = ev_json(vault, "snap", "--venv", venv, "--no-caches")
    assert [w for w in got["warnings"] if stash.name in w and "left out" in w], got["warnings"]
    assert got["packages"] == 2


@pytest.mark.parametrize("first", ["regular", "link"])
def test_a_link_is_checked_through_on_every_scan(tmp_path, make_venv, wheelhouse, first):
    """A link to the bytes RECORD promises is as good as the file (uv's symlink link mode), and the quick
    status answers for it (a stat cache group follows links); what it leads to changing later, the link
    retargeted or dangling, is seen on the next status, whether the snap found the file or the link."""
    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    path = site_packages(venv) / "smallpkg" / "__init__.py"
    copy = path.parent / "copy.py"
    copy.write_bytes(path.read_bytes())

    def make_link():
        path.unlink()
        path.symlink_to("copy.py")

    if first == "link":
        make_link()
    ev_json(vault, "snap", "--venv", venv, "--no-caches")
    if first == "regular":
        _status(vault, venv)  # a verdict and groups made while it was a file
        make_link()
        code, out, _quick = _agrees(vault, venv)
        assert code == 0 and "unchanged" in out  # the same bytes through a link
    assert _agrees(vault, venv)[0] == 0  # the same bytes: unchanged
    assert _status(vault, venv)[3], "answered quickly: the group follows the link"
    copy.write_bytes(copy.read_bytes() + b"# edited\n")
    code, out, _quick = _agrees(vault, venv)
    assert code == 1 and "smallpkg/__init__.py" in out
    copy.write_bytes(copy.read_bytes()[:-len(b"# edited\n")])
    assert _agrees(vault, venv)[0] == 0
    path.unlink()
    path.symlink_to("nowhere.py")  # dangling
    code, out, _quick = _agrees(vault, venv)
    assert code == 1 and "smallpkg/__init__.py" in out


def test_a_new_snapshot_or_a_restore_moves_the_baseline(tmp_path, make_venv, wheelhouse):
    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    first = ev_json(vault, "snap", "--venv", venv, "--no-caches")["id"]
    _upgrade(venv, wheelhouse)
    second = ev_json(vault, "snap", "--venv", venv, "--no-caches", "-m", "after the upgrade")["id"]
    _status(vault, venv)
    assert _status(vault, venv)[3]
    # a restore of the first snapshot: its marker makes it the baseline (and its verdict answers at once)
    ev(vault, "restore", first, "--venv", venv, "--no-backup")
    code, out, quick = _agrees(vault, venv)
    assert (code, quick) == (0, True) and first[:12] in out
    # a snapshot of another environment changes the vault's snapshots: the verdict is not used, the answer stays
    other = _venv_with_two(make_venv, wheelhouse)
    ev_json(vault, "snap", "--venv", other, "--no-caches")
    code, again, quick = _agrees(vault, venv)
    assert (code, again, quick) == (0, out, False)
    # a new snapshot of this environment: the baseline is now that one (and the snap left its verdict)
    third = ev_json(vault, "snap", "--venv", venv, "--no-caches")["id"]
    code, out, quick = _agrees(vault, venv)
    assert (code, quick) == (0, True) and third[:12] in out and second != third
    # a lock-only snapshot leaves none: its status says how contents were compared
    ev_json(vault, "snap", "--venv", venv, "--lock-only")
    code, out, quick = _agrees(vault, venv)
    assert (code, quick) == (0, False) and "lock-only" in out
    assert _status(vault, venv)[1:4:2] == (out, True)


@pytest.mark.parametrize("backup", [True, False], ids=["default-backup", "no-backup"])
def test_the_first_status_after_a_restore_is_answered_from_the_restore(tmp_path, make_venv, wheelhouse, backup):
    """The restore's verify scan found the environment equal to the snapshot: it leaves the verdict, so the
    status right after it does not scan (and says what the full command says)."""
    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--venv", venv, "--no-caches")["id"]
    _upgrade(venv, wheelhouse)
    _delete_file(venv, wheelhouse)
    ev(vault, "restore", sid, "--venv", venv, *([] if backup else ["--no-backup"]))
    code, out, quick = _agrees(vault, venv)
    assert (code, out, quick) == (0, f"{venv}: unchanged since snapshot {sid[:12]}\n", True)
    _edit_in_place(venv)
    assert _agrees(vault, venv)[::2] == (1, False)


def test_the_first_status_of_a_venv_restored_into_is_answered_from_the_restore(tmp_path, make_venv, wheelhouse):
    """``restore --into``: its verification scan found the new venv equal to the snapshot and saved the new
    venv's stat cache, so it leaves the verdict too; the status of the new venv right after it does not scan,
    and an edit there is still seen."""
    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--venv", venv, "--no-caches")["id"]
    new = tmp_path / "copy"
    ev(vault, "restore", sid, "--into", new)
    code, out, quick = _agrees(vault, new)
    assert (code, out, quick) == (0, f"{new}: unchanged since snapshot {sid[:12]}\n", True)
    _edit_in_place(new)
    assert _agrees(vault, new)[::2] == (1, False)


def test_what_else_the_answer_rests_on_sends_status_down_the_full_path(tmp_path, make_venv, wheelhouse):
    """pyvenv.cfg (the interpreter's memo), an interrupted restore's journal, the snapshot's file rewritten,
    the stat cache's groups saved again by someone else: each is the full command's to answer."""
    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--venv", venv, "--no-caches")["id"]
    _status(vault, venv)
    assert _status(vault, venv)[3]
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(cfg.read_text() + "# touched\n")
    assert _agrees(vault, venv)[::2] == (0, False)
    assert _status(vault, venv)[3]  # the full command recorded a new verdict
    (venv / ".envvault-restore.json").write_text("{}")
    code, _out, err, quick, _ = _status(vault, venv)
    assert not quick
    (venv / ".envvault-restore.json").unlink(missing_ok=True)
    _status(vault, venv)
    assert _status(vault, venv)[3]
    snap_file = vault / "snapshots" / f"{sid}.json"
    snap_file.write_bytes(snap_file.read_bytes())  # the same bytes, written again in place
    assert _agrees(vault, venv)[::2] == (0, False)
    assert _status(vault, venv)[3]
    groups_file = next((vault / "state").glob("stat-*.groups.bin"))
    copy = groups_file.with_name("copy")
    copy.write_bytes(groups_file.read_bytes())
    os.replace(copy, groups_file)  # the same groups, saved by another process: not the file the verdict names
    assert _agrees(vault, venv)[::2] == (0, False)


def test_the_stat_cache_knows_which_groups_file_it_holds(tmp_path):
    """``StatCache.identity``: the groups file loaded, or the one saved, while its groups and extra are
    unchanged; None once they change, for a new cache, and after a save that did not happen."""
    from envvault.vault.statcache import StatCache, file_key

    for d in ("state", "locks", "tmp"):
        (tmp_path / d).mkdir()
    path = tmp_path / "state" / "stat-x"
    groups_file = tmp_path / "state" / "stat-x.groups.bin"
    cache = StatCache(path)
    assert cache.identity() is None  # nothing on disk
    cache.set_group("a", {"files": [], "stats": [], "summary": {}})
    cache.save()
    assert cache.identity() == file_key(os.lstat(groups_file))
    loaded = StatCache(path)
    assert loaded.identity() == file_key(os.lstat(groups_file))
    for change in (lambda c: c.set_group("b", {"summary": {}}), lambda c: c.mark_dirty()):
        again = StatCache(path)
        change(again)
        assert again.identity() is None
        again.save()
        assert again.identity() == file_key(os.lstat(groups_file)) != loaded.identity()
        loaded = again
    assert StatCache(path, fresh=True).identity() is None
    (tmp_path / "state" / "gc-epoch").write_text("moved on\n")  # a gc ran: this cache may not be saved
    stale = StatCache(path)
    (tmp_path / "state" / "gc-epoch").write_text("moved again\n")
    stale.mark_dirty()
    stale.save()
    assert stale.identity() is None


def _good_verdict() -> dict:
    return {"version": 1, "venv": "/v", "snapshot": "a" * 64, "note": "", "vault": [1, 2, 3, 4, -1],
            "snapshot_stat": [1, 2, 3, 4], "entries": ["lib/python3.12/site-packages/a-1.dist-info"],
            "groups": [10, 20, 30]}


@pytest.mark.parametrize("field,value,problem", [
    ("snapshot", "../../etc/passwd", "verdict.snapshot"),
    ("snapshot", "A" * 64, "verdict.snapshot"),
    ("venv", 7, "verdict.venv"),
    ("note", "x" * 5000, "verdict.note"),
    ("note", "ok\n\x1b]0;owned\x07second line", "verdict.note"),
    ("note", "tab\there", "verdict.note"),
    ("note", "c1 \x9b31m", "verdict.note"),
    ("vault", [1, "2"], "verdict.vault"),
    ("vault", [1, True], "verdict.vault"),
    ("snapshot_stat", {"a": 1}, "verdict.snapshot_stat"),
    ("entries", ["ok", ""], "verdict.entries"),
    ("entries", "lib", "verdict.entries"),
    ("extra", 1, "unknown fields extra"),
    ("version", 2, "verdict.version"),
    ("groups", [1, 2], "verdict.groups"),
    ("groups", None, "verdict.groups"),
])
def test_a_verdict_that_does_not_parse_is_not_used(field, value, problem):
    from envvault.snap.verdict import parse_verdict

    good, problems = parse_verdict(_good_verdict())
    assert good is not None and problems == []
    doc = dict(_good_verdict(), **{field: value})
    verdict, problems = parse_verdict(doc)
    assert verdict is None
    assert any(problem in p for p in problems), problems
    assert parse_verdict(["not", "an", "object"]) == (None, ["verdict: not an object"])


def test_a_hostile_verdict_in_a_copied_vault_answers_nothing(tmp_path, make_venv, wheelhouse):
    """state/ comes with a copied vault: a verdict claiming the environment unchanged while its files are not
    the ones recorded, one naming another groups file, or one that is garbage, a link or a FIFO, leaves the
    answer to the full command, which says what changed."""
    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--venv", venv, "--no-caches")
    _status(vault, venv)
    verdict_file = next((vault / "state").glob("verdict-*.json"))
    good = json.loads(verdict_file.read_bytes())
    assert good["venv"] == str(venv) and good["version"] == 1
    _edit_in_place(venv)
    # The verdict kept as it was: only a stat key that is not the file's own could make it answer, and an edit
    # moves the ctime, which no one can set back.
    bad_groups = dict(good, groups=[good["groups"][0] + 1] + good["groups"][1:])
    for bad in (good, bad_groups, {"venv": str(venv)}, "garbage", [1, 2], None, "x" * (17 << 20)):
        verdict_file.unlink(missing_ok=True)
        verdict_file.write_text(json.dumps(bad))
        code, out, quick = _agrees(vault, venv)
        assert (code, quick) == (1, False) and "changed since snapshot" in out
    for odd in ("link", "fifo"):
        verdict_file.unlink(missing_ok=True)
        if odd == "link":
            target = tmp_path / "elsewhere.json"
            target.write_text(json.dumps(good))
            verdict_file.symlink_to(target)
        else:
            os.mkfifo(verdict_file)
        code, out, quick = _agrees(vault, venv)
        assert (code, quick) == (1, False) and "changed since snapshot" in out


@pytest.mark.parametrize("argv,want", [
    (["status"], (None, None, False)),
    (["status", "--exit-code"], (None, None, True)),
    (["status", "--venv", "/v"], (None, "/v", False)),
    (["status", "--venv=/v", "--exit-code"], (None, "/v", True)),
    (["--vault", "/x", "status", "--venv", "/v"], ("/x", "/v", False)),
    (["--vault=/x", "status"], ("/x", None, False)),
    (["status", "--json"], None),
    (["status", "--against", "latest"], None),
    (["status", "--python", "/usr/bin/python3"], None),
    (["status", "-h"], None),
    (["status", "--help"], None),
    (["status", "--venv"], None),
    (["status", "--venv", "/a", "--venv", "/b"], None),
    (["status", "--venv", "--exit-code"], None),
    (["status", "--exit-code", "--exit-code"], None),
    (["status", "--"], None),
    (["status", "extra"], None),
    (["--version"], None),
    (["--vault", "/x"], None),
    (["snap"], None),
    (["diff", "status", "current"], None),
    ([], None),
])
def test_the_quick_parser_takes_only_what_click_reads_the_same(argv, want):
    """What the quick parser takes, click reads into the same vault, venv and --exit-code (the click
    commands stay the one definition of the options; this checks the quick reading agrees)."""
    from envvault.quick import parse_status

    assert parse_status(argv) == want
    if want is None:
        return
    from envvault.cli import cli
    from envvault.commands.restore import status

    at = argv.index("status")
    group = cli.make_context("envvault", argv[:at] + ["status"], resilient_parsing=True)
    command = status.make_context("status", argv[at + 1:])
    assert (group.params["vault_path"], command.params["venv"], command.params["exit_code"]) == want


def test_a_quick_status_of_a_real_pip_venv(tmp_path):
    """A venv made as users make it (python -m venv, pip installing real packages from the registry): the
    second status is answered quickly and as the full command answers; after pip removes a package, not."""
    from fixtures.venvs import isolated_env

    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "-q", "--no-input", "--disable-pip-version-check"]
    subprocess.run(pip + ["install", "six==1.17.0", "idna==3.10"], check=True, timeout=600, env=isolated_env())
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--venv", venv, "--no-caches")
    _status(vault, venv)
    code, out, quick = _agrees(vault, venv)
    assert (code, quick) == (0, True)
    subprocess.run(pip + ["uninstall", "-y", "idna"], check=True, timeout=300, env=isolated_env())
    code, out, quick = _agrees(vault, venv)
    assert (code, quick) == (1, False) and "idna" in out


def test_a_vault_the_full_command_refuses_is_refused_by_the_quick_one(tmp_path, make_venv, wheelhouse):
    """The quick status opens the vault as every command does (``vault/config.py`` ``open_local``): its
    config.json gone, not envvault's, of a newer format, or one of its own entries a symlink, and the quick
    status gives the answer the full command gives (its error and exit code), never "unchanged"."""
    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--venv", venv, "--no-caches")
    _status(vault, venv)
    assert _status(vault, venv)[3]
    config = vault / "config.json"
    good = config.read_bytes()

    def newer():
        config.write_text(json.dumps(dict(json.loads(good), format=999)))

    def moved_state():
        (vault / "state").rename(tmp_path / "elsewhere")
        (vault / "state").symlink_to(tmp_path / "elsewhere")

    def put_state_back():
        (vault / "state").unlink()
        (tmp_path / "elsewhere").rename(vault / "state")

    for spoil, codes, undo in ((config.unlink, (4,), None), (lambda: config.write_text("garbage"), (5,), None),
                               (newer, (2,), None), (moved_state, (3,), put_state_back)):
        spoil()
        code, out, err, quick, _ = _status(vault, venv)
        full = _status(vault, venv, quick=False)
        assert (code, out, err, quick) == (full[0], full[1], full[2], False)
        assert code in codes and "unchanged" not in out and err.startswith("envvault: error:"), (code, out, err)
        if undo is not None:
            undo()
        config.write_bytes(good)
        assert _status(vault, venv)[3]  # the same vault again: answered quickly as before


def test_the_quick_answer_is_printed_as_the_full_command_prints_it(tmp_path, make_venv, wheelhouse):
    """Into a pipe with FORCE_COLOR set, the quick status prints what the full command prints (click.echo
    leaves styles out of anything but a terminal); a stdout that cannot take the line (closed, a full disk,
    an encoding without the path's letters) gets what the full command gives it, never a traceback."""
    venv = make_venv("uv", name="v\u65e5\u672c")  # a path ASCII cannot write
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--venv", venv, "--no-caches")
    _status(vault, venv)
    assert _status(vault, venv)[3]
    env = ev_env(vault, FORCE_COLOR="1")
    args = [sys.executable, "-m", "envvault", "status", "--venv", str(venv)]
    quick = subprocess.run(args, capture_output=True, env=env, timeout=300)
    full = subprocess.run(args, capture_output=True, env=dict(env, ENVVAULT_QUICK_STATUS="0"), timeout=300)
    assert quick.stdout == full.stdout and b"\x1b" not in quick.stdout and quick.returncode == full.returncode == 0
    assert "\u65e5".encode() in quick.stdout
    _status(vault, venv)
    for name, extra, shell in (("closed", {}, " >&-"), ("full disk", {}, " >/dev/full"),
                               ("ascii", {"PYTHONIOENCODING": "ascii"}, " >/dev/null")):
        got = []
        for quick_on in ("1", "0"):
            e = dict(ev_env(vault, ENVVAULT_QUICK_STATUS=quick_on), **extra)
            cmd = " ".join(f"'{a}'" for a in args) + shell
            proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=e, timeout=300)
            assert "Traceback" not in proc.stderr, (name, proc.stderr)
            assert len(proc.stderr.strip().splitlines()) <= 1, (name, proc.stderr)
            got.append((proc.returncode, proc.stderr))
        assert got[0] == got[1], (name, got)
    for encoding in ("ascii", "ascii:replace", "ascii:backslashreplace", "latin-1"):
        e = dict(ev_env(vault), PYTHONIOENCODING=encoding)
        quick = subprocess.run(args, capture_output=True, env=e, timeout=300)
        full = subprocess.run(args, capture_output=True, env=dict(e, ENVVAULT_QUICK_STATUS="0"), timeout=300)
        assert (quick.returncode, quick.stdout, quick.stderr) == (full.returncode, full.stdout, full.stderr), encoding
    codes = []
    for quick_on in ("1", "0"):  # a pipe whose reader is gone: click ends the CLI with 1, and so does the quick path
        r, w = os.pipe()
        os.close(r)
        try:
            proc = subprocess.run(args, stdout=w, stderr=subprocess.PIPE, text=True, timeout=300,
                                  env=ev_env(vault, ENVVAULT_QUICK_STATUS=quick_on))
        finally:
            os.close(w)
        assert "Traceback" not in proc.stderr, proc.stderr
        codes.append(proc.returncode)
    assert codes[0] == codes[1], codes


def test_a_verdict_or_a_groups_header_past_its_size_limit_is_not_read(tmp_path, make_venv, wheelhouse):
    """What is parsed from state/ (a copied vault's) stays bounded: a verdict over 4 MiB and a groups file
    whose header is over 16 MiB are not parsed (JSON of empty objects takes about 30 times its size), even
    when what they hold is right: the full command answers, and saves a good cache again."""
    from envvault.vault.statcache import GROUPS_MAGIC, HEADER_LIMIT

    venv = _venv_with_two(make_venv, wheelhouse)
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--venv", venv, "--no-caches")
    _status(vault, venv)
    assert _status(vault, venv)[3]
    verdict_file = next((vault / "state").glob("verdict-*.json"))
    good = verdict_file.read_bytes()
    verdict_file.write_bytes(good + b" " * (4 << 20))  # the same verdict, and white space past the limit
    assert _agrees(vault, venv)[::2] == (0, False)
    assert _status(vault, venv)[3]  # the full command wrote a verdict of its size again
    groups_file = next((vault / "state").glob("stat-*.groups.bin"))
    raw = groups_file.read_bytes()
    start = len(GROUPS_MAGIC) + 4
    end = start + int.from_bytes(raw[len(GROUPS_MAGIC):start], "big")
    header = raw[start:end] + b" " * (HEADER_LIMIT - (end - start) + 1)
    groups_file.write_bytes(GROUPS_MAGIC + len(header).to_bytes(4, "big") + header + raw[end:])
    assert _agrees(vault, venv)[::2] == (0, False)
    assert len(groups_file.read_bytes()) < 2 * len(raw)  # saved again by the full command, without the padding
    assert _status(vault, venv)[3]
