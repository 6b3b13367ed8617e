"""A local vault with settings ``lock = "objects"`` (docs/format.md, "settings.json"): the vault lock is taken
as lock objects in ``locks/``, by the object-storage rule, so two processes exclude each other without
flock; a stale object of a dead process is cleared; gc through the CLI leaves no lock object behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envvault.errors import UsageError
from envvault.vault.store import Vault
from evtools import ev

_HOLDER = """
import sys, time
from pathlib import Path
from envvault.vault.store import Vault
vault = Vault.open(sys.argv[1])
with vault.lock(exclusive=sys.argv[2] == "x") as held:
    assert held
    Path(sys.argv[3]).write_text("held")
    while not Path(sys.argv[4]).exists():
        time.sleep(0.05)
"""


def _objects(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "locks").glob("vault-*.json"))


@pytest.fixture
def vault_dir(tmp_path: Path) -> Path:
    root = tmp_path / "vault"
    Vault.open(root, create=True).save_settings({"lock": "objects"})
    return root


def _hold(root: Path, tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    held, release = tmp_path / f"held-{mode}", tmp_path / f"release-{mode}"
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(root), mode, str(held), str(release)],
                            env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)))
    deadline = time.monotonic() + 60
    while not held.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the holder did not take the lock"
        time.sleep(0.05)
    return proc, release


def test_two_processes_exclude_each_other(vault_dir: Path, tmp_path: Path):
    vault = Vault.open(vault_dir)
    proc, release = _hold(vault_dir, tmp_path, "x")
    try:
        assert len(_objects(vault_dir)) == 1
        with vault.lock(exclusive=False, wait=False) as held:
            assert held is False  # an exclusive holder in another process
        with vault.lock(exclusive=True, wait=False) as held:
            assert held is False
    finally:
        release.write_text("")
        assert proc.wait(60) == 0
    with vault.lock(exclusive=True, wait=False) as held:
        assert held is True and len(_objects(vault_dir)) == 1
    assert _objects(vault_dir) == [] and not (vault_dir / "locks" / "vault.lock").exists()  # no flock taken

    proc, release = _hold(vault_dir, tmp_path, "s")  # shared holders share
    try:
        with vault.lock(exclusive=False, wait=False) as held:
            assert held is True and len(_objects(vault_dir)) == 2
        with vault.lock(exclusive=True, wait=False) as held:
            assert held is False
    finally:
        release.write_text("")
        assert proc.wait(60) == 0


def test_a_dead_holder_is_stale(vault_dir: Path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    from envvault.vault.lockobjects import _place

    here = _place()
    body = {"lock": "vault", "exclusive": True, **here, "pid": int(dead.stdout), "time": 0}
    (vault_dir / "locks").mkdir(exist_ok=True)
    (vault_dir / "locks" / f"vault-{'a' * 32}.json").write_text(json.dumps(body))
    with Vault.open(vault_dir).lock(exclusive=True, wait=False) as held:
        assert held is True
    assert _objects(vault_dir) == []
    # The same pid in another PID namespace of this host (a container sharing its name), or a writer that
    # recorded no namespace: not known to be gone; it excludes until it ages (helper 28, F1).
    for other in ({"pidns": "pid:[1]"}, {"pidns": None, "boot": None}):
        (vault_dir / "locks" / f"vault-{'b' * 32}.json").write_text(json.dumps(dict(body, **other)))
        with Vault.open(vault_dir).lock(exclusive=True, wait=False) as held:
            assert held is False
    assert _objects(vault_dir) == [f"vault-{'b' * 32}.json"]


def test_gc_through_the_cli_and_a_bad_setting(vault_dir: Path):
    ev(vault_dir, "gc", "--keep-last", "1")
    assert _objects(vault_dir) == [] and (vault_dir / "locks" / "gc-epoch").is_file()
    vault = Vault.open(vault_dir)
    vault.save_settings({"lock": "nfs"})
    with pytest.raises(UsageError, match="lock must be"):
        with vault.lock(exclusive=True):
            pass
    assert ev(vault_dir, "gc", "--keep-last", "1", check=False).returncode == 2
