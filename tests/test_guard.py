"""envvault guard: the seeds' disaster replayed against a real index on 127.0.0.1, plus its parts.

The disaster: a venv holds ``torchlike 2.11.0+cu128`` (the CUDA build); ``servingpkg`` requires
``torchlike==2.11.0`` and the index serves ``torchlike 2.11.0``, another build (cuda 13.0 inside). Under
PEP 440 the installed ``+cu128`` already satisfies ``==2.11.0`` (tests/test_fixtures.py), so the swap
happens the way it does in the field: a ``--force-reinstall`` (or ``uv --reinstall``) of the serving
package.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from fixtures import IndexServer, site_packages, uv_install
from fixtures import catalogue as C
from fixtures import build_wheel
from fixtures.guard_helpers import RangeServer, guard_env, run_envvault, venv_with_pip, wreck_wheel
from envvault.errors import UsageError
from envvault.guard.builds import comparable_rows, same_build, wheel_rows
from envvault.guard.command import locate_target, parse_command
from envvault.guard.plan import Installed, PlannedDist, classify
from envvault.guard.protect import DEFAULT_PROTECTED, load_protection, save_vault_protection, save_venv_protection
from envvault.guard.provenance import carry, index_for, pip_indexes
from envvault.model import records
from envvault.model.provenance import ProvenanceEntry
from envvault.guard.retention import apply_retention, plan_retention
from envvault.model.snapshot import Snapshot
from envvault.vault.store import SnapshotRef, Vault

# -- helpers -------------------------------------------------------------------------------------------


def _torch_info(venv: Path) -> str:
    return subprocess.run([str(venv / "bin" / "torchlike-info")], capture_output=True, text=True,
                          check=True).stdout.strip()


def _dists(venv: Path) -> list[str]:
    return sorted(p.name[: -len(".dist-info")] for p in site_packages(venv).glob("*.dist-info")
                  if not p.name.startswith("pip-"))


def _protect_torchlike(venv: Path) -> None:
    # torchlike stands in for torch, so it is protected the way a user protects their own packages.
    (venv / ".envvault.toml").write_text('[guard]\nprotect = ["torchlike"]\n')


def _guard(env, *args, json_out=False, timeout=300):
    args = ("guard", "--json", *args) if json_out else ("guard", *args)
    proc = run_envvault(*args, env=env, timeout=timeout)
    if json_out:
        assert proc.stdout.strip(), proc.stderr
        return proc, json.loads(proc.stdout)
    return proc


@pytest.fixture
def cu128_pip_venv(tmp_path, wheelhouse):
    venv = venv_with_pip(tmp_path / "venv", "torchlike==2.11.0+cu128", find_links=[wheelhouse[C.TORCH_CU128].parent])
    _protect_torchlike(venv)
    assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"
    return venv


def test_a_killed_pips_stash_is_removed_by_the_rollback(cu128_pip_venv, tmp_path):
    """pip uninstalls by moving a package aside (``torchlike`` -> ``~orchlike`` next to it) and removes that
    once the install is done; killed between the two (Ctrl-C, SIGTERM to pip, seen with 758 MB of torch by
    helper-16) it leaves the copy behind. The rollback puts the package back and removes what the command
    moved aside; a ``~`` folder that was there before it ran stays."""
    venv = cu128_pip_venv
    env = guard_env(venv, tmp_path / "vault")
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "~ld").mkdir()  # the user's, from an earlier run: not this command's
    # Another process's stash made meanwhile (a second pip in the same venv) is not this command's.
    kill_mid_uninstall = (f"mkdir {site / '~ther-stash'} && mv {site / 'torchlike'} {site / '~orchlike'} && "
                          "kill -KILL $$")
    proc, doc = _guard(env, "--yes", "--", "sh", "-c", kill_mid_uninstall, json_out=True)
    assert proc.returncode == 137 and doc["outcome"] == "restored", proc.stderr
    assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"
    assert not (site / "~orchlike").exists() and (site / "~ld").is_dir() and (site / "~ther-stash").is_dir()
    assert any("~orchlike" in w for w in doc["warnings"]), doc["warnings"]


def test_a_killed_pips_stash_in_a_namespace_folder_is_removed(make_venv, tmp_path):
    """The CUDA wheels torch pulls in share the namespace folder nvidia/: pip moves nvidia/cublas aside as
    nvidia/~ublas (helper-17); the rollback removes it there too, and leaves nvidia/~other alone."""
    venv = make_venv("uv")
    uv_install(venv, build_wheel(tmp_path / "w", "nvidia-cublas", "12.8", {"nvidia/cublas/__init__.py": b"",
                                                                            "nvidia/cublas/lib/libcublas.so": b"\x7fELF"}),
               build_wheel(tmp_path / "w", "nvidia-cudnn", "9.1", {"nvidia/cudnn/__init__.py": b""}))
    env = guard_env(venv, tmp_path / "vault")
    ns = site_packages(venv) / "nvidia"
    kill_mid_uninstall = f"mkdir {ns / '~other'} && mv {ns / 'cublas'} {ns / '~ublas'} && kill -KILL $$"
    proc, doc = _guard(env, "--yes", "--", "sh", "-c", kill_mid_uninstall, json_out=True)
    assert proc.returncode == 137 and doc["outcome"] == "restored", proc.stderr
    assert (ns / "cublas" / "lib" / "libcublas.so").is_file() and not (ns / "~ublas").exists()
    assert (ns / "~other").is_dir() and (ns / "cudnn").is_dir()


@pytest.mark.parametrize("stash, name, taken", [
    ("~orch", "torch", True), ("~-rch", "torch", True), ("~~torch", "torch", True), ("~ublas", "cublas", True),
    ("~orchlike", "torch", False), ("~ther-stash", "torchlike", False), ("torch", "torch", False),
    ("~orcX", "torch", False), ("~", "t", False)])
def test_pips_names_for_a_folder_it_moves_aside(stash, name, taken):
    from envvault.guard.run import is_pip_stash

    assert is_pip_stash(stash, name) is taken


@pytest.fixture
def disaster_index(wheelhouse, tmp_path):
    wreck = wreck_wheel(tmp_path / "wreck")
    with IndexServer([wheelhouse[C.SERVING], wheelhouse[C.TORCH_PLAIN_B], wheelhouse[C.BROKEN], wreck]) as srv:
        yield srv


# -- the disaster, through pip --------------------------------------------------------------------------


def test_disaster_replayed_with_pip(cu128_pip_venv, disaster_index, tmp_path):
    venv, vault = cu128_pip_venv, tmp_path / "vault"
    env = guard_env(venv, vault, index_url=disaster_index.url)
    cmd = ["--", "pip", "install", "--force-reinstall", "servingpkg"]

    # 1. No terminal: guard shows the swap and refuses with exit 3; nothing ran, nothing changed.
    refused = _guard(env, *cmd)
    assert refused.returncode == 3, refused.stderr
    assert "SWAP      torchlike 2.11.0+cu128 -> 2.11.0  another build of the same release" in refused.stderr
    assert "[protected: torchlike]" in refused.stderr
    assert "add       servingpkg 1.0.0" in refused.stderr
    assert "rerun with --yes" in refused.stderr.strip().splitlines()[-1]
    assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"
    assert _dists(venv) == ["torchlike-2.11.0+cu128"]

    # The JSON form says the same, for scripts.
    proc, doc = _guard(env, *cmd, json_out=True)
    assert proc.returncode == 3 and doc["outcome"] == "refused" and doc["protected"] == ["torchlike"]
    swap = next(c for c in doc["plan"]["changes"] if c["name"] == "torchlike")
    assert (swap["kind"], swap["old"], swap["new"], swap["same_build"]) == ("swap", "2.11.0+cu128", "2.11.0", False)
    assert swap["sha256"] == _sha256(disaster_index, "torchlike-2.11.0-py3-none-any.whl")

    # 2. --yes: it runs, and the diff after it names the swap.
    proc, doc = _guard(env, "--yes", *cmd, json_out=True)
    assert proc.returncode == 0 and doc["outcome"] == "ran", proc.stderr
    assert "Successfully installed servingpkg-1.0.0 torchlike-2.11.0" in proc.stderr  # pip's stdout, moved
    changed = doc["diff"]["packages"]["changed"]
    assert [(c["name"], c["old_version"], c["new_version"], c["kind"], c["build_changed"]) for c in changed] == [
        ("torchlike", "2.11.0+cu128", "2.11.0", "local", True)]
    assert changed[0]["build_facts"]["cuda"] == ["12.8", "13.0"]
    assert [p["name"] for p in doc["diff"]["packages"]["added"]] == ["servingpkg"]
    assert _torch_info(venv) == "torchlike 2.11.0+cu130 cuda 13.0"

    # Provenance from pip's report is in the snapshot after: URL, sha256, index.
    after = Vault.open(vault).load_snapshot(doc["after"]).doc
    assert after["trigger"] == "guard" and after["guard"]["before"] == doc["before"]
    prov = after["provenance"]["torchlike"]
    assert prov["url"].endswith("/torchlike-2.11.0-py3-none-any.whl") and prov["url"].startswith("http://127.0.0.1:")
    assert prov["sha256"] == _sha256(disaster_index, "torchlike-2.11.0-py3-none-any.whl")
    assert prov["index"] == disaster_index.url.rstrip("/")
    assert prov["version"] == "2.11.0"
    assert prov["build_id"] == next(p["build_id"] for p in after["packages"] if p["name"] == "torchlike")

    # 3. envvault restore brings the cu128 build back, byte for byte.
    restored = run_envvault("restore", doc["before"], env=env)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"
    assert _dists(venv) == ["torchlike-2.11.0+cu128"]


def _sha256(index: IndexServer, filename: str) -> str:
    return next(w.sha256 for ws in index.projects.values() for w in ws if w.name == filename)


def test_text_output_shows_plan_diff_and_undo(cu128_pip_venv, disaster_index, tmp_path):
    env = guard_env(cu128_pip_venv, tmp_path / "vault", index_url=disaster_index.url)
    proc = _guard(env, "--yes", "--", "pip", "install", "--force-reinstall", "servingpkg")
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "SWAP      torchlike 2.11.0+cu128 -> 2.11.0" in err
    assert "version   torchlike 2.11.0+cu128 -> 2.11.0 (local label): cuda 12.8 -> 13.0" in err
    assert "added     servingpkg 1.0.0" in err
    before = err.split("envvault: snapshot ", 1)[1].split(" ", 1)[0]
    assert f"undo with: envvault restore {before}" in err
    assert "Successfully installed" in proc.stdout  # without --json the command keeps its stdout


def test_failing_install_is_rolled_back(cu128_pip_venv, disaster_index, tmp_path):
    venv = cu128_pip_venv
    env = guard_env(venv, tmp_path / "vault", index_url=disaster_index.url)
    # wreckpkg swaps torchlike, then fails half-way through its own files: pip exits 1.
    proc, doc = _guard(env, "--yes", "--", "pip", "install", "--force-reinstall", "wreckpkg", json_out=True)
    assert proc.returncode == 1 and doc["command_exit"] == 1, proc.stderr
    assert doc["outcome"] == "restored" and doc["restored_to"] == doc["before"]
    wreck = Vault.open(tmp_path / "vault").load_snapshot(doc["after"]).doc
    assert {p["name"]: p["version"] for p in wreck["packages"]}["torchlike"] == "2.11.0"  # the wreck is on record
    assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"
    assert _dists(venv) == ["torchlike-2.11.0+cu128"]
    assert not (venv / "share" / "torchlike" / "build.txt").read_text().count("13.0")
    # The wreck is the newest snapshot, but `latest` is what the environment was rolled back to: a later
    # `restore latest` must not put the +cu130 build back (with the venv active, and without one).
    for e in (env, {k: v for k, v in env.items() if k != "VIRTUAL_ENV"}):
        again = json.loads(run_envvault("restore", "latest", "--dry-run", "--json", env=e).stdout)
        assert again["restored"] == doc["before"] and again["changed"] == 0, again
        assert json.loads(run_envvault("show", "latest", "--json", env=e).stdout)["id"] == doc["before"]


def test_no_restore_keeps_the_wreck(cu128_pip_venv, disaster_index, tmp_path):
    venv = cu128_pip_venv
    env = guard_env(venv, tmp_path / "vault", index_url=disaster_index.url)
    proc = _guard(env, "--yes", "--no-restore", "--", "pip", "install", "--force-reinstall", "wreckpkg")
    assert proc.returncode == 1, proc.stderr
    assert "--no-restore: the environment stays as the command left it" in proc.stderr
    assert "torchlike-2.11.0" in _dists(venv) and _torch_info(venv) == "torchlike 2.11.0+cu130 cuda 13.0"


def test_failure_that_changed_nothing_passes_exit_code(cu128_pip_venv, disaster_index, tmp_path):
    env = guard_env(cu128_pip_venv, tmp_path / "vault", index_url=disaster_index.url)
    proc, doc = _guard(env, "--", "pip", "install", "brokenpkg", json_out=True)
    assert proc.returncode == 1 and doc["outcome"] == "failed" and doc["restored_to"] is None
    assert doc["plan"]["known"] is False and "the dry run exited 1" in doc["plan"]["error"]
    assert doc["diff"]["packages"] == {"added": [], "removed": [], "changed": []}


def test_the_first_snapshot_note_is_only_for_an_environment_never_snapped(cu128_pip_venv, tmp_path):
    note = "an environment's first snapshot stores every file once"
    env = guard_env(cu128_pip_venv, tmp_path / "vault")
    assert note in _guard(env, "--", "true").stderr
    snapped = guard_env(cu128_pip_venv, tmp_path / "snapped")
    run_envvault("snap", "--no-caches", env=snapped)
    assert note not in _guard(snapped, "--", "true").stderr  # guard's first run, not its first snapshot


def test_exit_code_of_any_command_passes_through(cu128_pip_venv, tmp_path):
    env = guard_env(cu128_pip_venv, tmp_path / "vault")
    proc, doc = _guard(env, "--", "sh", "-c", "exit 7", json_out=True)
    assert proc.returncode == 7 and doc["outcome"] == "failed" and doc["plan"]["known"] is False
    assert _guard(env, "--", "no-such-command-anywhere").returncode == 127


def test_an_interrupted_rollback_names_the_command_that_finishes_it(cu128_pip_venv, tmp_path):
    """A SIGTERM (as Ctrl-C) while the rollback writes its first file: exit 143, and a line naming the restore
    that brings back the state before the command (helper 34: `status` then says "unchanged" against the
    command's own snapshot, so the line is the one place that says the rollback did not finish); that command
    does."""
    venv = cu128_pip_venv
    pkg = site_packages(venv) / "torchlike"
    assert pkg.is_dir()
    env = guard_env(venv, tmp_path / "vault", extra={"ENVVAULT_TEST_CRASH_AT": "stage:1:TERM"})
    proc = _guard(env, "--", "sh", "-c", f"rm -rf '{pkg}'; exit 1")
    assert proc.returncode == 143, proc.stderr
    before = proc.stderr.split("envvault: snapshot ", 1)[1].split(" ", 1)[0]
    line = f"`envvault restore {before} --venv {venv}` brings back the state before the command"
    assert "the rollback was interrupted" in proc.stderr and line in proc.stderr, proc.stderr
    assert not pkg.exists()
    env.pop("ENVVAULT_TEST_CRASH_AT")
    run_envvault("restore", before, "--venv", str(venv), env=env)
    assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"


def test_a_rollback_removes_what_a_killed_install_left_that_no_package_owns(cu128_pip_venv, tmp_path):
    """A pip killed mid-install (an ssh session dropped) leaves the package's files without its dist-info:
    a folder that imports broken, which no snapshot tracks (helper 36: ``pandas/``, 217 files). The rollback
    removes what the command made at the top of site-packages: here a half-written package and a ``.pth``
    file, also when no package changed (no rollback then); a file no package owns that was there before the
    command stays, and so does everything with ``--no-restore``."""
    venv = cu128_pip_venv
    site = site_packages(venv)
    (site / "mine.pth").write_text("# the user's own\n")
    env = guard_env(venv, tmp_path / "vault")
    half = f"mkdir -p '{site}/halfpkg/sub' && echo x > '{site}/halfpkg/sub/mod.py' && echo y > '{site}/half.pth'"
    # Only the half-written package: no package changed, so there is nothing to roll back, yet it goes (helper 37)
    for script, outcome in ((f"{half}; exit 137", "failed"), (f"{half} && rm -rf '{site}/torchlike'; exit 137", "restored")):
        proc, doc = _guard(env, "--", "sh", "-c", script, json_out=True)
        assert proc.returncode == 137 and doc["outcome"] == outcome, proc.stderr
        assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"
        assert not (site / "halfpkg").exists() and not (site / "half.pth").exists()
        assert (site / "mine.pth").read_text() == "# the user's own\n"
        line = [w for w in doc["warnings"] if w.startswith("removed what the command left in site-packages")]
        assert len(line) == 1 and "half.pth" in line[0] and "halfpkg" in line[0], doc["warnings"]
    # With --no-restore it stays, as everything else the command left does
    proc, doc = _guard(env, "--no-restore", "--", "sh", "-c", f"{half}; exit 1", json_out=True)
    assert proc.returncode == 1 and (site / "halfpkg" / "sub" / "mod.py").exists()


def test_a_failed_install_into_a_shared_folder_leaves_nothing_half_written_there(cu128_pip_venv, tmp_path):
    """A pip killed installing a new ``nvidia-*`` package writes into ``nvidia/``, a folder other packages share
    (no ``__init__.py``; CUDA 13 wheels all write into ``nvidia/cu13/lib``): not a new top-level name, so what
    it wrote stayed, half written, with or without a rollback. What the failed command made in such a folder
    that no RECORD lists now goes, and the folders it leaves empty; what was there before stays, and so does
    bytecode, at the top (``__pycache__``) too."""
    venv = cu128_pip_venv
    site = site_packages(venv)
    lib = site / "nvidialike" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libold.so").write_bytes(b"the user's")
    (site / "regular").mkdir()
    (site / "regular" / "__init__.py").write_text("")
    time.sleep(1.1)  # older than the command by more than guard's ctime slack (1 s): it cannot be the command's
    # Made just before guard (within that slack), and an empty folder, both the user's; the command's chmod
    # moves every ctime there (helper 39: both were removed, by their ctime alone)
    (lib / "libfresh.so").write_bytes(b"the user's too")
    (lib.parent / "plugins").mkdir()
    env = guard_env(venv, tmp_path / "vault")
    half = (f"chmod -R a+rX '{site}/nvidialike' && "
            f"echo x > '{lib}/libnew.so' && mkdir -p '{lib.parent}/nvvm/bin' && echo n > '{lib.parent}/nvvm/bin/cicc' "
            f"&& mkdir -p '{site}/__pycache__' && echo z > '{site}/__pycache__/m.cpython-311.pyc' "
            f"&& echo w > '{site}/regular/new.py'")
    for script, outcome in ((f"{half}; exit 137", "failed"), (f"{half} && rm -rf '{site}/torchlike'; exit 137", "restored")):
        proc, doc = _guard(env, "--", "sh", "-c", script, json_out=True)
        assert proc.returncode == 137 and doc["outcome"] == outcome, proc.stderr
        assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"
        assert not (lib / "libnew.so").exists() and not (lib.parent / "nvvm").exists()
        assert (lib / "libold.so").read_bytes() == b"the user's"
        assert (lib / "libfresh.so").read_bytes() == b"the user's too" and (lib.parent / "plugins").is_dir()
        assert (site / "__pycache__" / "m.cpython-311.pyc").exists()
        assert (site / "regular" / "new.py").exists()  # a package's own folder, not one put back: not looked into
        line = [w for w in doc["warnings"] if w.startswith("removed 2 file(s) the command left in the folders")]
        assert len(line) == 1 and line[0].endswith(f"({os.path.relpath(site / 'nvidialike', venv)})"), doc["warnings"]
        assert not any("__pycache__" in w for w in doc["warnings"]), doc["warnings"]
        (site / "regular" / "new.py").unlink()


def test_a_shared_folder_too_large_to_list_is_left_as_it_is_and_said(cu128_pip_venv, tmp_path):
    """A folder packages share that holds more than 20,000 entries is not listed before the command (guard
    would pay for it on every command), so what a failed command left there cannot be told from what was there:
    it is left as it is, and a warning says so (helper 40: it was skipped without a word)."""
    venv = cu128_pip_venv
    site = site_packages(venv)
    big = site / "bigshared" / "lib"
    big.mkdir(parents=True)
    for n in range(20_001):
        (big / f"f{n}").touch()
    env = guard_env(venv, tmp_path / "vault")
    proc, doc = _guard(env, "--", "sh", "-c", f"echo x > '{big}/stray.so'; exit 1", json_out=True)
    assert proc.returncode == 1 and doc["outcome"] == "failed", proc.stderr
    assert (big / "stray.so").exists() and (big / "f20000").exists()
    line = [w for w in doc["warnings"] if w.startswith("did not look for what the command left in")]
    assert len(line) == 1 and os.path.relpath(site / "bigshared", venv) in line[0], doc["warnings"]


def test_a_rollback_removes_what_a_killed_upgrade_wrote_beside_the_files_it_puts_back(cu128_pip_venv, tmp_path):
    """A pip killed mid-upgrade has moved the old package aside (``~orchlike``) and written part of the new one
    into a fresh ``torchlike/``: the rollback puts the old files back and removes the stash; the new version's
    files no RECORD lists (a module, subpackages) go too, and the folders they leave empty. A file no package owns
    that was in the folder before the command stays, and so does bytecode."""
    venv = cu128_pip_venv
    site = site_packages(venv)
    pkg = site / "torchlike"
    (pkg / "user_notes.txt").write_text("mine\n")
    time.sleep(1.1)  # older than the command by more than guard's ctime slack (1 s): it cannot be the command's
    env = guard_env(venv, tmp_path / "vault")
    killed_upgrade = (f"echo new > '{pkg}/newmod.py' && mkdir -p '{pkg}/newsub/__pycache__' "
                      f"&& echo z > '{pkg}/newsub/x.py' && echo c > '{pkg}/newsub/__pycache__/x.cpython-311.pyc' "
                      f"&& mkdir -p '{pkg}/gone/deeper' && echo g > '{pkg}/gone/deeper/g.py' "
                      f"&& echo changed >> '{pkg}/__init__.py'; kill -KILL $$")
    proc, doc = _guard(env, "--yes", "--", "sh", "-c", killed_upgrade, json_out=True)
    assert proc.returncode == 137 and doc["outcome"] == "restored", proc.stderr
    assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"
    assert not (pkg / "newmod.py").exists() and not (pkg / "newsub" / "x.py").exists()
    assert (pkg / "newsub" / "__pycache__" / "x.cpython-311.pyc").exists()  # bytecode stays
    assert not (pkg / "gone").exists()  # folders the command made, left empty, go too
    assert (pkg / "user_notes.txt").read_text() == "mine\n"
    line = [w for w in doc["warnings"] if w.startswith("removed 3 file(s) the command left in the folders")]
    assert len(line) == 1, doc["warnings"]
    status = json.loads(run_envvault("status", "--venv", str(venv), "--json", env=env).stdout)
    assert status["empty"], status


def test_unplanned_protected_change_is_rolled_back_without_a_terminal(cu128_pip_venv, disaster_index, tmp_path):
    """A command guard cannot ask for a plan (here a shell script) is judged by its result."""
    venv = cu128_pip_venv
    env = guard_env(venv, tmp_path / "vault", index_url=disaster_index.url)
    proc, doc = _guard(env, "--", "sh", "-c", "pip install -q --force-reinstall servingpkg", json_out=True)
    assert proc.returncode == 3 and doc["outcome"] == "refused" and doc["command_exit"] == 0
    assert doc["restored_to"] == doc["before"] and "there was no plan" in doc["reason"]
    assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8" and _dists(venv) == ["torchlike-2.11.0+cu128"]
    # Unprotected changes of such a command stay.
    proc, doc = _guard(env, "--unprotect", "torchlike", "--", "sh", "-c",
                       "pip install -q --force-reinstall servingpkg", json_out=True)
    assert proc.returncode == 0 and doc["outcome"] == "ran" and _torch_info(venv) == "torchlike 2.11.0+cu130 cuda 13.0"


def test_plain_install_keeps_the_labelled_build_and_needs_no_consent(cu128_pip_venv, disaster_index, tmp_path):
    env = guard_env(cu128_pip_venv, tmp_path / "vault", index_url=disaster_index.url)
    proc, doc = _guard(env, "--", "pip", "install", "servingpkg", json_out=True)
    assert proc.returncode == 0 and doc["outcome"] == "ran" and doc["protected"] == []
    assert [(c["name"], c["kind"]) for c in doc["plan"]["changes"]] == [("servingpkg", "add")]
    assert _torch_info(cu128_pip_venv) == "torchlike 2.11.0+cu128 cuda 12.8"


def test_same_version_other_build_is_a_swap(wheelhouse, tmp_path):
    """Same version string, other bytes: found by reading the served wheel's RECORD (over HTTP)."""
    venv = venv_with_pip(tmp_path / "venv", "torchlike==2.11.0", find_links=[wheelhouse[C.TORCH_PLAIN_A].parent])
    _protect_torchlike(venv)
    env = guard_env(venv, tmp_path / "vault")
    cmd = ["--", "pip", "install", "--force-reinstall", "torchlike==2.11.0"]
    with IndexServer([wheelhouse[C.TORCH_PLAIN_B]]) as other:
        proc, doc = _guard(dict(env, PIP_INDEX_URL=other.url), *cmd, json_out=True)
    assert proc.returncode == 3, proc.stderr
    (change,) = doc["plan"]["changes"]
    assert (change["kind"], change["old"], change["new"], change["same_build"]) == ("swap", "2.11.0", "2.11.0", False)
    with IndexServer([wheelhouse[C.TORCH_PLAIN_A]]) as same:
        proc, doc = _guard(dict(env, PIP_INDEX_URL=same.url), *cmd, json_out=True)
    assert proc.returncode == 0 and doc["outcome"] == "ran", proc.stderr
    (change,) = doc["plan"]["changes"]
    assert (change["kind"], change["same_build"]) == ("reinstall", True)
    assert doc["diff"]["packages"]["changed"] == []


def test_non_mutating_commands_pass_through(cu128_pip_venv, disaster_index, tmp_path):
    vault = tmp_path / "vault"
    env = guard_env(cu128_pip_venv, vault, index_url=disaster_index.url)
    for args in (["pip", "list"], ["pip", "install", "--dry-run", "--force-reinstall", "servingpkg"],
                 ["pip", "download", "--no-deps", "-d", str(tmp_path / "dl"), "servingpkg"]):
        proc, doc = _guard(env, "--", *args, json_out=True)
        assert proc.returncode == 0 and doc["outcome"] == "passthrough", (args, proc.stderr)
    assert not (vault / "snapshots").exists() or not list((vault / "snapshots").iterdir())
    assert _torch_info(cu128_pip_venv) == "torchlike 2.11.0+cu128 cuda 12.8"


def test_python_m_pip_and_uninstall(cu128_pip_venv, disaster_index, tmp_path):
    venv = cu128_pip_venv
    env = guard_env(venv, tmp_path / "vault", index_url=disaster_index.url)
    proc, doc = _guard(env, "--", "python", "-m", "pip", "uninstall", "-y", "torchlike", json_out=True)
    assert proc.returncode == 3 and doc["plan"]["source"] == "pip uninstall arguments"
    assert [(c["name"], c["kind"], c["old"]) for c in doc["plan"]["changes"]] == [("torchlike", "remove", "2.11.0+cu128")]
    proc, doc = _guard(env, "--yes", "--", "python", "-m", "pip", "uninstall", "-y", "torchlike", json_out=True)
    assert proc.returncode == 0 and [p["name"] for p in doc["diff"]["packages"]["removed"]] == ["torchlike"]
    assert _dists(venv) == []


# -- uv ------------------------------------------------------------------------------------------------------


def test_disaster_replayed_with_uv_pip(make_venv, wheelhouse, disaster_index, tmp_path):
    venv = make_venv("uv")
    uv_install(venv, "torchlike==2.11.0+cu128", find_links=[wheelhouse[C.TORCH_CU128].parent])
    _protect_torchlike(venv)
    env = guard_env(venv, tmp_path / "vault", index_url=disaster_index.url, uv_cache=tmp_path / "uvcache")
    cmd = ["--", "uv", "pip", "install", "--reinstall", "servingpkg"]
    proc, doc = _guard(env, *cmd, json_out=True)
    assert proc.returncode == 3 and doc["outcome"] == "refused", proc.stderr
    assert doc["plan"]["source"] == "uv --dry-run"
    swap = next(c for c in doc["plan"]["changes"] if c["name"] == "torchlike")
    assert (swap["kind"], swap["old"], swap["new"]) == ("swap", "2.11.0+cu128", "2.11.0")
    assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"
    proc, doc = _guard(env, "--yes", *cmd, json_out=True)
    assert proc.returncode == 0 and doc["outcome"] == "ran", proc.stderr
    assert [(c["name"], c["kind"]) for c in doc["diff"]["packages"]["changed"]] == [("torchlike", "local")]
    assert _torch_info(venv) == "torchlike 2.11.0+cu130 cuda 13.0"
    # A failing uv install is rolled back too.
    proc, doc = _guard(env, "--yes", "--", "uv", "pip", "install", "wreckpkg", json_out=True)
    assert proc.returncode == 2 and doc["outcome"] == "restored", proc.stderr
    assert "wreckpkg-1.0" not in _dists(venv)
    assert run_envvault("restore", doc["before"], env=env).returncode == 0  # already there: nothing to do
    restored = run_envvault("restore", _first_before(tmp_path / "vault", venv), env=env)
    assert restored.returncode == 0, restored.stderr
    assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"


def _first_before(vault: Path, venv: Path) -> str:
    snaps = [s for s in Vault.open(vault).snapshots() if s.doc["venv"] == str(venv)]
    return snaps[-1].id  # oldest


def test_uv_project_sync_and_add(make_venv, wheelhouse, tmp_path):
    """uv sync is planned with its --dry-run; uv add has none, so guard judges it by the result and, when a
    protected package changed without consent, rolls back the venv and pyproject.toml/uv.lock alike."""
    with IndexServer([wheelhouse[C.TORCH_CU128], wheelhouse[C.TORCH_CU130], wheelhouse[C.SMALL_01]]) as srv:
        proj, env = _synced_project(tmp_path, srv)
        venv = proj / ".venv"
        _protect_torchlike(venv)
        lock_before = (proj / "uv.lock").read_bytes()
        pyproject_before = (proj / "pyproject.toml").read_bytes()
        proc, doc = _run_in(proj, env, "--", "uv", "add", "torchlike==2.11.0+cu130")
        assert proc.returncode == 3 and doc["outcome"] == "refused", proc.stderr
        assert doc["plan"]["known"] is False and doc["venv"] == str(venv)
        assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"
        assert (proj / "pyproject.toml").read_bytes() == pyproject_before
        assert (proj / "uv.lock").read_bytes() == lock_before
        # A hand edit, then uv sync: planned by `uv sync --dry-run`.
        (proj / "pyproject.toml").write_text(pyproject_before.decode().replace("+cu128", "+cu130"))
        proc, doc = _run_in(proj, env, "--", "uv", "sync")
        assert proc.returncode == 3 and doc["plan"]["source"] == "uv --dry-run", proc.stderr
        swap = next(c for c in doc["plan"]["changes"] if c["name"] == "torchlike")
        assert (swap["kind"], swap["old"], swap["new"]) == ("swap", "2.11.0+cu128", "2.11.0+cu130")
        proc, doc = _run_in(proj, env, "--yes", "--", "uv", "sync")
        assert proc.returncode == 0 and doc["outcome"] == "ran", proc.stderr
        assert _torch_info(venv) == "torchlike 2.11.0+cu130 cuda 13.0"



def test_a_wrapped_uv_add_on_a_uv_projects_venv_puts_the_project_files_back(make_venv, wheelhouse, tmp_path):
    """``guard --venv .venv -- sh -c 'uv add X && false'``: guard does not know the command, so it kept no project
    file, and the rollback left pyproject.toml and uv.lock naming X (helper 29, defect 6). A command guard does not
    know, run on a uv project's ``.venv``, now has that project's two files put back with the environment."""
    with IndexServer([wheelhouse[C.TORCH_CU128], wheelhouse[C.SMALL_01]]) as srv:
        proj, env = _synced_project(tmp_path, srv)
        lock_before = (proj / "uv.lock").read_bytes()
        pyproject_before = (proj / "pyproject.toml").read_bytes()
        proc, doc = _run_in(proj, env, "--venv", str(proj / ".venv"), "--yes", "--", "sh", "-c",
                            "uv add smallpkg && exit 3")
        assert proc.returncode == 3 and doc["outcome"] == "restored", proc.stderr
        assert (proj / "pyproject.toml").read_bytes() == pyproject_before
        assert (proj / "uv.lock").read_bytes() == lock_before
        assert not list((proj / ".venv").glob("lib/python3*/site-packages/smallpkg*"))

def _synced_project(tmp_path: Path, srv) -> tuple[Path, dict]:
    """``(project, guard's environment)``: a uv project depending on torchlike, ``uv sync``ed from ``srv``."""
    proj = tmp_path / "proj"
    proj.mkdir()
    _torchlike_project(proj, "proj")
    env = _uv_env(proj, tmp_path, srv)
    sync = subprocess.run(["uv", "sync", "--python", str(plain_python())], cwd=proj, env=env,
                          capture_output=True, text=True)
    assert sync.returncode == 0, sync.stderr
    return proj, env


def _torchlike_project(folder: Path, name: str) -> None:
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "0.1"\nrequires-python = ">=3.8"\n'
        'dependencies = ["torchlike==2.11.0+cu128"]\n')


