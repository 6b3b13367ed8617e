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
from tests.evtools import assert_one_line_error, ev, ev_env, ev_json

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
    # the same venv named by --venv (helper 20, F3: "is not a directory; pass --venv", which it had)
    again = ev_json(vault, "restore", "latest", "--venv", g, "--into", tmp_path / "g3")
    assert again["restored"] == sid_g and again["verified"] is True, again
    proc = ev(vault, "restore", "latest", "--venv", g, check=False)
    assert proc.returncode == 2 and f"--into {g}" in proc.stderr, proc.stderr


def test_restore_latest_acts_on_the_environment_latest_was_taken_for(tmp_path, make_venv):
    """w was restored to a snapshot of u: w's `latest` is that snapshot, and `restore latest` with w active
    (or with nothing in scope, w snapped last) puts w back, never u, the environment the snapshot was made
    of (helper-14's first finding: u was rewritten in place)."""
    vault = tmp_path / "vault"
    u = _pip_venv(tmp_path / "u")
    w = _pip_venv(tmp_path / "w")
    sid_u = ev_json(vault, "snap", "--venv", u, "--no-caches")["id"]
    ev_json(vault, "snap", "--venv", w, "--no-caches")
    ev_json(vault, "restore", sid_u, "--venv", w)
    subprocess.run([str(w / "bin" / "pip"), "uninstall", "-q", "-y", "six"], check=True)
    subprocess.run([str(u / "bin" / "pip"), "uninstall", "-q", "-y", "six"], check=True)
    for env in (_active(vault, w), _active(vault, None)):
        plan = ev_json(vault, "restore", "latest", "--dry-run", env=env)
        assert plan["restored"] == sid_u and plan["target"] == str(w), plan
        diff = ev_json(vault, "diff", "latest", "current", env=env)
        assert [p["name"] for p in diff["packages"]["removed"]] == ["six"], diff
        status = ev_json(vault, "status", "--against", "latest", env=env)
        assert status["venv"] == str(w) and [p["name"] for p in status["packages"]["removed"]] == ["six"], status
    ev_json(vault, "restore", "latest", env=_active(vault, w))
    assert list(w.glob("lib/python3.*/site-packages/six.py")) and not list(u.glob("lib/python3.*/site-packages/six.py"))
    shutil.rmtree(w)  # nothing in scope: w's latest still, and no restore in place anywhere else
    proc = ev(vault, "restore", "latest", check=False, env=_active(vault, None))
    assert_one_line_error(proc, f"{w}, the environment `latest` is taken for, does not exist",
                          f"restore {sid_u[:12]} --into {w}")
    assert proc.returncode == 2 and not list(u.glob("lib/python3.*/site-packages/six.py"))


def test_latest_of_a_deleted_venv_is_never_the_state_a_guard_rolled_back(tmp_path):
    """With nothing in scope and the venv deleted since (to be rebuilt), `latest` is still what its guard
    rolled back to, never the rolled-back "after" snapshot, the vault's newest."""
    vault = tmp_path / "vault"
    c = _pip_venv(tmp_path / "c")
    ev_json(vault, "snap", "--venv", c, "--no-caches")
    site = next(c.glob("lib/python3.*/site-packages"))
    edit = f"echo '#x' >> {site / 'six.py'}; exit 3"
    guarded = json.loads(ev(vault, "guard", "--venv", c, "--yes", "--json", "--", "sh", "-c", edit, check=False).stdout)
    assert guarded["outcome"] == "restored", guarded
    before = guarded["restored_to"]
    assert ev_json(vault, "list")["snapshots"][0]["id"] == guarded["after"]  # the vault's newest
    shutil.rmtree(c)
    env = _active(vault, None)
    assert ev_json(vault, "show", "latest", env=env)["id"] == before
    rebuilt = ev_json(vault, "restore", "latest", "--into", tmp_path / "c2", env=env)
    assert rebuilt["restored"] == before and rebuilt["verified"] is True, rebuilt
    assert "#x" not in next((tmp_path / "c2").glob("lib/python3.*/site-packages/six.py")).read_text()


