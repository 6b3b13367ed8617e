"""Lock-only snapshots of real environments (issue 9 items 4, 5, 6).

The environment is what cloud and corporate images look like: certifi from the registry installed by pip
into a ``python -m venv``, with a CA appended to ``certifi/cacert.pem`` and to pip's vendored copy before
anything is snapped. A lock-only snapshot of it restores and exports from the vault's stored (edited) copies
of its builds; a restore that cannot succeed fails at once, and ``--dry-run`` says what the restore would do.
Checkpoint stamps name, and ``restore CKPT`` uses, a full snapshot of the environment when one exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envvault.torch.directories import read_checkpoint
from envvault.torch.hook import link_runtime
from envvault.vault.store import Vault
from fixtures.venvs import find_uv, isolated_env, make_venv, site_packages, uv_install
from fixtures.wheels import build_wheel
from tests.evtools import assert_one_line_error, ev, ev_env, ev_json

CERTIFI = "certifi==2024.8.30"
FAKE_CA = "\n# Corporate CA\n-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


def _run(cmd, *, env=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                          timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}: {' '.join(map(str, cmd))}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _certifi_venv(path: Path) -> Path:
    """``python -m venv`` + ``pip install certifi`` (the machine's pip configuration: its registry mirror),
    then the image's edit: a CA appended to both bundles."""
    _run([sys.executable, "-m", "venv", path])
    _run([path / "bin" / "python", "-m", "pip", "install", "-q", CERTIFI])
    bundles = [site_packages(path) / "certifi" / "cacert.pem", *site_packages(path).glob("pip/_vendor/certifi/cacert.pem")]
    assert len(bundles) == 2
    for bundle in bundles:
        with open(bundle, "a") as f:
            f.write(FAKE_CA)
    return path


def _snap(vault: Path, venv: Path, *args: str) -> str:
    return ev_json(vault, "snap", "--venv", venv, "--no-caches", *args)["id"]


@pytest.fixture(scope="module")
def edited(tmp_path_factory):
    """(venv, vault, full snapshot id, lock-only snapshot id) of the edited-certifi environment."""
    root = tmp_path_factory.mktemp("lockonly")
    venv = _certifi_venv(root / "venv")
    vault = root / "vault"
    full = _snap(vault, venv)
    lock = _snap(vault, venv, "--lock-only")
    return venv, vault, full, lock


def test_lock_only_restores_offline_from_the_edited_stored_copy(edited, tmp_path):
    venv, vault, full, lock = edited
    site = site_packages(venv)
    bundle = (site / "certifi" / "cacert.pem").read_bytes()
    _run([venv / "bin" / "python", "-m", "pip", "uninstall", "-y", "-q", "certifi"])
    assert not (site / "certifi").exists()

    dry = ev(vault, "restore", lock, "--venv", venv, "--dry-run")
    assert f"install certifi 2024.8.30 from the stored copy in snapshot {full[:12]}" in dry.stdout, dry.stdout
    assert "certifi/cacert.pem differs from RECORD" in dry.stderr, dry.stderr
    assert not (site / "certifi").exists()  # a dry run changes nothing

    # Offline: no index, no network; the wheel is rebuilt from the vault.
    env = ev_env(vault, UV_OFFLINE="1", PIP_NO_INDEX="1", UV_INDEX_URL="http://127.0.0.1:9/simple")
    res = ev_json(vault, "restore", lock, "--venv", venv, env=env)
    assert res["verified"] is True and res["mode"] == "lock", res
    assert res["plan"]["offline"] is True and res["written_files"] > 0, res
    assert any("certifi/cacert.pem differs from RECORD" in w for w in res["warnings"]), res["warnings"]
    assert (site / "certifi" / "cacert.pem").read_bytes() == bundle  # the stored (edited) bytes
    _run([venv / "bin" / "python", "-c", "import certifi; assert certifi.where().endswith('cacert.pem')"])
    # RECORD is the build's again: against the full snapshot the environment is exactly as stored.
    st = ev_json(vault, "status", "--venv", venv, "--against", full)
    assert st["empty"] is True, st


def test_export_of_lock_only_syncs_offline_into_a_fresh_venv(edited, tmp_path):
    _venv, vault, _full, lock = edited
    out = tmp_path / "exp" / "pylock.toml"
    res = ev_json(vault, "export", lock, "-o", out)
    assert res["wheels"] == res["packages"] >= 2, res  # certifi, pip (setuptools), from their stored copies
    edited = sorted(w.split(" ", 1)[0] for w in res["warnings"] if "/cacert.pem differs from RECORD" in w)
    assert edited == ["certifi", "pip"] and len(res["warnings"]) == 2, res["warnings"]
    fresh = make_venv(tmp_path / "fresh", "uv")
    _run([find_uv(), "pip", "sync", "--offline", "--preview-features", "pylock", "--python", fresh / "bin" / "python",
          out], env=isolated_env())
    _run([fresh / "bin" / "python", "-c", "import certifi, pip; print(certifi.where())"])
    assert (site_packages(fresh) / "certifi" / "cacert.pem").read_text().endswith(FAKE_CA)

    # --into builds the same from the same sources, edited bytes and the build's RECORD rows included.
    res = ev_json(vault, "restore", lock, "--into", tmp_path / "into")
    assert res["verified"] is True, res
    assert (site_packages(tmp_path / "into") / "certifi" / "cacert.pem").read_text().endswith(FAKE_CA)


def test_lock_only_without_a_source_fails_fast_and_dry_run_says_so(tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    wheel = build_wheel(tmp_path / "w", "orphan", "1.0", {"orphan/__init__.py": b"X = 1\n"})
    uv_install(venv, wheel)  # from a local file: uv records a file:// URL ...
    (next(site_packages(venv).glob("orphan-1.0.dist-info")) / "direct_url.json").unlink()  # ... which is gone
    vault = tmp_path / "vault"
    lock = _snap(vault, venv, "--lock-only")
    _run([find_uv(), "pip", "uninstall", "-q", "--python", venv / "bin" / "python", "orphan"], env=isolated_env())
    before = sorted(p.name for p in site_packages(venv).iterdir())

    dry = ev(vault, "restore", lock, "--venv", venv, "--dry-run", check=False)
    assert dry.returncode == 4
    assert_one_line_error(dry, "no known source", "orphan 1.0")
    into = ev(vault, "restore", lock, "--into", tmp_path / "new", "--dry-run", check=False)
    assert into.returncode == 4 and not (tmp_path / "new").exists()
    assert_one_line_error(into, "no known source", "orphan 1.0")
    started = time.monotonic()
    proc = ev(vault, "restore", lock, "--venv", venv, check=False)
    elapsed = time.monotonic() - started
    assert proc.returncode == 4 and elapsed < 5, (proc.returncode, elapsed)  # bench/ holds the real figure
    assert_one_line_error(proc, "no known source", "orphan 1.0")
    assert sorted(p.name for p in site_packages(venv).iterdir()) == before  # nothing changed
    assert Vault.open(vault).snapshot_ids() == [lock]  # not even a backup was taken


@pytest.mark.parametrize("full_first", [True, False], ids=["with-full-copy", "lock-only-alone"])
def test_status_after_lock_only_compares_what_the_baseline_recorded(tmp_path, full_first):
    """An edit made before any snap is never reported as new. With a full snapshot of the same builds in the
    vault, the lock-only baseline's contents are that snapshot's (so a file deleted since is seen); without
    one, packages compare by version and build only, and status says so."""
    venv = make_venv(tmp_path / "venv", "uv")
    uv_install(venv, build_wheel(tmp_path / "w", "bundle", "1.0", {"bundle/ca.pem": b"CA\n", "bundle/x.py": b""}),
               build_wheel(tmp_path / "w", "other", "2.0", {"other/__init__.py": b""}))
    with open(site_packages(venv) / "bundle" / "ca.pem", "a") as f:
        f.write("edited before any snap\n")
    vault = tmp_path / "vault"
    if full_first:
        _snap(vault, venv)
    lock = _snap(vault, venv, "--lock-only")
    out = ev(vault, "status", "--venv", venv, "--exit-code")
    assert f"unchanged since snapshot {lock[:12]}" in out.stdout, out.stdout
    note = ("file contents compared with full snapshots of the same builds" if full_first
            else "file contents were not recorded; versions and builds unchanged")
    assert note in out.stdout, out.stdout
    doc = ev_json(vault, "status", "--venv", venv)
    assert doc["snapshot"] == lock and doc["empty"] is True and doc["contents_recorded"] is False, doc
    # A file deleted since: seen exactly when a full copy of the build says what the contents were.
    (site_packages(venv) / "bundle" / "x.py").unlink()
    deleted = ev(vault, "status", "--venv", venv, "--exit-code", check=False)
    assert deleted.returncode == (1 if full_first else 0), deleted.stdout
    assert ("bundle/x.py" in deleted.stdout) == full_first and "ca.pem" not in deleted.stdout, deleted.stdout
    # What the baseline does know is always compared.
    _run([find_uv(), "pip", "uninstall", "-q", "--python", venv / "bin" / "python", "other"], env=isolated_env())
    changed = ev(vault, "status", "--venv", venv, "--exit-code", check=False)
    assert changed.returncode == 1 and "removed" in changed.stdout and "other 2.0" in changed.stdout, changed.stdout
    if not full_first:
        assert "only versions and builds were compared" in changed.stdout and "bundle" not in changed.stdout


# --- checkpoint stamps -------------------------------------------------------------------------------------

STAMP_SCRIPT = textwrap.dedent("""
    import sys, torch
    import envvault.torch
    envvault.torch.enable(full_snapshot=False)
    torch.save({"step": 1, "w": torch.ones(2)}, sys.argv[1])
    print("saved", flush=True)
    sys.stdin.readline()
    """)


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory, torch_venv) -> Path:
    """A venv that imports real torch from ``torch_venv`` and envvault from this checkout (a .pth file)."""
    venv = make_venv(tmp_path_factory.mktemp("light") / "venv", "venv", python=sys._base_executable)
    site = site_packages(venv)
    libs = link_runtime(site / "envvault_test.libs")
    (site / "envvault_test.pth").write_text(f"{libs}\n{site_packages(torch_venv)}\n")
    return venv


def _edited_light(light_venv: Path, tmp_path: Path) -> Path:
    """A copy of the light venv holding one distribution whose data file is edited in place."""
    venv = tmp_path / "venv"
    shutil.copytree(light_venv, venv, symlinks=True)
    uv_install(venv, build_wheel(tmp_path / "w", "bundle", "1.0", {"bundle/ca.pem": b"CA\n"}))
    with open(site_packages(venv) / "bundle" / "ca.pem", "a") as f:
        f.write("appended CA\n")
    return venv


def _stamping(venv: Path, vault: Path, path: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "ENVVAULT_STAMP")}
    env["ENVVAULT_HOME"] = str(vault)
    return subprocess.Popen([str(venv / "bin" / "python"), "-c", STAMP_SCRIPT, str(path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _saved(proc: subprocess.Popen) -> None:
    assert proc.stdout.readline().strip() == "saved", proc.stderr.read()


def test_stamp_names_the_full_snapshot_of_an_edited_environment(light_venv, tmp_path):
    venv = _edited_light(light_venv, tmp_path)
    vault = tmp_path / "vault"
    full = _snap(vault, venv)
    proc = _stamping(venv, vault, tmp_path / "step.pt")
    _saved(proc)
    proc.communicate("\n", timeout=120)
    stamp = read_checkpoint(tmp_path / "step.pt").stamp
    assert stamp.snapshot == full and stamp.snapshot_lock_only is False, stamp
    assert Vault.open(vault).snapshot_ids() == [full]  # no lock-only snapshot was needed


def test_restore_checkpoint_uses_the_full_snapshot_of_its_lock_only_stamp(light_venv, tmp_path):
    venv = _edited_light(light_venv, tmp_path)
    vault = tmp_path / "vault"
    step = tmp_path / "step_690.pt"
    proc = _stamping(venv, vault, step)
    _saved(proc)  # the vault was empty: the stamp names the lock-only snapshot taken for it
    proc.communicate("\n", timeout=120)
    stamp = read_checkpoint(step).stamp
    lock = stamp.snapshot
    assert stamp.snapshot_lock_only is True and Vault.open(vault).load_snapshot(lock).doc["lock_only"], stamp
    full = _snap(vault, venv)  # what the background snap of the first stamp does (an edited file: its
    assert full != lock        # fingerprint differs from the stamp's, its lock-level fingerprint does not)

    # The file of the edited distribution is gone: only the full snapshot holds its bytes.
    shutil.rmtree(site_packages(venv) / "bundle")
    res = ev_json(vault, "restore", step, "--no-backup")
    assert res["restored"] == full and res["mode"] != "lock" and res["verified"] is True, res
    assert (site_packages(venv) / "bundle" / "ca.pem").read_text() == "CA\nappended CA\n"
    assert ev_json(vault, "diff", step, full)["empty"] is True


def test_stamps_never_name_the_backup_of_a_damaged_environment(tmp_path):
    """The lock-level fingerprint reads dist-info only: the backup a restore takes of an environment whose
    files were deleted shares it with the good snapshot. A stamp (and `restore CKPT`) must name the good one,
    even though the backup is newer (seen on the GPU host: `restore step.pt` put the deleted files' state back)."""
    from envvault.torch.naming import find_snapshot
    from envvault.torch.stamp_index import lock_fingerprint

    venv = make_venv(tmp_path / "venv", "uv")
    uv_install(venv, build_wheel(tmp_path / "w", "pkg", "1.0", {"pkg/__init__.py": b"X = 1\n", "pkg/core.py": b"Y = 2\n"}))
    vault = tmp_path / "vault"
    good = _snap(vault, venv)
    (site_packages(venv) / "pkg" / "core.py").unlink()
    ev(vault, "restore", good, "--venv", venv)  # takes a backup of the damaged state first, then repairs
    v = Vault.open(vault)
    backups = [r for r in v.snapshots() if r.doc.get("trigger") == "restore-backup"]
    assert len(backups) == 1 and backups[0].doc["created"] > v.load_snapshot(good).doc["created"]
    fp = lock_fingerprint(v.load_snapshot(good).snapshot)
    assert lock_fingerprint(backups[0].snapshot) == fp  # what makes the choice matter
    assert find_snapshot(v, fp, str(venv)) == (good, False)


def test_a_stamp_names_the_state_the_environment_was_restored_to(tmp_path):
    """A patched file snapped, then the clean snapshot restored: the two share a lock-level fingerprint, and a
    checkpoint stamped now names the clean one the environment holds (its status baseline), not the newest
    full snapshot of that fingerprint, whose patch the run never had (helper-16: `restore step.pt` would have
    written the patch back)."""
    from envvault.torch import environment
    from envvault.torch.naming import ensure_snapshot

    venv = make_venv(tmp_path / "venv", "uv")
    uv_install(venv, build_wheel(tmp_path / "w", "pkg", "1.0", {"pkg/__init__.py": b"X = 1\n"}))
    vault = tmp_path / "vault"
    clean = _snap(vault, venv)
    (site_packages(venv) / "pkg" / "__init__.py").write_bytes(b"X = 2  # patched\n")
    patched = _snap(vault, venv)
    ev(vault, "restore", clean, "--venv", venv, "--no-backup")
    v = Vault.open(vault)
    state = environment.environment_state(v, venv, [site_packages(venv)])
    assert ensure_snapshot(v, venv, state, full_snapshot=False) == (clean, False)
    assert patched != clean
    # The patch put back by hand, not snapped: the clean snapshot is no longer the state (helper-17); the
    # patched one of that fingerprint is.
    (site_packages(venv) / "pkg" / "__init__.py").write_bytes(b"X = 2  # patched\n")
    assert ev_json(vault, "status", "--venv", venv)["empty"] is False
    assert ensure_snapshot(v, venv, state, full_snapshot=False) == (patched, False)


def test_a_stamp_walks_no_file_when_the_snapshots_of_its_fingerprint_agree(tmp_path, monkeypatch):
    """Snapshots of one fingerprint with one content (a venv snapped every day) leave nothing to choose:
    the first stamp in a training process then stats no file (the check costs about 0.3 s on the GPU
    host's venv, the first stamp's whole budget)."""
    from envvault.snap import verdict
    from envvault.torch import environment
    from envvault.torch.naming import ensure_snapshot

    venv = make_venv(tmp_path / "venv", "uv")
    uv_install(venv, build_wheel(tmp_path / "w", "pkg", "1.0", {"pkg/__init__.py": b"X = 1\n"}))
    vault = tmp_path / "vault"
    first = _snap(vault, venv)
    second = _snap(vault, venv)
    ev(vault, "restore", first, "--venv", venv, "--no-backup")  # its baseline is now the older one

    def walk(*_a, **_k):
        raise AssertionError("a stat of every file")

    monkeypatch.setattr(verdict, "unchanged_since", walk)
    v = Vault.open(vault)
    state = environment.environment_state(v, venv, [site_packages(venv)])
    assert ensure_snapshot(v, venv, state, full_snapshot=False) == (second, False)


def test_an_unchanged_lock_only_snap_imports_no_reader_or_pack_writer(edited, tmp_path):
    """A lock-only snap of an environment the stat cache knows reads no file: the ingester (``vault/ingest.py``,
    its readers and chunker) is neither made nor imported (snap/scan.py ``_ingester``); the first one, which
    reads every dist-info, and a full snap still make it."""
    venv = edited[0]
    vault = tmp_path / "v"
    probe = ("import atexit, sys\n"
             "atexit.register(lambda: print('ingest imported' if 'envvault.vault.ingest' in sys.modules else 'no ingest'))\n"
             "from envvault.entry import main\n"
             "sys.argv = ['envvault', 'snap', '--json', *sys.argv[1:]]\n"
             "main()\n")

    def snap(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-c", probe, "--venv", str(venv), *args], capture_output=True,
                              text=True, env=ev_env(vault), timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip().splitlines()[-1]

    assert snap("--lock-only") == "ingest imported"  # the first: no stat cache group has a lock yet
    assert snap("--lock-only") == "no ingest"
    assert snap("--no-caches") == "ingest imported"


def test_a_lock_only_snap_calls_no_compile_cache_hook(edited, tmp_path):
    """A lock-only snapshot stores no file, so it archives no compile cache: ``take_snapshot`` never calls
    the hook it is given (the scan has no ingester to give it once nothing was read)."""
    from envvault.snap import take_snapshot

    vault = Vault.open(tmp_path / "v", create=True)
    called = []
    for _ in range(2):  # the first reads every dist-info; the second, none
        result = take_snapshot(vault, Path(edited[0]), lock_only=True,
                               cache_hook=lambda *args: called.append(args) or [])
        assert result.to_json()["packages"] > 0
    assert called == []


def test_a_stamp_never_names_a_snapshot_whose_edits_the_environment_does_not_hold(tmp_path):
    """Snap S0; install ``extra`` and patch a file; restore S0 (its backup B holds the patch and ``extra``);
    install ``extra`` again. B is the only snapshot of that lock-level fingerprint, and a stamp named it: the
    patch the run never had (helper 31). The edited files are checked now: B is not named, a lock-only
    snapshot is taken; with the patch really there, B is."""
    from envvault.torch import environment
    from envvault.torch.naming import ensure_snapshot

    venv = make_venv(tmp_path / "venv", "uv")
    wheels = tmp_path / "w"
    uv_install(venv, build_wheel(wheels, "pkg", "1.0", {"pkg/__init__.py": b"X = 1\n"}))
    extra = build_wheel(wheels, "extra", "1.0", {"extra/__init__.py": b"E = 1\n"})
    vault = tmp_path / "vault"
    s0 = _snap(vault, venv)
    uv_install(venv, extra)
    target = site_packages(venv) / "pkg" / "__init__.py"
    target.write_bytes(b"X = 2  # patched\n")
    backup = ev_json(vault, "restore", s0, "--venv", venv)["backup"]
    uv_install(venv, extra)
    v = Vault.open(vault)
    state = environment.environment_state(v, venv, [site_packages(venv)])
    got = ensure_snapshot(v, venv, state, full_snapshot=False)
    assert got[0] != backup and got[1] is True, (got, backup)
    assert ensure_snapshot(Vault.open(vault), venv, state, full_snapshot=False) == got  # one, not one a process
    target.write_bytes(b"X = 2  # patched\n")  # the patch really there now: the backup holds this state
    v = Vault.open(vault)
    for sid in [s.id for s in v.snapshots() if s.id == got[0]]:
        (vault / "snapshots" / f"{sid}.json").unlink()  # (the lock-only one out of the way)
    assert ensure_snapshot(Vault.open(vault), venv, state, full_snapshot=False) == (backup, False)
