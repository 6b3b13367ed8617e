"""Permission-only changes seen and undone (issue 9.12), and restores that meet a full disk or a kill leave
no empty package behind (issue 14.12)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
from pathlib import Path

from fixtures import build_wheel, python_of, site_packages, uv_install, uv_pip
from fixtures import make_venv as make_venv_at
from fixtures.trees import temp_files, tree_state
from tests.evtools import assert_one_line_error, ev, ev_env, ev_json, mounted

JOURNAL = ".envvault-restore.json"


def _tool_wheel(out: Path) -> Path:
    return build_wheel(out, "modepkg", "1.0", {"modepkg/__init__.py": b"def main():\n    print('hi')\n",
                                               "modepkg/data.txt": b"just data\n"},
                       scripts={"modepkg-sh": b"#!/bin/sh\necho modepkg\n"})


def test_permission_only_change_is_reported_and_restored(tmp_path, make_venv):
    venv = make_venv("uv")
    uv_install(venv, _tool_wheel(tmp_path / "w"))
    vault = tmp_path / "vault"
    script, data = venv / "bin" / "modepkg-sh", site_packages(venv) / "modepkg" / "data.txt"
    assert os.stat(script).st_mode & 0o111 and not os.stat(data).st_mode & 0o111
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True
    script.chmod(0o644)  # chmod -x on a script
    data.chmod(0o755)  # chmod +x on a data file
    rel_script, rel_data = "bin/modepkg-sh", os.path.relpath(data, venv)

    status = ev_json(vault, "status", "--venv", venv)
    assert status["empty"] is False
    [change] = status["packages"]["changed"]
    assert change["name"] == "modepkg" and change["kind"] == "mode"
    assert change["mode_files"] == sorted([rel_script, rel_data])
    text = ev(vault, "status", "--venv", venv).stdout
    assert "mode" in text and rel_script in text and rel_data in text
    assert ev(vault, "status", "--venv", venv, "--exit-code", check=False).returncode == 1
    diff = ev_json(vault, "diff", sid, "current", "--venv", venv)
    assert diff["packages"]["changed"][0]["mode_files"] == sorted([rel_script, rel_data])

    dry = ev(vault, "restore", sid, "--venv", venv, "--dry-run").stdout
    assert "set the mode of 2" in dry
    res = ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")
    assert res["verified"] is True and res["modes_set"] == 2, res
    assert os.stat(script).st_mode & 0o777 == 0o755 and os.stat(data).st_mode & 0o777 == 0o644
    assert subprocess.run([script], capture_output=True, text=True).stdout == "modepkg\n"
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True
    human = ev(vault, "restore", sid, "--venv", venv, "--no-backup").stdout
    assert "already matches" in human


# -- full disk and kills: no empty package left to import ------------------------------------------


def _big_wheel(out: Path) -> Path:
    rnd = random.Random(5)
    files = {f"bigpkg/part{i}.py": b"# part\n" + rnd.randbytes(60_000).replace(b"\x00", b"0") for i in range(20)}
    files["bigpkg/__init__.py"] = b"VALUE = 42\n"
    return build_wheel(out, "bigpkg", "1.0", files)


def _uninstall(venv: Path) -> None:
    site = site_packages(venv)
    shutil.rmtree(site / "bigpkg")
    shutil.rmtree(site / "bigpkg-1.0.dist-info")


def _imports(venv: Path) -> bool:
    proc = subprocess.run([python_of(venv), "-c", "import bigpkg"], capture_output=True, text=True)
    return proc.returncode == 0


def test_a_mode_restored_on_a_file_hardlinked_into_uvs_cache_leaves_the_cache_alone(tmp_path, make_venv):
    """uv links each file of a package from its cache by default (``--link-mode hardlink``): the file in the
    environment and the cache's are one inode, which other environments share. A restore that gave a kept
    file back its execute bit ran ``chmod`` on that inode and changed uv's cache, and with it every environment
    linked to it (helper 38). Such a file is now written anew (one link of its own); the cache keeps its
    mode and bytes. A symlink into the cache is written anew the same way."""
    venv = make_venv("uv")
    uv_install(venv, "--link-mode", "hardlink", _tool_wheel(tmp_path / "w"), cache_dir=tmp_path / "uv-cache")
    data = site_packages(venv) / "modepkg" / "data.txt"
    st = os.stat(data)
    assert st.st_nlink > 1 and not st.st_mode & 0o111
    cached = next(p for p in (tmp_path / "uv-cache").rglob("data.txt") if p.stat().st_ino == st.st_ino)
    before = cached.read_bytes()
    vault = tmp_path / "vault"
    data.chmod(0o755)  # (the cache's file too: one inode)
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    data.chmod(0o644)
    assert ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")["verified"] is True
    assert os.stat(data).st_mode & 0o777 == 0o755 and os.stat(data).st_nlink == 1
    assert cached.stat().st_mode & 0o777 == 0o644 and cached.read_bytes() == before
    assert ev_json(vault, "status", "--venv", venv)["empty"] is True

    linked = make_venv("uv")  # every file a symlink into the cache: its mode is the cache file's
    uv_install(linked, "--link-mode", "symlink", _tool_wheel(tmp_path / "w"), cache_dir=tmp_path / "uv-cache-2")
    data = site_packages(linked) / "modepkg" / "data.txt"
    target = Path(os.readlink(data))
    sid = ev_json(vault, "snap", "--no-caches", "--venv", linked)["id"]  # (data.txt recorded 0o644)
    target.chmod(0o755)
    assert ev_json(vault, "restore", sid, "--venv", linked, "--no-backup")["verified"] is True  # (before: not)
    assert not data.is_symlink() and os.stat(data).st_mode & 0o777 == 0o644
    assert target.stat().st_mode & 0o777 == 0o755


def test_a_file_another_package_lists_hardlinked_gets_its_mode_without_a_chmod(tmp_path, make_venv):
    """Two packages ship one file with the same bytes (``sharedns/tool.sh``). The snapshot holds pkga with it
    executable; now pkgb is installed instead, its ``tool.sh`` hardlinked into uv's cache, not executable.
    The restore of pkga keeps that file (its bytes match) and must give it the execute bit: no ``chmod`` of
    the cache's inode, so it was left as it was and the restore ended "not verified" (helper 39; only a
    file of the same package was written anew). It is written anew too; pkgb's cache file keeps its mode."""
    wheels = tmp_path / "w"
    tool = b"#!/bin/sh\necho tool\n"
    build_wheel(wheels, "pkga", "1.0", {"sharedns/tool.sh": tool, "pkga/__init__.py": b""})
    build_wheel(wheels, "pkgb", "1.0", {"sharedns/tool.sh": tool, "pkgb/__init__.py": b""})
    venv = make_venv("uv")
    cache = tmp_path / "uv-cache"
    uv_install(venv, "--link-mode", "hardlink", "pkga", find_links=[wheels], cache_dir=cache)
    shared = site_packages(venv) / "sharedns" / "tool.sh"
    shared.chmod(0o755)
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    uv_pip(venv, "uninstall", "pkga", cache_dir=cache)
    uv_install(venv, "--link-mode", "hardlink", "pkgb", find_links=[wheels], cache_dir=cache)
    st = os.stat(shared)
    assert st.st_nlink > 1 and st.st_mode & 0o777 == 0o644
    cached = next(p for p in cache.rglob("tool.sh") if p.stat().st_ino == st.st_ino)
    assert ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")["verified"] is True
    assert os.stat(shared).st_mode & 0o777 == 0o755 and os.stat(shared).st_nlink == 1
    assert cached.stat().st_mode & 0o777 == 0o644 and cached.read_bytes() == tool