def _uv_env(project: Path, tmp_path: Path, srv) -> dict:
    """guard's environment for the uv project at ``project`` (its .venv), uv's index ``srv``."""
    env = guard_env(project / ".venv", tmp_path / "vault", uv_cache=tmp_path / "uvcache",
                    extra={"UV_DEFAULT_INDEX": srv.url})
    env.pop("VIRTUAL_ENV")
    return env


def plain_python() -> Path:
    import sys

    return Path(sys.executable).resolve()


def test_uv_add_in_a_workspace_member(make_venv, wheelhouse, tmp_path):
    """In a member of a uv workspace, `uv add` edits the member's pyproject.toml and the root's uv.lock: a
    refused change puts both back (the member's stayed edited, and the next `uv sync` installed the refused
    change, helper-16); a kept one says that the undo hint puts back the environment only."""
    with IndexServer([wheelhouse[C.TORCH_CU128], wheelhouse[C.TORCH_CU130], wheelhouse[C.SMALL_01]]) as srv:
        ws = tmp_path / "ws"
        member = ws / "pkgs" / "mema"
        member.mkdir(parents=True)
        (ws / "pyproject.toml").write_text('[tool.uv.workspace]\nmembers = ["pkgs/*"]\n')
        _torchlike_project(member, "mema")
        env = _uv_env(ws, tmp_path, srv)
        sync = subprocess.run(["uv", "sync", "--all-packages", "--python", str(plain_python())], cwd=ws, env=env,
                              capture_output=True, text=True)
        assert sync.returncode == 0, sync.stderr
        venv = ws / ".venv"
        _protect_torchlike(venv)
        before = {p: p.read_bytes() for p in (ws / "uv.lock", member / "pyproject.toml", ws / "pyproject.toml")}
        proc, doc = _run_in(member, env, "--", "uv", "add", "torchlike==2.11.0+cu130")
        assert proc.returncode == 3 and doc["outcome"] == "refused" and doc["venv"] == str(venv), proc.stderr
        assert {p: p.read_bytes() for p in before} == before
        # from the root, the member named by --package (helper-17)
        proc, doc = _run_in(ws, env, "--", "uv", "add", "--package", "mema", "torchlike==2.11.0+cu130")
        assert proc.returncode == 3 and doc["outcome"] == "refused" and doc["venv"] == str(venv), proc.stderr
        assert {p: p.read_bytes() for p in before} == before
        assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"
        proc, doc = _run_in(member, env, "--yes", "--", "uv", "add", "smallpkg")
        assert proc.returncode == 0 and doc["outcome"] == "ran", proc.stderr
        (note,) = [w for w in doc["warnings"] if "puts back the environment only" in w]
        assert str(member / "pyproject.toml") in note and str(ws / "uv.lock") in note, note