def test_an_active_conda_base_leaves_latest_to_the_vault(tmp_path):
    """Miniconda activates its base in every shell (CONDA_PREFIX): envvault does not snap conda
    environments, so it has no `latest` of its own and the commands that take `latest` go on as with none
    in scope; an active venv envvault cannot take is still refused as snap refuses it."""
    vault = tmp_path / "vault"
    a = _pip_venv(tmp_path / "a")
    sid = ev_json(vault, "snap", "--venv", a, "--no-caches")["id"]
    base = tmp_path / "miniconda"
    (base / "conda-meta").mkdir(parents=True)
    (base / "bin").mkdir()
    (base / "bin" / "python").symlink_to(PY311)
    (base / "lib" / "python3.11").mkdir(parents=True)
    (base / "lib" / "python3.11" / "os.py").write_text("")
    env = dict(_active(vault, None), CONDA_PREFIX=str(base))
    assert ev_json(vault, "show", "latest", env=env)["id"] == sid
    assert ev_json(vault, "restore", "latest", "--dry-run", env=env)["target"] == str(a)
    proc = ev(vault, "show", "latest", check=False, env=dict(_active(vault, None), VIRTUAL_ENV=str(base)))
    assert_one_line_error(proc, "conda environments are not supported yet")
    assert proc.returncode == 2
    gone = tmp_path / "removed-env"  # a conda environment removed while active: none in scope either
    assert ev_json(vault, "show", "latest", env=dict(_active(vault, None), CONDA_PREFIX=str(gone)))["id"] == sid
    proc = ev(vault, "show", "latest", check=False, env=_active(vault, gone))  # a deleted venv never snapped
    assert_one_line_error(proc, f"no snapshot of {gone}", f"{gone} does not exist", "envvault list")
    assert proc.returncode == 4 and "snap --venv" not in proc.stderr


def test_hints_of_a_missing_snapshot_run_as_printed(tmp_path):
    """"no snapshot of N" and the cache-only refusal say what to run on the same vault, with --vault and the
    environment: the line copied from the output works."""
    vault = tmp_path / "vlt"
    env = _active(vault, None)
    env.pop("ENVVAULT_HOME")
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")  # the default vault, which is not this one
    n = _pip_venv(tmp_path / "n")
    a = _pip_venv(tmp_path / "a")
    ev(vault, "--vault", vault, "snap", "--venv", a, "--no-caches", env=env)
    for args in (["restore", "latest", "--venv", n, "--dry-run"], ["status", "--venv", n]):
        proc = ev(vault, "--vault", vault, *args, check=False, env=env)
        assert_one_line_error(proc, f"no snapshot of {n}")
        hint = proc.stderr.split("run `", 1)[1].split("`", 1)[0]
        assert hint == f"envvault --vault {vault} snap --venv {n}", hint
    ev(vault, *shlex.split(hint)[1:], "--no-caches", env=env)  # as printed
    assert ev_json(vault, "--vault", vault, "status", "--venv", n, env=env)["empty"] is True
    cache = tmp_path / "cache"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / "entry").write_bytes(b"graph")
    cid = json.loads(ev(vault, "--vault", vault, "cache", "snap", "--cache-dir", cache, "--no-discover", "--json",
                        env=env).stdout)["id"]
    proc = ev(vault, "--vault", vault, "restore", cid[:12], "--venv", a, check=False, env=env)
    assert_one_line_error(proc, f"`envvault --vault {vault} cache restore {cid[:12]}`",
                          f"`envvault --vault {vault} cache diff {cid[:12]} OTHER`")
    compared = proc.stderr.split("or `", 1)[1].split("`", 1)[0].replace("OTHER", "latest")
    assert ev(vault, *shlex.split(compared)[1:], env=env).returncode == 0  # as printed, OTHER given