def test_full_disk_restore_leaves_the_environment_as_it_was(tmp_path):
    wheel = _big_wheel(tmp_path / "w")
    full = tmp_path / "full"
    full.mkdir()
    with mounted(full, tmpfs_size="4m"):
        venv = make_venv_at(full / "venv", "uv")
        uv_install(venv, wheel)
        vault = tmp_path / "vault"  # the vault has room; the environment's disk has not
        sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
        _uninstall(venv)
        assert not _imports(venv)
        st = os.statvfs(full)
        (full / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - 400_000))  # 400 KB left, 1.2 MB needed
        before = tree_state(venv)
        snaps = set(os.listdir(vault / "snapshots"))
        proc = ev(vault, "restore", sid, "--venv", venv, check=False)
        assert_one_line_error(proc, "no space left")
        assert proc.returncode == 6
        assert tree_state(venv) == before  # no journal, no staged file, no new (empty) folder
        assert not _imports(venv)
        assert set(os.listdir(vault / "snapshots")) == snaps  # its backup was dropped again
        (full / "filler").unlink()
        assert ev_json(vault, "restore", sid, "--venv", venv)["verified"] is True
        assert _imports(venv)


def test_a_read_only_environment_is_not_blamed_on_the_vault(tmp_path, make_venv):
    """A venv on a read-only mount (a container's image layer): one line that names the environment's file
    and the read-only filesystem, not the vault's advice (--vault); the environment is left as it was."""
    venv = make_venv("uv")
    uv_install(venv, _big_wheel(tmp_path / "w"))
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    _uninstall(venv)
    before = tree_state(venv)
    with mounted(venv):
        for extra in ([], ["--no-backup"]):
            proc = ev(vault, "restore", sid, "--venv", venv, *extra, check=False)
            assert_one_line_error(proc, "read-only filesystem", str(venv))
            assert "--vault" not in proc.stderr and "the vault at" not in proc.stderr
            assert proc.returncode == 6
    assert tree_state(venv) == before and not _imports(venv)