def _run_in(cwd: Path, env, *args):
    proc = run_envvault("guard", "--json", *args, env=env, cwd=cwd)
    return proc, json.loads(proc.stdout)


# -- parts ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, tool, action, mutating", [
    (["pip", "install", "x"], "pip", "install", True),
    (["pip3", "-q", "--python", "/v/bin/python", "uninstall", "-y", "x"], "pip", "uninstall", True),
    (["/v/bin/pip3.11", "install", "-r", "req.txt"], "pip", "install", True),
    (["python", "-m", "pip", "install", "x"], "pip", "install", True),
    (["python3.12", "-m", "pip", "install", "--dry-run", "x"], "pip", "install", False),
    (["pip", "install", "--target", "/tmp/t", "x"], "pip", "install", False),
    (["pip", "install", "--user", "x"], "pip", "install", False),
    (["pip", "list"], "pip", "list", False),
    (["pip", "download", "x"], "pip", "download", False),
    (["uv", "pip", "install", "x"], "uv-pip", "install", True),
    (["uv", "--offline", "pip", "sync", "r.txt"], "uv-pip", "sync", True),
    (["uv", "pip", "install", "--system", "x"], "uv-pip", "install", False),
    (["uv", "pip", "compile", "r.in"], "uv-pip", "compile", False),
    (["uv", "add", "x"], "uv-project", "add", True),
    (["uv", "add", "--frozen", "x"], "uv-project", "add", False),
    (["uv", "remove", "x"], "uv-project", "remove", True),
    (["uv", "sync", "--dry-run"], "uv-project", "sync", False),
    (["uv", "run", "pytest"], "uv-project", "run", False),
    (["python", "train.py"], None, None, False),
    (["sh", "-c", "pip install x"], None, None, False),
])
def test_parse_command(argv, tool, action, mutating):
    cmd = parse_command(argv)
    assert (cmd.tool, cmd.action, cmd.mutating) == (tool, action, mutating)


