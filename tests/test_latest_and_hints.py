"""What ``latest`` names, and the commands messages tell the user to run (helper-12's workflow findings,
issue 11 session 28): on environments built the way users build them (``python -m venv`` + pip from the
local index, ``uv venv``), the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from fixtures import build_wheel, uv_install
from tests.evtools import ev, ev_env, ev_json

PY311 = "/root/.pyenv/versions/3.11.7/bin/python3.11"
PY312 = "/root/.pyenv/versions/3.12.1/bin/python3.12"


def _pip_venv(path: Path) -> Path:
    subprocess.run([PY311, "-m", "venv", str(path)], check=True)
    subprocess.run([str(path / "bin" / "pip"), "install", "-q", "six"], check=True, capture_output=True)
    return path


def _active(vault: Path, venv: Path | None) -> dict:
    env = ev_env(vault)
    env.pop("CONDA_PREFIX", None)
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
    return env


def test_latest_is_the_environment_in_scope_and_never_another_ones(tmp_path, make_venv):
    """Two environments in one vault, b snapped last: with --venv a or a active, `latest` is a's newest
    snapshot for restore, diff, export and show; an environment with none is one clear line (exit 4),
    never b's snapshot (which would have restored b in place, or refused with b's Python); with none in
    scope, the vault's newest."""
    vault = tmp_path / "vault"
    a = _pip_venv(tmp_path / "a")
    b = make_venv("uv", PY312, name="b")
    sid_a = ev_json(vault, "snap", "--venv", a, "--no-caches", env=_active(vault, None))["id"]
    sid_b = ev_json(vault, "snap", "--venv", b, "--no-caches", env=_active(vault, None))["id"]
    subprocess.run([str(a / "bin" / "pip"), "uninstall", "-q", "-y", "six"], check=True)
    for args, env in ((["--venv", a], _active(vault, None)), ([], _active(vault, a))):
        plan = ev_json(vault, "restore", "latest", *args, "--dry-run", env=env)
        assert plan["restored"] == sid_a and plan["target"] == str(a) and plan["changed"] == 1, plan
        changed = ev_json(vault, "diff", "latest", "current", *args, env=env)
        assert changed["old"] == sid_a[:12] and [p["name"] for p in changed["packages"]["removed"]] == ["six"]
    env = _active(vault, a)
    assert ev_json(vault, "show", "latest", env=env)["id"] == sid_a
    out = tmp_path / "pylock.toml"
    ev_json(vault, "export", "latest", "-o", out, "--no-wheels", env=env)
    assert 'name = "six"' in out.read_text()
    assert ev_json(vault, "show", "latest", env=_active(vault, None))["id"] == sid_b
    c = _pip_venv(tmp_path / "c")
    for args, env in ((["--venv", c], _active(vault, None)), ([], _active(vault, c))):
        proc = ev(vault, "restore", "latest", *args, "--dry-run", check=False, env=env)
        assert proc.returncode == 4 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"no snapshot of {c}" in proc.stderr and "Traceback" not in proc.stderr


def test_a_cache_snap_of_an_environment_is_not_its_baseline(tmp_path):
    vault = tmp_path / "vault"
    a = _pip_venv(tmp_path / "a")
    sid = ev_json(vault, "snap", "--venv", a, "--no-caches")["id"]
    cache = tmp_path / "cache"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / "entry").write_bytes(b"graph")
    ev_json(vault, "cache", "snap", "--venv", a, "--cache-dir", cache, "--no-discover")
    status = ev_json(vault, "status", "--venv", a)
    assert status["snapshot"] == sid and status["empty"] is True, status
    assert ev_json(vault, "restore", "latest", "--venv", a, "--dry-run")["restored"] == sid


def test_a_lock_only_snapshot_after_a_restore_is_compared_with_what_the_restore_put_back(tmp_path):
    """The backup a restore takes records the damaged state with the same builds; a lock-only snapshot
    taken after the restore takes its contents from the good snapshot, not from that backup: the clean
    environment is unchanged and `restore latest` verifies (exit 0)."""
    vault = tmp_path / "vault"
    a = _pip_venv(tmp_path / "a")
    site = next(a.glob("lib/python3.*/site-packages"))
    ev_json(vault, "snap", "--venv", a, "--no-caches", "-m", "good")
    with open(site / "six.py", "a") as f:
        f.write("# edited\n")
    (site / "pip" / "__main__.py").unlink()
    (a / "bin" / "pip3").unlink()
    assert ev_json(vault, "restore", "latest", "--venv", a)["verified"] is True
    lock = ev_json(vault, "snap", "--venv", a, "--lock-only")["id"]
    status = ev_json(vault, "status", "--venv", a)
    assert status["snapshot"] == lock and status["empty"] is True, status
    again = ev(vault, "restore", "latest", "--venv", a, "--json", check=False)
    assert again.returncode == 0, again.stdout + again.stderr


