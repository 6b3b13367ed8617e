"""Hostile inputs to `envvault guard` that come from the command line it wraps (issue 14).

A `-r` requirements file of `pip uninstall` is read to plan the change: one that is not UTF-8 (a Latin-1
file, as an older editor writes it) ended the guard with exit 70 before the command ran. It is treated
like an unreadable file: no plan, and the command runs (with --yes) as it would without envvault.
"""

from __future__ import annotations

from fixtures.guard_helpers import guard_env, run_envvault, venv_with_pip


def test_latin1_requirements_file_is_not_an_internal_error(tmp_path):
    venv = venv_with_pip(tmp_path / "venv")  # a throwaway venv: the guarded pip runs in it
    req = tmp_path / "req.txt"
    req.write_bytes("# r\xe9sum\xe9 of what to remove\nnot-installed-pkg\n".encode("latin-1"))
    env = guard_env(venv, tmp_path / "vault")
    proc = run_envvault("guard", "--yes", "--", str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-y",
                        "-r", str(req), env=env, cwd=tmp_path, timeout=300)
    # pip runs and fails on the file its own way (its traceback, its exit code); envvault's part is clean.
    assert proc.returncode != 70, proc.stderr
    assert "internal error" not in proc.stderr, proc.stderr
    mine = [ln for ln in proc.stderr.splitlines() if ln.startswith("envvault:")]
    assert mine and not any("UnicodeDecodeError" in ln for ln in mine), proc.stderr