def test_locate_target(tmp_path, make_venv):
    venv = venv_with_pip(tmp_path / "venv")
    other = make_venv("uv")
    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "VIRTUAL_ENV": str(other)}
    assert locate_target(parse_command(["pip", "install", "x"]), env, tmp_path) == venv
    assert locate_target(parse_command(["python", "-m", "pip", "install", "x"]), env, tmp_path) == venv
    assert locate_target(parse_command(["pip", "--python", str(other), "install", "x"]), env, tmp_path) == other
    assert locate_target(parse_command(["uv", "pip", "install", "x"]), env, tmp_path) == other
    assert locate_target(parse_command(["uv", "pip", "install", "-p", str(venv / "bin/python"), "x"]), env, tmp_path) == venv
    assert locate_target(parse_command(["pip", "install", "x"]), {"PATH": "/usr/bin:/bin"}, tmp_path) in (None,)
    proj = tmp_path / "proj" / "sub"
    proj.mkdir(parents=True)
    (tmp_path / "proj" / "pyproject.toml").write_text("[project]\nname='p'\n")
    assert locate_target(parse_command(["uv", "sync"]), env, proj) == tmp_path / "proj" / ".venv"
    assert locate_target(parse_command(["uv", "sync", "--active"]), env, proj) == other


def test_wheel_record_read_over_http_ranges(tmp_path, make_venv):
    """A big wheel's RECORD comes from a few range requests, not a download of the wheel."""
    import hashlib

    blob = hashlib.shake_256(b"big").digest(4 * 1024 * 1024)
    wheel = build_wheel(tmp_path / "w", "bigpkg", "1.0", {"bigpkg/__init__.py": b"", "bigpkg/blob.bin": blob})
    with RangeServer(wheel) as srv:
        rows = wheel_rows(srv.url)
    assert rows is not None and "bigpkg/blob.bin" in rows and srv.sent < 600 * 1024
    assert wheel_rows((tmp_path / "w" / wheel.name).as_uri()) == rows
    assert wheel_rows("http://127.0.0.1:9/nothing-1.0-py3-none-any.whl") is None
    venv = make_venv("uv")
    uv_install(venv, str(wheel))
    dist_info = next(site_packages(venv).glob("bigpkg-*.dist-info"))
    assert comparable_rows(rows) == comparable_rows(dict(r.rsplit(",", 2)[:2] for r in
                                                         (dist_info / "RECORD").read_text().splitlines()))
    other = build_wheel(tmp_path / "o", "bigpkg", "1.0", {"bigpkg/__init__.py": b"# other build\n",
                                                         "bigpkg/blob.bin": blob})
    with RangeServer(wheel) as srv:
        assert same_build(dist_info, url=srv.url, sha256="x") is True
    with RangeServer(other) as srv:
        assert same_build(dist_info, url=srv.url, sha256="y") is False
    assert same_build(dist_info, url=None, sha256="z") is None


