"""A path that changes kind between two versions of a package: ``tpkg/sub`` a folder in 1.0 and a file in 2.0,
``fpkg/data`` a file in 1.0 and a folder in 2.0. Restoring either way (and guard's rollback, which is such a
restore) refused: "tpkg/sub is in the way: the snapshot needs a directory there" (exit 7), "fpkg/data is a
non-empty directory where the snapshot has a file" (exit 3), although what stood in the way was the other
version's own file or folder, which the restore removes anyway (helper 29, defect 1). The restore now removes
it at the commit, just before the new entries are renamed in, and a restore killed there is completed by the
next one as any other; a user's file in such a folder still refuses the restore before anything is written."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from fixtures import build_wheel, site_packages, uv_install
from fixtures.trees import temp_files
from tests.evtools import assert_one_line_error, ev, ev_env, ev_json


def _wheels(out: Path) -> dict[str, Path]:
    return {
        "t1": build_wheel(out, "tpkg", "1.0", {"tpkg/__init__.py": b"V = 1\n", "tpkg/sub/x.txt": b"x1\n",
                                               "tpkg/sub/deep/y.txt": b"y1\n"}),
        "t2": build_wheel(out, "tpkg", "2.0", {"tpkg/__init__.py": b"V = 2\n", "tpkg/sub": b"now a file\n"}),
        "f1": build_wheel(out, "fpkg", "1.0", {"fpkg/__init__.py": b"V = 1\n", "fpkg/data": b"a file\n"}),
        "f2": build_wheel(out, "fpkg", "2.0", {"fpkg/__init__.py": b"V = 2\n", "fpkg/data/a.txt": b"a2\n",
                                               "fpkg/data/deep/b.txt": b"b2\n"}),
    }


def _setup(tmp_path: Path, make_venv):
    wheels = _wheels(tmp_path / "wheels")
    venv = make_venv("uv")
    uv_install(venv, wheels["t1"], wheels["f1"])
    vault = tmp_path / "vault"
    one = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    uv_install(venv, wheels["t2"], wheels["f2"])
    two = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    return vault, venv, wheels, one, two


def _is_one(venv: Path) -> bool:
    sp = site_packages(venv)
    return ((sp / "tpkg" / "sub" / "deep" / "y.txt").read_bytes() == b"y1\n"
            and (sp / "fpkg" / "data").read_bytes() == b"a file\n")


def _is_two(venv: Path) -> bool:
    sp = site_packages(venv)
    return ((sp / "tpkg" / "sub").read_bytes() == b"now a file\n"
            and (sp / "fpkg" / "data" / "deep" / "b.txt").read_bytes() == b"b2\n")


def test_restore_both_ways_across_a_change_of_kind(tmp_path, make_venv):
    vault, venv, _wheels_, one, two = _setup(tmp_path, make_venv)
    dry = ev_json(vault, "restore", one, "--venv", venv, "--dry-run")
    assert dry["dry_run"] is True and _is_two(venv)
    res = ev_json(vault, "restore", one, "--venv", venv)
    assert res["verified"] is True, res
    assert _is_one(venv) and not temp_files(venv)
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True
    res = ev_json(vault, "restore", two, "--venv", venv, "--no-backup")
    assert res["verified"] is True, res
    assert _is_two(venv) and not temp_files(venv)
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True


def test_guard_rolls_back_an_install_that_changes_a_paths_kind(tmp_path, make_venv):
    vault, venv, wheels, one, _two = _setup(tmp_path, make_venv)
    ev_json(vault, "restore", one, "--venv", venv)
    from fixtures.venvs import find_uv

    cmd = (f"import subprocess, sys; subprocess.run([{str(find_uv())!r}, 'pip', 'install', '--python', "
           f"{str(venv / 'bin' / 'python')!r}, '--offline', {str(wheels['t2'])!r}, {str(wheels['f2'])!r}], "
           "check=True); sys.exit(1)")
    proc = ev(vault, "guard", "--venv", venv, "--yes", "--json", "--", sys.executable, "-c", cmd, check=False)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["outcome"] == "restored", proc.stderr
    assert _is_one(venv)


@pytest.mark.parametrize("point", ["stage:1", "staged", "commit:1", "commit:3"])
def test_a_restore_killed_across_a_change_of_kind_is_completed_by_the_next(tmp_path, make_venv, point):
    vault, venv, _wheels_, one, _two = _setup(tmp_path, make_venv)
    proc = ev(vault, "restore", one, "--venv", venv, "--json", check=False,
              env=ev_env(vault, ENVVAULT_TEST_CRASH_AT=point))
    assert proc.returncode == -signal.SIGKILL, proc
    res = ev_json(vault, "restore", one, "--venv", venv)
    assert res["verified"] is True, res
    assert _is_one(venv) and not temp_files(venv) and not (venv / ".envvault-restore.json").exists()
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True


def test_a_users_file_in_a_folder_that_changes_kind_still_refuses(tmp_path, make_venv):
    """The folder holds a file no package owns: the user's, never deleted; the restore is refused whole."""
    vault, venv, _wheels_, one, _two = _setup(tmp_path, make_venv)
    mine = site_packages(venv) / "fpkg" / "data" / "notes.txt"
    mine.write_text("mine")
    proc = ev(vault, "restore", one, "--venv", venv, check=False)
    assert proc.returncode == 3, proc
    assert_one_line_error(proc, "fpkg/data is a non-empty directory where the snapshot has a file")
    assert mine.read_text() == "mine" and _is_two(venv)