def test_a_commit_that_fails_part_way_says_so_and_how_to_finish(tmp_path, make_venv):
    """A file the commit cannot replace (immutable: ``chattr +i``, which stops root too) after others were put
    back: one line naming that file, the restore left part way and the command that finishes it, not the
    owner advice that cannot help root (helper 34); once the flag is gone, that command finishes it."""
    assert os.geteuid() == 0, "chattr +i needs root, which CI has"
    venv = make_venv("uv")
    uv_install(venv, _big_wheel(tmp_path / "w"))
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    pkg = site_packages(venv) / "bigpkg"
    for name in ("part0.py", "part9.py"):
        (pkg / name).write_bytes(b"# edited\n")
    locked = pkg / "part9.py"
    subprocess.run(["chattr", "+i", str(locked)], check=True)
    try:
        proc = ev(vault, "restore", sid, "--venv", venv, "--no-backup", check=False)
        assert_one_line_error(proc, str(locked), "even as root", "stopped part way",
                              f"envvault restore {sid[:12]} --venv {venv}")
        assert proc.returncode == 6 and "owner of that folder" not in proc.stderr
        assert (venv / JOURNAL).exists() and temp_files(venv)
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    res = ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")
    assert res["verified"] is True and not (venv / JOURNAL).exists() and not temp_files(venv)
    assert locked.read_bytes().startswith(b"# part\n")


def test_a_removal_the_commit_cannot_make_says_the_restore_stopped_part_way(tmp_path, make_venv):
    """The commit's own file operations (a dist-info folder renamed away in an immutable site-packages) fail
    with the same line as a rename into place: part way, and the command that finishes it (helper 35)."""
    assert os.geteuid() == 0, "chattr +i needs root, which CI has"
    venv = make_venv("uv")
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    uv_install(venv, _big_wheel(tmp_path / "w"))  # a distribution the snapshot lacks: the restore removes it
    site = site_packages(venv)
    subprocess.run(["chattr", "+i", str(site)], check=True)
    try:
        proc = ev(vault, "restore", sid, "--venv", venv, "--no-backup", check=False)
        assert_one_line_error(proc, "bigpkg-1.0.dist-info", "stopped part way",
                              f"envvault restore {sid[:12]} --venv {venv}` to finish it")
        assert proc.returncode == 6 and (venv / JOURNAL).exists()
    finally:
        subprocess.run(["chattr", "-i", str(site)], check=True)
    assert ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")["verified"] is True
    assert not (site / "bigpkg").exists() and not (site / "bigpkg-1.0.dist-info").exists()