def _inst(version, build="b1"):
    return Installed(name="torch", version=version, build_id=build)


def _new(version, url=None, sha=None):
    return PlannedDist(name="torch", version=version, url=url, sha256=sha)


def test_classify():
    assert classify(None, _new("2.0")).kind == "add"
    assert classify(_inst("2.0"), None).kind == "remove"
    assert classify(_inst("2.0"), _new("2.1")).kind == "upgrade"
    assert classify(_inst("2.1+cu128"), _new("2.0")).kind == "downgrade"
    swap = classify(_inst("2.11.0+cu128"), _new("2.11.0"))
    assert (swap.kind, swap.same_build, swap.touches_build) == ("swap", False, True)
    assert classify(_inst("2.11.0+cu128"), _new("2.11.0+cu130")).kind == "swap"
    unknown = classify(_inst("2.11.0"), _new("2.11.0"))
    assert (unknown.kind, unknown.same_build, unknown.touches_build) == ("reinstall", None, True)
    known = Installed(name="torch", version="2.11.0", build_id="b", dist_info=Path("/nonexistent"),
                      known_sha256=frozenset({"ab" * 32}))
    same = classify(known, _new("2.11.0", url="http://x/torch-2.11.0-py3-none-any.whl", sha="ab" * 32))
    assert (same.kind, same.same_build, same.touches_build) == ("reinstall", True, False)
    assert classify(None, _new("2.0")).touches_build is False