def test_undo_hints_name_the_vault_they_were_printed_for(tmp_path):
    """`restore` prints how to undo it: with --vault when a plain `envvault` would open another vault, so
    that the line copied from the output runs on the same vault."""
    a = _pip_venv(tmp_path / "a")
    vault = tmp_path / "vlt"
    env = _active(vault, None)
    env.pop("ENVVAULT_HOME")
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")  # the default vault, which is not this one

    def envvault(*args, extra: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "envvault", *map(str, args)], capture_output=True, text=True,
                              env={**env, **(extra or {})}, check=check)

    envvault("--vault", vault, "snap", "--venv", a, "--no-caches")
    subprocess.run([str(a / "bin" / "pip"), "uninstall", "-q", "-y", "six"], check=True)
    out = envvault("--vault", vault, "restore", "latest", "--venv", a).stdout
    hint = out.split("undo with: ", 1)[1].split(")", 1)[0]
    assert hint.startswith(f"envvault --vault {vault} restore "), out
    words = shlex.split(hint)
    assert words[0] == "envvault"
    undone = envvault(*words[1:], "--json", check=False)  # the hint, run as printed
    assert undone.returncode == 0, undone.stderr
    subprocess.run([str(a / "bin" / "pip"), "install", "-q", "six"], check=True, capture_output=True)
    out = envvault("restore", "latest", "--venv", a, extra={"ENVVAULT_HOME": str(vault)}).stdout
    assert "undo with: envvault restore " in out, out  # the vault a plain `envvault` opens: no --vault


def test_an_upgrade_lists_no_mode_changes_for_files_of_one_version_only(tmp_path, make_venv):
    """tomli 2.5.0 -> 2.0.1 listed 2.5.0's compiled modules as having "gained or lost the execute bit":
    files of one version are part of the version change; a chmod of a file both states hold still is one."""
    venv = make_venv("uv")
    w1 = build_wheel(tmp_path / "w1", "tool", "1.0", {"tool/__init__.py": b""}, scripts={"old-tool": b"#!/bin/sh\n"})
    w2 = build_wheel(tmp_path / "w2", "tool", "2.0", {"tool/__init__.py": b""}, scripts={"new-tool": b"#!/bin/sh\n"})
    uv_install(venv, w1)
    vault = tmp_path / "vault"
    ev_json(vault, "snap", "--venv", venv, "--no-caches")
    uv_install(venv, w2)
    (change,) = ev_json(vault, "status", "--venv", venv)["packages"]["changed"]
    assert change["kind"] == "upgrade" and change["mode_files"] == [], change
    ev_json(vault, "snap", "--venv", venv, "--no-caches")
    os.chmod(venv / "bin" / "new-tool", 0o644)
    (change,) = ev_json(vault, "status", "--venv", venv)["packages"]["changed"]
    assert change["kind"] == "mode" and change["mode_files"] == ["bin/new-tool"], change


def test_a_lock_only_snapshot_after_a_guard_rollback_is_unchanged(tmp_path):
    """guard's rolled-back "after" snapshot records a state the rollback undid, as a restore's backup does:
    a lock-only snapshot taken after it takes its contents from elsewhere."""
    vault = tmp_path / "vault"
    a = _pip_venv(tmp_path / "a")
    site = next(a.glob("lib/python3.*/site-packages"))
    ev_json(vault, "snap", "--venv", a, "--no-caches")
    edit = f"echo '#x' >> {site / 'pip' / '__main__.py'}; exit 3"
    guarded = json.loads(ev(vault, "guard", "--venv", a, "--yes", "--json", "--", "sh", "-c", edit, check=False).stdout)
    assert guarded["outcome"] == "restored" and "#x" not in (site / "pip" / "__main__.py").read_text()
    ev_json(vault, "snap", "--venv", a, "--lock-only")
    status = ev_json(vault, "status", "--venv", a)
    assert status["empty"] is True, status
    assert ev(vault, "restore", "latest", "--venv", a, check=False).returncode == 0


def test_latest_of_an_active_venv_deleted_since_is_its_own(tmp_path, make_venv):
    """VIRTUAL_ENV names a venv that was deleted: `restore latest --into NEW` rebuilds that one, never the
    vault's newest snapshot of another environment."""
    vault = tmp_path / "vault"
    g = _pip_venv(tmp_path / "g")
    sid_g = ev_json(vault, "snap", "--venv", g, "--no-caches")["id"]
    other = make_venv("uv", PY312, name="other")
    ev_json(vault, "snap", "--venv", other, "--no-caches")
    shutil.rmtree(g)
    rebuilt = ev_json(vault, "restore", "latest", "--into", tmp_path / "g2", env=_active(vault, g))
    assert rebuilt["restored"] == sid_g and rebuilt["verified"] is True, rebuilt
