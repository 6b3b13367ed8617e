"""The command's bytecode (envvault/entry.py): where Python keeps none beside the sources
(PYTHONDONTWRITEBYTECODE), the command keeps it under envvault's cache folder, so a second run compiles
nothing; a folder another user could write is not used; ENVVAULT_BYTECODE_CACHE=0 and a library import
change nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_PROBE = ("import sys, envvault.entry as e; e.keep_bytecode(); import json, envvault.cli; "
          "print(sys.pycache_prefix, sys.dont_write_bytecode)")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def src(tmp_path) -> Path:
    """envvault's sources copied without any bytecode: an install that compiled nothing."""
    shutil.copytree(ROOT / "envvault", tmp_path / "src" / "envvault", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "src"


def _env(tmp_path: Path, src: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "ENVVAULT_BYTECODE_CACHE")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(src), **extra)
    return env


def _probe(env: dict, src: Path, code: str = _PROBE) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=src, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def _run_verbose(env: dict, src: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-v", "-m", "envvault", *args], capture_output=True, text=True, env=env,
                          cwd=src, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def test_a_second_run_compiles_nothing(tmp_path, src):
    """``python -v`` logs each bytecode file it writes ("# created" or "# wrote") and each it loads."""
    env = _env(tmp_path, src)
    prefix = tmp_path / "cache" / "envvault" / "pycache"
    first = _run_verbose(env, src, "--help")
    written = [line for line in first.splitlines() if line.startswith(("# created '", "# wrote '"))]
    assert len(written) > 10 and all(str(prefix) in line for line in written)
    assert oct(prefix.stat().st_mode & 0o777) == oct(0o700)
    assert list(prefix.rglob("cli.*.pyc"))
    second = _run_verbose(env, src, "--help")
    assert not [line for line in second.splitlines() if line.startswith(("# created '", "# wrote '"))]
    loaded = [line for line in second.splitlines() if line.startswith(f"# code object from '{prefix}")]
    assert len(loaded) >= len(written)
    assert not list(src.rglob("*.pyc"))  # nothing beside the sources: PYTHONDONTWRITEBYTECODE holds there


def test_compiled_at_install_or_switched_off_changes_nothing(tmp_path, src):
    assert _probe(_env(tmp_path, src, ENVVAULT_BYTECODE_CACHE="0"), src) == ["None", "True"]
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(src)], check=True, capture_output=True)
    assert _probe(_env(tmp_path, src), src) == ["None", "True"]
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("mode", [0o777, 0o755, 0o750])
def test_a_folder_others_can_open_is_not_used(tmp_path, src, mode):
    """Python makes the mirror folders inside it with the umask's mode: in a folder others may enter, those
    could be theirs to write (and bytecode may already be planted: it is not tightened, only refused)."""
    prefix = tmp_path / "cache" / "envvault" / "pycache"
    prefix.mkdir(parents=True)
    (tmp_path / "cache").chmod(0o700)
    (tmp_path / "cache" / "envvault").chmod(0o700)
    prefix.chmod(mode)
    assert _probe(_env(tmp_path, src), src) == ["None", "True"]
    prefix.chmod(0o700)
    assert _probe(_env(tmp_path, src), src) == [str(prefix), "False"]


def test_a_folder_above_that_others_can_write_is_refused(tmp_path, src):
    """Another user who may write a folder above could swap ours mid-run: refused, unless that folder is
    root's and sticky (``/tmp``, where these tests run)."""
    cache = tmp_path / "cache"
    (cache / "envvault" / "pycache").mkdir(parents=True, mode=0o700)
    (cache / "envvault").chmod(0o700)
    cache.chmod(0o777)
    assert _probe(_env(tmp_path, src), src) == ["None", "True"]
    cache.chmod(0o1777)  # sticky, but not root's: still refused unless this test runs as root
    assert _probe(_env(tmp_path, src), src)[0] == (str(cache / "envvault" / "pycache") if os.geteuid() == 0 else "None")
    cache.chmod(0o700)
    assert _probe(_env(tmp_path, src), src)[0] == str(cache / "envvault" / "pycache")


def test_folders_are_made_private_under_any_umask(tmp_path, src):
    env = _env(tmp_path, src)
    proc = subprocess.run([sys.executable, "-c", "import os; os.umask(0); " + _PROBE], capture_output=True,
                          text=True, env=env, cwd=src, timeout=60)
    assert proc.stdout.split() == [str(tmp_path / "cache" / "envvault" / "pycache"), "False"], proc.stderr
    for folder in (tmp_path / "cache", tmp_path / "cache" / "envvault", tmp_path / "cache" / "envvault" / "pycache"):
        assert folder.stat().st_mode & 0o777 == 0o700, folder


def test_a_library_import_changes_nothing(tmp_path, src):
    code = "import sys, envvault, envvault.cli; print(sys.pycache_prefix, sys.dont_write_bytecode)"
    assert _probe(_env(tmp_path, src), src, code) == ["None", "True"]
    assert not (tmp_path / "cache").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the check of another owner needs root to chown")
def test_a_folder_of_another_owner_is_not_used(tmp_path, src):
    prefix = tmp_path / "cache" / "envvault" / "pycache"
    prefix.mkdir(parents=True, mode=0o700)
    os.chown(prefix, 12345, 12345)
    assert _probe(_env(tmp_path, src), src) == ["None", "True"]