def test_a_killed_restore_is_tidied_by_the_next_command(tmp_path, make_venv):
    venv = make_venv("uv")
    uv_install(venv, _big_wheel(tmp_path / "w"))
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    _uninstall(venv)
    proc = ev(vault, "restore", sid, "--venv", venv, "--no-backup", check=False,
              env=ev_env(vault, ENVVAULT_TEST_CRASH_AT="staged"))
    assert proc.returncode == -signal.SIGKILL, proc
    assert temp_files(venv) and (site_packages(venv) / "bigpkg").is_dir()  # staged, nothing renamed yet
    assert _imports(venv)  # the bug: an empty package (only temp files) imports

    status = ev(vault, "status", "--venv", venv, check=False)
    assert f"a restore of {sid[:12]} onto {venv} was interrupted" in status.stderr
    assert not temp_files(venv) and not (site_packages(venv) / "bigpkg").exists()
    assert not _imports(venv)
    assert (venv / JOURNAL).exists()  # still unfinished: status keeps saying so until a restore ends it
    assert ev_json(vault, "status", "--venv", venv)["interrupted_restore"] == sid

    res = ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")
    assert res["verified"] is True and not (venv / JOURNAL).exists()
    assert _imports(venv)


def test_snap_and_diff_current_tidy_a_killed_restore_too(tmp_path, make_venv):
    venv = make_venv("uv")
    uv_install(venv, _big_wheel(tmp_path / "w"))
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    _uninstall(venv)
    for command in (["diff", sid, "current", "--venv", str(venv)], ["snap", "--no-caches", "--venv", str(venv)]):
        proc = ev(vault, "restore", sid, "--venv", venv, "--no-backup", check=False,
                  env=ev_env(vault, ENVVAULT_TEST_CRASH_AT="staged"))
        assert proc.returncode == -signal.SIGKILL, proc
        assert temp_files(venv)
        ev(vault, *command)
        assert not temp_files(venv) and not (site_packages(venv) / "bigpkg").exists(), command
        assert not _imports(venv)


def test_a_backup_that_cannot_undo_the_restore_is_not_offered_as_its_undo(tmp_path, make_venv):
    """A package file the user replaced by a symlink leading out of the environment (to /etc/passwd): the
    restore's backup records the link, and a restore refuses to make one, so "undo with" would name a command
    that exits 3 (helper 34). The restore says the backup cannot undo it instead, naming the link; an edited
    file's backup still offers its undo, which works."""
    venv = make_venv("venv")
    uv_install(venv, _tool_wheel(tmp_path / "w"))
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    data = site_packages(venv) / "modepkg" / "data.txt"
    rel = os.path.relpath(data, venv)
    data.unlink()
    data.symlink_to("/etc/passwd")
    proc = ev(vault, "restore", sid, "--venv", venv)
    backup = proc.stdout.split("backup ", 1)[1].split(" ", 1)[0]
    assert "undo with" not in proc.stdout, proc.stdout
    assert (f"it cannot undo this restore: it holds 1 symlink(s) leading out of the environment, which a restore "
            f"refuses to make: modepkg 1.0: {rel} -> /etc/passwd") in proc.stdout, proc.stdout
    assert not data.is_symlink() and data.read_bytes() == b"just data\n"
    refused = ev(vault, "restore", backup, "--venv", venv, check=False)
    assert refused.returncode == 3 and "/etc/passwd" in refused.stderr, refused.stderr
    data.write_bytes(b"edited\n")
    doc = ev_json(vault, "restore", sid, "--venv", venv)
    assert doc["backup"] and doc["backup_refused"] == [], doc
    data.write_bytes(b"edited again\n")
    proc = ev(vault, "restore", sid, "--venv", venv)
    undo = proc.stdout.split("(undo with: ", 1)[1].split(")", 1)[0]
    assert undo.startswith("envvault restore "), proc.stdout
    assert ev(vault, *undo.split()[1:], "--venv", venv).returncode == 0
    assert data.read_bytes() == b"edited again\n"