def test_protection_layers(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    prot = load_protection({}, venv)
    assert {p for p, _ in prot.patterns} == set(DEFAULT_PROTECTED)
    assert prot.match("torch") == "torch" and prot.match("nvidia-cudnn-cu12") == "nvidia-*"
    assert prot.match("Flash_Attn") == "flash-attn" and prot.match("numpy") is None and prot.keep == 20
    settings = {"guard": {"protect": ["vllm*"], "unprotect": ["triton"], "keep": 6}}
    (venv / ".envvault.toml").write_text('[guard]\nprotect = ["triton", "my.lib"]\nunprotect = ["jax"]\nkeep = 8\n')
    prot = load_protection(settings, venv, extra=["numpy"], less=["xformers"])
    sources = dict(prot.patterns)
    assert sources["vllm*"] == "vault" and sources["triton"] == "venv" and sources["my-lib"] == "venv"
    assert sources["numpy"] == "command line" and "jax" not in sources and "xformers" not in sources
    assert prot.match("vllm-flash-attn") == "vllm*" and prot.match("My_Lib") == "my-lib" and prot.keep == 8
    (venv / ".envvault.toml").write_text("[guard\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_protection({}, venv)
    (venv / ".envvault.toml").write_text('[guard]\nprotect = "torch"\n')
    with pytest.raises(UsageError, match="must be a list"):
        load_protection({}, venv)


def test_protection_saved_by_cli(tmp_path, make_venv):
    venv = make_venv("uv")
    env = guard_env(venv, tmp_path / "vault")
    proc = run_envvault("guard", "--protect", "vllm", "--unprotect", "triton", "--save", "vault", env=env)
    assert proc.returncode == 0, proc.stderr
    assert Vault.open(tmp_path / "vault").settings()["guard"] == {"protect": ["vllm"], "unprotect": ["triton"]}
    proc = run_envvault("guard", "--protect", "torchlike", "--save", "venv", env=env)
    assert proc.returncode == 0 and 'protect = [\n    "torchlike",\n]' in (venv / ".envvault.toml").read_text()
    proc = run_envvault("guard", "--show-protected", "--json", env=env)
    shown = {p["pattern"]: p["source"] for p in json.loads(proc.stdout)["protected"]}
    assert shown["vllm"] == "vault" and shown["torchlike"] == "venv" and "triton" not in shown
    v = Vault.open(tmp_path / "vault")
    save_vault_protection(v, protect=["triton"])
    assert v.settings()["guard"]["unprotect"] == [] and "triton" in v.settings()["guard"]["protect"]
    save_venv_protection(venv, keep=5)
    assert load_protection({}, venv).keep == 5


def test_provenance_index_attribution(tmp_path):
    cmd = parse_command(["pip", "install", "-i", "https://download.pytorch.org/whl/cu128",
                         "--extra-index-url", "https://user:pw@pypi.example.com/simple/", "torch"])
    indexes = pip_indexes(cmd, {"PIP_CONFIG_FILE": "/dev/null"}, None)
    assert indexes == ["https://download.pytorch.org/whl/cu128", "https://pypi.example.com/simple"]
    url = "https://download.pytorch.org/whl/cu128/torch-2.11.0%2Bcu128-cp311-cp311-linux_x86_64.whl"
    assert index_for(url, indexes) == "https://download.pytorch.org/whl/cu128"
    assert index_for("https://files.pythonhosted.org/packages/x/torch.whl", ["https://pypi.org/simple"]) == "https://pypi.org/simple"
    assert index_for("file:///wheels/torch.whl", indexes) is None
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\n")
    assert pip_indexes(parse_command(["pip", "install", "x"]), {"PIP_CONFIG_FILE": str(conf), "HOME": str(tmp_path),
                                                                 "XDG_CONFIG_DIRS": str(tmp_path / "none")}, None) \
        == ["https://mirror.example/simple"]
    assert pip_indexes(parse_command(["pip", "install", "--no-index", "x"]), {"PIP_CONFIG_FILE": "/dev/null"}, None) == []
    entry = ProvenanceEntry(url=url, sha256="s", index=indexes[0], version="2.11.0+cu128", build_id="b1")
    assert carry({"torch": entry}, {"torch": ("2.11.0+cu128", "b1")}) == {"torch": entry}
    assert carry({"torch": entry}, {"torch": ("2.11.0+cu128", "b2")}) == {}
    assert carry({"torch": records.replace(entry, build_id=None)}, {"torch": ("2.11.0+cu128", "b2")})["torch"].build_id == "b2"
    assert carry({"torch": entry}, {}) == {}


def _ref(sid: str, created: str, trigger: str, venv: str = "/v") -> SnapshotRef:
    return SnapshotRef(sid, Snapshot(created=created, trigger=trigger, venv=venv))


def test_plan_retention():
    snaps = [_ref(f"{i:02d}" * 32, f"2026-01-{i:02d}", "guard") for i in range(1, 9)]
    snaps += [_ref("aa" * 32, "2026-01-01", "manual"), _ref("bb" * 32, "2026-01-01", "restore-backup"),
              _ref("cc" * 32, "2026-01-01", "guard", venv="/other")]
    drop = plan_retention(snaps, "/v", tagged={"02" * 32}, keep=5)
    assert drop == ["03" * 32, "01" * 32]
    assert plan_retention(snaps, "/v", tagged=set(), keep=5, slack=3) == []  # 8 <= 5 + 3: not yet
    assert len(plan_retention(snaps, "/v", tagged=set(), keep=5, slack=2)) == 3


def test_plan_retention_counts_each_interpreter_of_a_system_root_apart():
    """Two interpreters guarded on one root: one's newer guard snapshots made retention drop every guard
    snapshot of the other (helper 26: it counted the root's snapshots together)."""
    from envvault.model.snapshot import PythonInfo

    def ref(sid, day, exe):
        return SnapshotRef(sid, Snapshot(created=f"2026-01-{day:02d}", trigger="guard", venv="/",
                                         python=PythonInfo(environment="system", interpreter=exe)))

    snaps = [ref(f"{i:02d}" * 32, i, "/usr/bin/python3.12") for i in range(1, 4)]
    snaps += [ref(f"{i:02d}" * 32, i, "/usr/bin/python3.10") for i in range(10, 20)]
    assert plan_retention(snaps, "/", tagged=set(), keep=3, interpreter="/usr/bin/python3.12") == []
    assert len(plan_retention(snaps, "/", tagged=set(), keep=3, interpreter="/usr/bin/python3.10")) == 7
    assert len(plan_retention(snaps, "/", tagged=set(), keep=3)) == 10  # the root's alone, as a venv's count


def test_retention_forgets_old_guard_snapshots_and_gc_keeps_the_rest(cu128_pip_venv, disaster_index, tmp_path):
    venv, vault_dir = cu128_pip_venv, tmp_path / "vault"
    env = guard_env(venv, vault_dir, index_url=disaster_index.url)
    manual = run_envvault("snap", "--venv", str(venv), "--no-caches", "--json", env=env)
    manual_id = json.loads(manual.stdout)["id"]
    (venv / ".envvault.toml").write_text('[guard]\nprotect = ["torchlike"]\nkeep = 2\n')
    vault = Vault.open(vault_dir)
    ids = []
    for args in (["install", "--force-reinstall", "servingpkg"], ["uninstall", "-y", "servingpkg"]):
        proc, doc = _guard(env, "--yes", "--", "pip", *args, json_out=True)
        assert proc.returncode == 0, proc.stderr
        ids.append((doc["before"], doc["after"]))
        if len(ids) == 1:
            vault.set_tag("keepme", doc["after"])
    kept = {s.id for s in vault.snapshots()}
    # keep = 2 (slack 1): after 4 guard snapshots, the last run's pair, the tagged one and the manual one
    # survive; the first "before" went.
    assert kept == {manual_id, ids[0][1], *ids[1]}
    assert run_envvault("verify", "--json", env=env).returncode == 0
    result = apply_retention(vault, venv, keep=2)
    assert result.forgotten == ()  # nothing left to forget
    # The cu130 torchlike of the tagged snapshot is still restorable after gc removed what nobody needs.
    assert run_envvault("restore", "keepme", env=env).returncode == 0
    assert _torch_info(venv) == "torchlike 2.11.0+cu130 cuda 13.0"
    assert run_envvault("restore", manual_id, env=env).returncode == 0
    assert _torch_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"



def test_retention_keeps_a_snapshot_tagged_after_it_planned(tmp_path, make_venv, wheelhouse, monkeypatch):
    """Retention plans what to forget from the tags it read, then takes the exclusive lock: a snapshot tagged in
    between (a real ``envvault tag``, which takes the shared lock) was deleted anyway, its tag left naming
    nothing (helper 22, by reading). The tags are read again under the exclusive lock."""
    from envvault.guard import retention
    from envvault.snap import take_snapshot

    from tests.evtools import ev

    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    vault = Vault.open(tmp_path / "vault", create=True)
    ids = [take_snapshot(vault, venv, trigger="guard").id for _ in range(4)]
    planned = retention.plan_retention

    def plan_then_tag(*args, **kwargs):
        drop = planned(*args, **kwargs)
        ev(tmp_path / "vault", "tag", drop[0], "keep")  # between the plan and the forgetting
        return drop

    monkeypatch.setattr(retention, "plan_retention", plan_then_tag)
    result = retention.apply_retention(vault, venv, keep=1, slack=0, gc=False)
    assert len(result.forgotten) == 2 and ids[-1] not in result.forgotten
    tagged = vault.tags()["keep"]
    assert tagged not in result.forgotten and vault.has_snapshot(tagged)
    assert {s.id for s in vault.snapshots()} == set(ids) - set(result.forgotten)


def test_workspace_member_globs_from_a_hostile_pyproject(tmp_path):
    """The workspace root's pyproject.toml is the working folder's: guard reads its member globs without
    crashing (`.`, `**x`: internal errors before, helper-18), never through a symlink or outside the root
    (a link to / walked the whole filesystem, three links to . made 3^14 listings), within a bounded walk."""
    import time

    from envvault.guard.command import uv_workspace_members

    root = tmp_path / "ws"
    for m in ("pkgs/a", "pkgs/b", "deep/x/y/z", "skip/me"):
        (root / m).mkdir(parents=True)
        (root / m / "pyproject.toml").write_text('[project]\nname = "m"\n')
    for name in ("l", "m", "n"):
        (root / name).symlink_to(".")
    (root / "ext").symlink_to("/")
    (root / "pkgs" / "linked").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "pyproject.toml").write_text("")

    def members(*globs: str, exclude: tuple = ()) -> set[str]:
        (root / "pyproject.toml").write_text(
            f"[tool.uv.workspace]\nmembers = {list(globs)!r}\nexclude = {list(exclude)!r}\n".replace("'", '"'))
        t0 = time.monotonic()
        got = uv_workspace_members(root)
        assert time.monotonic() - t0 < 10
        return {p.relative_to(root).as_posix() for p in got}

    assert members("pkgs/*") == {"pkgs/a", "pkgs/b"}
    assert members("pkgs/*", exclude=("pkgs/b",)) == {"pkgs/a"}
    assert members("**") == {"pkgs/a", "pkgs/b", "deep/x/y/z", "skip/me"}
    assert members("deep/**/z", "pkgs/**x") == {"deep/x/y/z"}
    assert members(".", "/etc", "../outside", "pkgs/../skip/me") == set()
    assert members("/".join(["*"] * 14) + "/nomatch", "ext/**/nomatch", "l/m/n/*") == set()
    (root / "pyproject.toml").write_text("x = " + "[" * 5000)  # nested too deep for tomllib: no members
    assert uv_workspace_members(root) == []


def test_a_deeply_nested_toml_is_one_line(make_venv, tmp_path):
    """tomllib raises RecursionError on thousands of nested arrays; every TOML read turns it into the
    command's one line (`diff` of a pylock.toml exited 70, helper-18)."""
    venv = make_venv("uv")
    env = guard_env(venv, tmp_path / "vault")
    assert run_envvault("snap", "--no-caches", env=env).returncode == 0
    lock = tmp_path / "pylock.toml"
    lock.write_text("lock-version = \"1.0\"\nx = " + "[" * 5000 + "\n")
    proc = run_envvault("diff", str(lock), str(lock), env=env)
    assert proc.returncode not in (0, 70) and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "not a readable pylock.toml" in proc.stderr, proc.stderr


def test_project_files_that_cannot_be_read_are_left_alone(tmp_path):
    """A uv.lock that is a FIFO (or a symlink, or unreadable) is neither waited on nor kept: a rollback
    leaves it as it is instead of deleting it as a file the command made (helper-18)."""
    import os

    from envvault.guard.command import parse_command
    from envvault.guard.run import _read_project_files, _write_project_files

    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "proj"\n')
    os.mkfifo(root / "uv.lock")
    kept = _read_project_files(parse_command(["uv", "add", "six"]), root)
    assert list(kept) == [root / "pyproject.toml"], kept
    (root / "pyproject.toml").write_text("edited")
    assert _write_project_files(kept) == []
    assert (root / "pyproject.toml").read_text() == '[project]\nname = "proj"\n'
    assert (root / "uv.lock").is_fifo()


def test_member_globs_stop_at_their_listing_budget(tmp_path):
    """The walk of a member glob lists at most its budget of folders (the bound that keeps a `**` over a huge
    or looping tree from holding guard up before the command runs)."""
    from envvault.guard.command import _glob_dirs

    for i in range(30):
        (tmp_path / f"d{i}" / "sub").mkdir(parents=True)
    budget = [10]
    assert len(_glob_dirs(tmp_path, "**", budget)) <= 10 and budget[0] == 0
    assert len(_glob_dirs(tmp_path, "**", [1000])) == 61  # the root, 30 folders and their 30 sub-folders


def test_a_project_file_that_cannot_be_put_back_is_named(tmp_path):
    """The command replaced pyproject.toml with a folder: the rollback cannot write the file back over it, and
    says which file instead of failing the whole rollback."""
    from envvault.guard.run import _write_project_files

    path = tmp_path / "pyproject.toml"
    path.mkdir()
    assert _write_project_files({path: b'[project]\nname = "p"\n'}) == [str(path)]
    assert path.is_dir()


def test_a_second_guard_of_one_environment_is_refused_while_the_first_runs(tmp_path, make_venv, wheelhouse):
    """Two guards of one venv at once: the first's rollback (its command failed) undid the second's successful
    install and reported it as its own change (helper 23, F2). A guard now holds the environment's guard lock
    from its first snapshot to its rollback; a second one is refused at once (exit 3), nothing run."""
    import sys

    from tests.evtools import ev

    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    vault = tmp_path / "vault"
    with _a_guard_running(vault, venv, tmp_path, exit_code=1) as first:
        marker = tmp_path / "second-ran"
        second = ev(vault, "guard", "--venv", venv, "--yes", "--", sys.executable, "-c",
                    f"import pathlib; pathlib.Path({str(marker)!r}).touch()", check=False)
        assert second.returncode == 3, second.stderr
        assert f"another envvault guard of {venv} is running" in second.stderr and "Traceback" not in second.stderr
        assert not marker.exists()
    assert first.returncode == 1, first.stderr_text  # the command's own exit code; its (empty) change rolled back
    again = ev(vault, "guard", "--venv", venv, "--yes", "--", "true", check=False)
    assert again.returncode == 0, again.stderr  # the lock went with the first guard


def test_a_gc_run_by_the_guarded_command_keeps_the_snapshot_its_rollback_needs(tmp_path, make_venv, wheelhouse):
    """A guarded command that ran ``envvault gc --keep-last 0`` deleted guard's "before" snapshot, and the
    rollback of its failure then found nothing to go back to (exit 4, the environment left broken; helper 22,
    F4). gc now keeps the "before" snapshot of every guard running (its guard lock held), as it keeps tagged
    ones; once that guard has ended, the next gc may drop it."""
    import sys

    from tests.evtools import ev, ev_env, ev_json, gc_keeping_none

    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    site = site_packages(venv)
    victim = sorted(p for p in site.rglob("*.py") if ".dist-info" not in str(p))[0]
    before_bytes = victim.read_bytes()
    vault = tmp_path / "vault"
    ev(vault, "snap", "--venv", venv, "--no-caches")  # an older snapshot of the venv, which gc drops
    script = (f"import os, pathlib, subprocess, sys; "
              f"said = subprocess.run([sys.executable, '-m', 'envvault', 'gc', '--keep-last', '0', '--dry-run'], "
              f"capture_output=True, text=True); pathlib.Path({str(tmp_path / 'gc.txt')!r}).write_text(said.stderr); "
              f"{gc_keeping_none(tmp_path / 'gc.json')}; pathlib.Path({str(victim)!r}).unlink(); sys.exit(1)")
    proc = ev(vault, "guard", "--venv", venv, "--yes", "--json", "--", sys.executable, "-c", script, check=False,
              env=ev_env(vault))
    gc = json.loads((tmp_path / "gc.json").read_text())
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["outcome"] == "restored", proc.stderr
    assert doc["before"] not in gc["removed_snapshots"] and len(gc["removed_snapshots"]) == 1, gc
    assert gc["kept_for_guards"] == [doc["before"]], gc
    said = (tmp_path / "gc.txt").read_text()  # the text form names it too
    assert f"would keep 1 snapshot(s) that a guard running now may roll back to ({doc['before'][:12]})" in said, said
    assert victim.read_bytes() == before_bytes
    assert ev_json(vault, "verify")["ok"] is True
    # The guard has ended: its snapshots are ordinary ones now.
    after = ev_json(vault, "gc", "--keep-last", "0")
    assert doc["before"] in after["removed_snapshots"], after


def test_a_guard_run_by_a_guarded_command_on_its_environment_runs_as_part_of_it(tmp_path, make_venv, wheelhouse):
    """``envvault guard -- make install`` whose Makefile runs ``envvault guard -- pip install ...`` on the same
    venv: the inner guard was refused (exit 3, another guard runs), which failed the outer command. It now runs
    its command as part of the outer guard (whose snapshots and rollback cover it); a guard of the same
    environment with the variable inherited but no guard running is a guard as ever."""
    import sys

    from tests.evtools import ev, ev_env

    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    vault = tmp_path / "vault"
    marker = tmp_path / "inner-ran"
    inner = [sys.executable, "-m", "envvault", "guard", "--venv", str(venv), "--yes", "--", sys.executable, "-c",
             f"import pathlib; pathlib.Path({str(marker)!r}).touch()"]
    outer = ev(vault, "guard", "--venv", venv, "--yes", "--json", "--", sys.executable, "-c",
               f"import subprocess, sys; sys.exit(subprocess.run({inner!r}).returncode)", check=False)
    assert outer.returncode == 0, outer.stderr
    assert json.loads(outer.stdout)["outcome"] != "restored" and marker.exists()
    assert "is guarded by the envvault guard that runs this command" in outer.stderr
    assert "not applied" not in outer.stderr
    # Its own options are not applied (the outer guard judges the whole command); it says so.
    flagged = inner[:6] + ["--protect", "torch*", "--no-restore"] + inner[6:]
    outer = ev(vault, "guard", "--venv", venv, "--yes", "--json", "--", sys.executable, "-c",
               f"import subprocess, sys; sys.exit(subprocess.run({flagged!r}).returncode)", check=False)
    assert outer.returncode == 0, outer.stderr
    assert "(--protect, --no-restore not applied: that guard's settings judge its whole command)" in outer.stderr
    marker.unlink()
    proc = ev(vault, "guard", "--venv", venv, "--yes", "--json", *inner[inner.index("--"):], check=False)
    first = json.loads(proc.stdout)
    from envvault.guard.run import GUARD_ACTIVE, _guard_lock

    marker.unlink()
    again = ev(vault, "guard", "--venv", venv, "--yes", "--json", *inner[inner.index("--"):], check=False,
               env=ev_env(vault, **{GUARD_ACTIVE: f"{_guard_lock(venv)}:{os.getpid()}"}))
    assert again.returncode == 0 and marker.exists(), again.stderr
    assert json.loads(again.stdout)["outcome"] == first["outcome"] != "passthrough" and json.loads(again.stdout)["after"]


def test_an_inherited_guard_variable_does_not_pass_a_guard_through_another_guard(tmp_path, make_venv, wheelhouse):
    """A shell or server started inside a guarded command keeps ``ENVVAULT_GUARD_ACTIVE`` after that guard
    ended; a guard it starts while another guard of the environment runs (not its ancestor) ran its command
    "as part of" that one, whose rollback then undid it (helper 26, F2). It is refused as any second guard is."""
    import sys

    from envvault.guard.run import GUARD_ACTIVE, _guard_lock
    from tests.evtools import ev, ev_env

    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    vault = tmp_path / "vault"
    with _a_guard_running(vault, venv, tmp_path, exit_code=0) as first:
        marker = tmp_path / "second-ran"
        lock = _guard_lock(venv)
        # The lock alone (as this variable was before), the other guard's own pid (not an ancestor), init's
        # (an ancestor of every process, not the guard holding the lock).
        for value in (lock, f"{lock}:{first.pid}", f"{lock}:1"):
            second = ev(vault, "guard", "--venv", venv, "--yes", "--", sys.executable, "-c",
                        f"import pathlib; pathlib.Path({str(marker)!r}).touch()", check=False,
                        env=ev_env(vault, **{GUARD_ACTIVE: value}))
            assert second.returncode == 3 and "another envvault guard" in second.stderr, second.stderr
            assert not marker.exists()


@contextlib.contextmanager
def _a_guard_running(vault: Path, venv: Path, tmp_path: Path, exit_code: int):
    """A real ``envvault guard`` of ``venv`` whose command has started (so its guard lock is held) and waits;
    on leaving the block its command exits ``exit_code`` and the guard ends (``.stderr_text``: what it said)."""
    import sys
    import time as _time

    from tests.evtools import ev_env

    started = tmp_path / "started"
    first = subprocess.Popen(
        [sys.executable, "-m", "envvault", "guard", "--venv", str(venv), "--yes", "--", sys.executable, "-c",
         f"import pathlib, sys; pathlib.Path({str(started)!r}).touch(); sys.stdin.readline(); sys.exit({exit_code})"],
        env=ev_env(vault), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = _time.monotonic() + 120
        while not started.exists():  # its command runs: the before snapshot taken, the guard lock held
            assert first.poll() is None and _time.monotonic() < deadline, first.stderr.read()
            _time.sleep(0.05)
        yield first
        first.stdin.write("\n")
        first.stdin.flush()
        _out, first.stderr_text = first.communicate(timeout=300)
    finally:
        first.kill()
        first.wait()


def test_a_guarded_command_that_swaps_a_linked_venv_and_runs_gc_keeps_the_rollback_target(tmp_path, make_venv,
                                                                                           wheelhouse):
    """gc found a running guard's "before" snapshot through the environment's path, recomputing the guard
    lock's name from it; a command that replaced the symlink guard was given (``rm -rf .venv && python -m venv
    .venv``) changed that name, and gc dropped the snapshot (helper 25, F2). The guard now writes the id into its
    lock file; gc reads it from there."""
    import sys

    from tests.evtools import ev, ev_env, gc_keeping_none

    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    link = tmp_path / "linked-venv"
    link.symlink_to(venv)
    vault = tmp_path / "vault"
    ev(vault, "snap", "--venv", link, "--no-caches")
    script = (f"import os, pathlib, subprocess, sys; os.unlink({str(link)!r}); "
              f"subprocess.run([sys.executable, '-m', 'venv', '--without-pip', {str(link)!r}], check=True); "
              f"{gc_keeping_none(tmp_path / 'gc.json')}; sys.exit(1)")
    proc = ev(vault, "guard", "--venv", link, "--yes", "--json", "--", sys.executable, "-c", script, check=False,
              env=ev_env(vault))
    doc = json.loads(proc.stdout)
    gc = json.loads((tmp_path / "gc.json").read_text())
    assert doc["before"] not in gc["removed_snapshots"] and len(gc["removed_snapshots"]) == 1, gc
    assert proc.returncode == 1 and doc["outcome"] == "restored", proc.stderr


def test_a_gc_while_a_guard_waits_for_its_first_snapshot_keeps_no_earlier_guards_snapshot(tmp_path, make_venv,
                                                                                          wheelhouse):
    """The guard lock file kept the last guard's "before" id until the next guard committed its own: a gc that
    ran while a new guard waited for the vault lock kept that old snapshot and reported it as one a running
    guard would roll back to (helper 26, F3). A guard now writes its own pid there as it takes the lock."""
    from tests.evtools import behind_a_gc, ev

    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    vault = tmp_path / "vault"
    earlier = json.loads(ev(vault, "guard", "--venv", venv, "--yes", "--json", "--", "true").stdout)["before"]
    code, out, err = behind_a_gc(vault, ["guard", "--venv", venv, "--yes", "--json", "--", "true"], keep_last=0)
    assert code == 0, err
    assert earlier not in _vault_ids(vault) and json.loads(out)["outcome"] == "ran"


def _vault_ids(vault: Path) -> list[str]:
    return Vault.open(vault).snapshot_ids()


def test_ending_a_dry_run_ends_what_it_started(tmp_path):
    """A dry run runs in a session of its own (``OWN_SESSION``: a hang-up of the job does not end it), where
    Ctrl-C does not reach what it starts; ending it (Ctrl-C at guard, or its answer read) ends its whole process
    group: a build backend it started (here a ``sleep``) too. Before, only the dry run itself was killed and the
    backend went on (helper 37)."""
    import subprocess as sp

    from envvault.guard.plan import DryRun
    from envvault.terminate import OWN_SESSION
    from tests.evtools import alive

    pidfile = tmp_path / "backend.pid"
    proc = sp.Popen(["sh", "-c", f"sleep 120 & echo $! > {pidfile}; wait"], **OWN_SESSION)
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    backend = int(pidfile.read_text())
    DryRun(cmd=None, proc=proc).kill()
    deadline = time.monotonic() + 30
    while alive(backend) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(backend)


def test_stray_removal_never_follows_a_package_folder_that_is_a_symlink(tmp_path):
    """``_remove_strays`` walks the folders of the packages put back; one that is a symlink (here to a folder
    outside the environment holding a file made just now that no RECORD lists) is passed over, never walked."""
    from envvault.guard.run import _remove_strays

    target, outside = tmp_path / "venv", tmp_path / "outside"
    site = target / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    outside.mkdir()
    (outside / "precious.txt").write_text("not the environment's\n")
    (site / "pkg").symlink_to(outside)
    got = _remove_strays(["lib/python3.11/site-packages/pkg/mod.py"], target, time.time() - 60, [site])
    assert got == [] and (outside / "precious.txt").exists()
