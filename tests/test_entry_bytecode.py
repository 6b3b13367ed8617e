"""The command's bytecode (envvault/entry.py): where Python keeps none beside the sources
(PYTHONDONTWRITEBYTECODE), the command keeps it under envvault's cache folder, so a second run compiles
nothing; a folder another user could write is not used; ENVVAULT_BYTECODE_CACHE=0 and a library import
change nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_PROBE = ("import sys, envvault.entry as e; e.keep_bytecode(); import json, envvault.cli; "
          "print(sys.pycache_prefix, sys.dont_write_bytecode)")


def _env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "ENVVAULT_BYTECODE_CACHE")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def _run_verbose(env: dict, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-v", "-m", "envvault", *args], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def test_a_second_run_compiles_nothing(tmp_path):
    """``python -v`` logs each bytecode file it writes ("# created" or "# wrote") and each it loads."""
    env = _env(tmp_path)
    prefix = tmp_path / "cache" / "envvault" / "pycache"
    first = _run_verbose(env, "--help")
    written = [line for line in first.splitlines() if line.startswith(("# created '", "# wrote '"))]
    assert len(written) > 10 and all(str(prefix) in line for line in written)
    assert oct(prefix.stat().st_mode & 0o777) == oct(0o700)
    assert list(prefix.rglob("cli.*.pyc"))
    second = _run_verbose(env, "--help")
    assert not [line for line in second.splitlines() if line.startswith(("# created '", "# wrote '"))]
    loaded = [line for line in second.splitlines() if line.startswith(f"# code object from '{prefix}")]
    assert len(loaded) >= len(written)


def test_off_switch_and_a_folder_others_can_write(tmp_path):
    off = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         env=_env(tmp_path, ENVVAULT_BYTECODE_CACHE="0"), timeout=60)
    assert off.stdout.split() == ["None", "True"]
    prefix = tmp_path / "cache" / "envvault" / "pycache"
    prefix.mkdir(parents=True)
    prefix.chmod(0o777)
    shared = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=_env(tmp_path),
                            timeout=60)
    assert shared.stdout.split() == ["None", "True"]  # not used: another user could plant bytecode there
    prefix.chmod(0o700)
    own = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=_env(tmp_path),
                         timeout=60)
    assert own.stdout.split() == [str(prefix), "False"]


def test_a_library_import_changes_nothing(tmp_path):
    code = "import sys, envvault, envvault.cli; print(sys.pycache_prefix, sys.dont_write_bytecode)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(tmp_path), timeout=60)
    assert proc.stdout.split() == ["None", "True"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the check of another owner needs root to chown")
def test_a_folder_of_another_owner_is_not_used(tmp_path):
    prefix = tmp_path / "cache" / "envvault" / "pycache"
    prefix.mkdir(parents=True, mode=0o700)
    os.chown(prefix, 12345, 12345)
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=_env(tmp_path),
                          timeout=60)
    assert proc.stdout.split() == ["None", "True"]