def _snapped_then_replaced(tmp_path: Path, make_venv, name: str, snapped: dict, then: dict):
    """``(vault, venv, sid)``: ``name`` 1.0 of files ``snapped`` installed and snapped, then replaced by 2.0 of
    files ``then``."""
    out = tmp_path / "wheels"
    venv = make_venv("uv")
    uv_install(venv, build_wheel(out, name, "1.0", snapped))
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    uv_install(venv, build_wheel(out, name, "2.0", then))
    return vault, venv, sid


def test_bytecode_an_import_wrote_in_the_folder_in_the_way_goes_with_it(tmp_path, make_venv):
    """``mix/x`` a file in 1.0 and a package in 2.0, imported (``__pycache__/*.pyc``, which uv lists in no
    RECORD): the bytecode made the folder look like it held the user's file, and the restore (a guard's
    rollback too) was refused (helper 30, F1). Bytecode of a source the restore deletes goes with it."""
    import os
    import subprocess

    vault, venv, sid = _snapped_then_replaced(
        tmp_path, make_venv, "mix", {"mix/__init__.py": b"", "mix/x": b"a file\n"},
        {"mix/__init__.py": b"", "mix/x/__init__.py": b"", "mix/x/s.py": b"S = 2\n"})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([str(venv / "bin" / "python"), "-c", "import mix.x.s"], env=env, check=True)
    assert list((site_packages(venv) / "mix" / "x" / "__pycache__").glob("s.*.pyc"))
    dry = ev_json(vault, "restore", sid, "--venv", venv, "--dry-run")
    res = ev_json(vault, "restore", sid, "--venv", venv)
    assert res["verified"] is True, res
    assert dry["removed_files"] == res["removed_files"], (dry, res)  # bytecode is counted by neither
    assert (site_packages(venv) / "mix" / "x").read_bytes() == b"a file\n" and not temp_files(venv)


def test_two_writes_under_a_file_in_the_way_never_share_a_temp_name(tmp_path, make_venv):
    """``cpkg/b`` a file in 1.0; 2.0 has ``cpkg/b/c.txt`` and ``cpkg/b~c.txt``: both were staged as
    ``cpkg/.b~c.txt.envvault-<pid>.tmp``, one overwrote the other and ``cpkg/b/c.txt`` got the other's bytes
    (helper 30, F2)."""
    vault, venv, sid = _snapped_then_replaced(
        tmp_path, make_venv, "cpkg", {"cpkg/__init__.py": b"", "cpkg/b/c.txt": b"SLASH\n", "cpkg/b~c.txt": b"TILDE\n"},
        {"cpkg/__init__.py": b"", "cpkg/b": b"file\n"})
    res = ev_json(vault, "restore", sid, "--venv", venv)
    assert res["verified"] is True, res
    sp = site_packages(venv)
    assert (sp / "cpkg" / "b" / "c.txt").read_bytes() == b"SLASH\n" and (sp / "cpkg" / "b~c.txt").read_bytes() == b"TILDE\n"
    assert not temp_files(venv)


def test_a_users_file_where_a_folder_is_needed_refuses_before_anything_is_written(tmp_path, make_venv):
    """A file no package lists where the snapshot needs a folder: refused in one line (exit 7) before the
    journal, any staged file or the backup is made (it was found while staging, after them)."""
    from fixtures import uv_pip

    vault, venv, _wheels_, one, _two = _setup(tmp_path, make_venv)
    uv_pip(venv, "uninstall", "tpkg")
    (site_packages(venv) / "tpkg").mkdir()
    mine = site_packages(venv) / "tpkg" / "sub"
    mine.write_text("mine")
    before = len(ev_json(vault, "list", "--all")["snapshots"])
    proc = ev(vault, "restore", one, "--venv", venv, check=False)
    assert proc.returncode == 7, proc
    assert_one_line_error(proc, "tpkg/sub is in the way: the snapshot needs a directory there")
    assert mine.read_text() == "mine" and _is_two_fpkg(venv)
    assert not (venv / ".envvault-restore.json").exists() and not temp_files(venv)
    assert len(ev_json(vault, "list", "--all")["snapshots"]) == before  # the backup taken was discarded


def _is_two_fpkg(venv: Path) -> bool:
    return (site_packages(venv) / "fpkg" / "data" / "deep" / "b.txt").read_bytes() == b"b2\n"


def test_a_package_file_under_a_folder_now_a_file_is_missing(tmp_path, make_venv):
    """A package's folder replaced by a file: its files scan as missing (lstat says "not a directory"), where
    ``status`` stopped with "cannot stat ...: Not a directory" (exit 7). The file is no package's, so a restore
    refuses to delete it (exit 7, naming it); moved away, the restore puts the folder back."""
    import shutil

    wheels = _wheels(tmp_path / "wheels")
    venv = make_venv("uv")
    uv_install(venv, wheels["t1"])
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    sub = site_packages(venv) / "tpkg" / "sub"
    shutil.rmtree(sub)
    sub.write_text("a file now")
    (change,) = ev_json(vault, "status", "--venv", venv)["packages"]["changed"]
    assert sorted(change["missing_files"]) == sorted(
        (sub / p).relative_to(venv).as_posix() for p in ("x.txt", "deep/y.txt")), change
    proc = ev(vault, "restore", sid, "--venv", venv, check=False)
    assert proc.returncode == 7 and sub.read_text() == "a file now", proc
    assert_one_line_error(proc, "tpkg/sub is in the way")
    sub.rename(tmp_path / "moved")
    assert ev_json(vault, "restore", sid, "--venv", venv)["verified"] is True
    assert (sub / "deep" / "y.txt").read_bytes() == b"y1\n"
